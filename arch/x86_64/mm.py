"""x86-64 kernel address translation, as ``arch/x86/include/asm/pgtable*.h`` define it.

The walk is ``lookup_address_in_pgd()`` then ``slow_virt_to_phys()``
(``arch/x86/mm/pat/set_memory.c``): 4 levels (PGD, PUD, PMD, PTE; the P4D
folded) or 5 with LA57 (``NUMBER(pgtable_l5_enabled)=1``), 1 GiB pages at the
PUD and 2 MiB at the PMD (``_PAGE_PSE``). The shortcuts are
``__phys_addr_symbol()`` for the kernel image (``__START_KERNEL_map`` +
``phys_base``) and ``__phys_addr_nodebug()`` for the direct map
(``page_offset_base``), taken only where the kernel's own values bound them.
The image shortcut covers the segments that stay mapped
(:data:`KERNEL_SEGMENTS`); the gaps ``mark_rodata_ro()`` frees and the
``__init`` memory ``free_initmem()`` frees are walked (with PTI they are
unmapped).
"""

from __future__ import annotations

from typing import Callable

from unwind.core.errors import DumpError
from unwind.core.memory import MemoryFault, NotMapped
from unwind.formats.vmcore.virtual import LinearMap, PhysReader, read_entry
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

# --- page_64_types.h, pgtable_64_types.h ---
PAGE_SHIFT = 12
PMD_SHIFT = 21
PUD_SHIFT = 30
P4D_SHIFT = 39
#: PGDIR_SHIFT is ``pgdir_shift``: 48 with LA57, else 39
PGDIR_SHIFT_L5 = 48
PGDIR_SHIFT_L4 = 39
PTRS_PER_PTE = PTRS_PER_PMD = PTRS_PER_PUD = PTRS_PER_P4D = PTRS_PER_PGD = 512
__START_KERNEL_map = 0xFFFFFFFF80000000
__PHYSICAL_MASK_SHIFT = 52
#: ``__PHYSICAL_MASK`` without memory encryption
PHYSICAL_MASK = (1 << __PHYSICAL_MASK_SHIFT) - 1
#: ``__VIRTUAL_MASK_SHIFT``: 56 with LA57, else 47
VIRTUAL_MASK_SHIFT_L5 = 56
VIRTUAL_MASK_SHIFT_L4 = 47

PAGE_SIZE = 1 << PAGE_SHIFT
PAGE_MASK = ~(PAGE_SIZE - 1)
PMD_MASK = ~((1 << PMD_SHIFT) - 1)
PUD_MASK = ~((1 << PUD_SHIFT) - 1)

# --- pgtable_types.h: the entry bits a walk tests ---
_PAGE_BIT_PRESENT = 0
_PAGE_BIT_PSE = 7
_PAGE_PRESENT = 1 << _PAGE_BIT_PRESENT
_PAGE_PSE = 1 << _PAGE_BIT_PSE

_U64 = (1 << 64) - 1


class X86_64Translator:
    """Kernel virtual to physical on one x86-64 dump."""

    page_shift = PAGE_SHIFT

    def __init__(self, phys: PhysReader, pgd: int, *, l5: bool = False, sme_mask: int = 0,
                 linear: tuple[LinearMap, ...] = ()) -> None:
        self.phys = phys
        #: physical address of ``init_top_pgt`` (``swapper_pg_dir``)
        self.pgd = pgd
        self.l5 = l5
        self.pgdir_shift = PGDIR_SHIFT_L5 if l5 else PGDIR_SHIFT_L4
        self.virtual_mask_shift = VIRTUAL_MASK_SHIFT_L5 if l5 else VIRTUAL_MASK_SHIFT_L4
        # __PHYSICAL_MASK: sme_me_mask is the encryption bit, never part of a frame (__sme_clr())
        self.physical_mask = PHYSICAL_MASK & ~sme_mask
        self.linear = linear

    # --- the entry predicates and frames (pgtable.h, pgtable_types.h) ---

    # pgd_none(), p4d_none(), pud_none(), pmd_none(): the entry is zero
    @staticmethod
    def none(entry: int) -> bool:
        """``pXd_none()``."""
        return entry == 0

    # pXd_present(): _PAGE_PRESENT, the bit the MMU tests
    @staticmethod
    def present(entry: int) -> bool:
        """``pXd_present()``."""
        return bool(entry & _PAGE_PRESENT)

    # pud_leaf(), pmd_leaf() (pud_large()/pmd_large() before 6.9): _PAGE_PSE above the PTE level
    @staticmethod
    def leaf(entry: int) -> bool:
        """``pud_leaf()``, ``pmd_leaf()``."""
        return bool(entry & _PAGE_PSE)

    # pgd_page_vaddr(), p4d_pgtable(), pud_pgtable(), pmd_page_vaddr(): the next table (PTE_PFN_MASK)
    def table(self, entry: int) -> int:
        """Physical address of the table an upper entry points to."""
        return entry & self.physical_mask & PAGE_MASK

    # pud_pfn(), pmd_pfn(), pte_pfn() << PAGE_SHIFT: bit 12 is _PAGE_PAT_LARGE in a huge entry
    def frame(self, entry: int, shift: int) -> int:
        """Physical address of the page a leaf maps, ``1 << shift`` bytes."""
        return entry & self.physical_mask & ~((1 << shift) - 1)

    # --- the indexes and offsets (pgtable_64.h, pgtable.h) ---

    # pgd_index()
    def pgd_index(self, address: int) -> int:
        """``(address >> PGDIR_SHIFT) & (PTRS_PER_PGD - 1)``."""
        return (address >> self.pgdir_shift) & (PTRS_PER_PGD - 1)

    # pgd_offset_k()
    def pgd_offset_k(self, address: int) -> int:
        """Physical address of the kernel PGD entry of ``address``."""
        return self.pgd + 8 * self.pgd_index(address)

    # p4d_offset(): the PGD entry itself when the P4D level is folded (4-level paging)
    def p4d_offset(self, pgd: int, pgd_entry: int, address: int) -> int:
        """Physical address of the P4D entry of ``address``."""
        if not self.l5:
            return pgd
        return self.table(pgd_entry) + 8 * ((address >> P4D_SHIFT) & (PTRS_PER_P4D - 1))

    # pud_offset()
    def pud_offset(self, p4d_entry: int, address: int) -> int:
        """Physical address of the PUD entry of ``address``."""
        return self.table(p4d_entry) + 8 * ((address >> PUD_SHIFT) & (PTRS_PER_PUD - 1))

    # pmd_offset()
    def pmd_offset(self, pud_entry: int, address: int) -> int:
        """Physical address of the PMD entry of ``address``."""
        return self.table(pud_entry) + 8 * ((address >> PMD_SHIFT) & (PTRS_PER_PMD - 1))

    # pte_offset_kernel()
    def pte_offset_kernel(self, pmd_entry: int, address: int) -> int:
        """Physical address of the PTE of ``address``."""
        return self.table(pmd_entry) + 8 * ((address >> PAGE_SHIFT) & (PTRS_PER_PTE - 1))

    # --- the walk ---

    def _entry(self, paddr: int, address: int, what: str) -> int:
        return read_entry(self.phys, paddr, address, what)

    # lookup_address_in_pgd(): the entry mapping ``address`` and the shift of the page it maps
    def lookup_address_in_pgd(self, address: int) -> tuple[int, int]:
        """The leaf entry of ``address`` and its page shift; :class:`NotMapped` at a hole."""
        pgd_p = self.pgd_offset_k(address)
        pgd = self._entry(pgd_p, address, "PGD")
        if self.none(pgd) or not self.present(pgd):
            raise NotMapped(address, 1, "PGD entry not present")
        p4d_p = self.p4d_offset(pgd_p, pgd, address)
        p4d = pgd if p4d_p == pgd_p else self._entry(p4d_p, address, "P4D")
        if self.none(p4d) or not self.present(p4d):
            raise NotMapped(address, 1, "P4D entry not present")
        pud = self._entry(self.pud_offset(p4d, address), address, "PUD")
        if self.none(pud) or not self.present(pud):
            raise NotMapped(address, 1, "PUD entry not present")
        if self.leaf(pud):
            return pud, PUD_SHIFT
        pmd = self._entry(self.pmd_offset(pud, address), address, "PMD")
        if self.none(pmd) or not self.present(pmd):
            raise NotMapped(address, 1, "PMD entry not present")
        if self.leaf(pmd):
            return pmd, PMD_SHIFT
        pte = self._entry(self.pte_offset_kernel(pmd, address), address, "PTE")
        if not self.present(pte):
            raise NotMapped(address, 1, "PTE not present")
        return pte, PAGE_SHIFT

    # slow_virt_to_phys()
    def slow_virt_to_phys(self, address: int) -> int:
        """The page-table walk: the leaf's frame plus the offset inside its page."""
        entry, shift = self.lookup_address_in_pgd(address)
        return self.frame(entry, shift) | (address & ((1 << shift) - 1))

    # __is_canonical_address(): bits above __VIRTUAL_MASK_SHIFT copy bit __VIRTUAL_MASK_SHIFT
    def is_canonical(self, address: int) -> bool:
        """Is ``address`` a sign-extended ``__VIRTUAL_MASK_SHIFT + 1``-bit address?"""
        top = address >> self.virtual_mask_shift
        return top == 0 or top == _U64 >> self.virtual_mask_shift

    def translate(self, vaddr: int) -> int:
        """``__pa()`` where a linear shortcut covers ``vaddr``, else ``slow_virt_to_phys()``."""
        if not self.is_canonical(vaddr):
            raise NotMapped(vaddr, 1, "not a canonical address")
        for lm in self.linear:
            if lm.start <= vaddr < lm.end:
                return lm.pa(vaddr)
        return self.slow_virt_to_phys(vaddr)


#: the image segments the high mapping keeps (level2_kernel_pgt, cleanup_highmap(), arch/x86/mm/init_64.c):
#: mark_rodata_ro() frees [_etext, __start_rodata) and [__end_rodata, _sdata), free_initmem() frees
#: [__init_begin, __init_end), each through free_kernel_image_pages(), which unmaps them with PTI
#: (set_memory_np_noalias()). Those are walked.
KERNEL_SEGMENTS = (("_text", "_etext"), ("__start_rodata", "__end_rodata"), ("_sdata", "__init_begin"),
                   ("__init_end", "_end"))


# __phys_addr_symbol(): the kernel image mapping
def kernel_image_map(start: int, end: int, phys_base: int) -> LinearMap:
    """``pa = va - __START_KERNEL_map + phys_base`` over one segment ``[start, end)`` of the image."""
    return LinearMap(start, end, __START_KERNEL_map - phys_base)


# the segments of the high mapping that stay mapped at phys_base
def kernel_image_segments(symbol: Callable[[str], int | None], phys_base: int) -> list[LinearMap]:
    """:func:`kernel_image_map` over each of :data:`KERNEL_SEGMENTS` whose bounds the image's symbols give."""
    out = []
    for first, last in KERNEL_SEGMENTS:
        start, end = symbol(first), symbol(last)
        if start is not None and end is not None and __START_KERNEL_map <= start < end <= _U64:
            out.append(kernel_image_map(start, end, phys_base))
    return out


# __phys_addr_nodebug(): the direct map below VMALLOC_START
def direct_map(page_offset_base: int, vmalloc_start: int) -> LinearMap:
    """``pa = va - PAGE_OFFSET`` over ``[page_offset_base, VMALLOC_START)``."""
    return LinearMap(page_offset_base, vmalloc_start, page_offset_base)


def translator(info: VmcoreInfo, phys: PhysReader, symbol: Callable[[str], int | None]) -> X86_64Translator:
    """Build the translation of a dump from its VMCOREINFO and the image's (runtime) symbols.

    ``phys_base`` and ``SYMBOL(init_top_pgt)`` are required (every x86-64
    kernel since 4.13 writes them). The image shortcut is taken over the
    segments of :data:`KERNEL_SEGMENTS` the symbols bound; the direct-map one needs ``page_offset_base`` (read from the
    image) and ``VMALLOC_START`` (``NUMBER(VMALLOC_START)`` or the
    ``vmalloc_base`` variable). Without them the walk serves those ranges.
    """
    phys_base = info.number("NUMBER(phys_base)", lo=-(1 << 63), hi=(1 << 64) - 1)
    if phys_base is None:
        raise DumpError("VMCOREINFO has no NUMBER(phys_base): cannot find the x86-64 kernel page tables")
    phys_base &= _U64
    pgt = info.symbol("init_top_pgt") or info.symbol("swapper_pg_dir") or symbol("init_top_pgt")
    if pgt is None:
        raise DumpError("VMCOREINFO has no SYMBOL(init_top_pgt): cannot find the x86-64 kernel page tables")
    if not __START_KERNEL_map <= pgt < _U64:
        raise DumpError(f"SYMBOL(init_top_pgt)={pgt:x} is not a kernel image address")
    l5 = info.number("NUMBER(pgtable_l5_enabled)", lo=0, hi=1) or 0
    sme_mask = info.number("NUMBER(sme_mask)", lo=0, hi=(1 << 64) - 1) or 0
    pgd = (pgt - __START_KERNEL_map + phys_base) & _U64
    walk = X86_64Translator(phys, pgd, l5=bool(l5), sme_mask=sme_mask)
    linear: list[LinearMap] = []
    linear.extend(kernel_image_segments(symbol, phys_base))
    page_offset_base = _read_variable(walk, phys, symbol("page_offset_base"))
    vmalloc_start = info.word("NUMBER(VMALLOC_START)")
    if vmalloc_start is None:
        vmalloc_start = _read_variable(walk, phys, symbol("vmalloc_base"))
    if page_offset_base is not None and vmalloc_start is not None and page_offset_base < vmalloc_start:
        linear.append(direct_map(page_offset_base, vmalloc_start))
    return X86_64Translator(phys, pgd, l5=bool(l5), sme_mask=sme_mask, linear=tuple(linear))


def _read_variable(walk: X86_64Translator, phys: PhysReader, addr: int | None) -> int | None:
    """An unsigned long of the image, read through the page tables; ``None`` when it cannot be."""
    if addr is None:
        return None
    try:
        return int.from_bytes(phys.read_phys(walk.translate(addr), 8), "little")
    except MemoryFault:
        return None
