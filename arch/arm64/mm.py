"""arm64 kernel address translation, as ``arch/arm64/include/asm/{pgtable-hwdef,pgtable,memory}.h`` define it.

Granules of 4K, 16K and 64K; ``ARM64_HW_PGTABLE_LEVELS(va_bits)`` levels,
numbered as the kernel numbers them (-1 .. 3, the PTE at 3). The output
address is ``__pte_to_phys()``: bits ``[49:PAGE_SHIFT]``, plus PA[51:48] from
bits [15:12] with 64K pages (FEAT_LPA) or PA[51:50] from bits [9:8] with
4K/16K LPA2 (52-bit VA, ``TCR_EL1.DS``), where bits [9:8] are no longer SH.

The shortcuts are the kernel's ``__virt_to_phys_nodebug()``: the linear map
``__lm_to_phys()`` (``PHYS_OFFSET``) for ``__is_lm_address()``, and the image
``__kimg_to_phys()`` (``kimage_voffset``) over the segments ``map_kernel()``
maps and keeps mapped (:data:`KERNEL_SEGMENTS`). The rest of ``[_text, _end)``
is walked: ``[_text, _stext)`` is vmalloc space on the kernels that leave it
unmapped (IRQ stacks and other vmalloc memory can live there), and
``free_initmem()`` unmaps ``[__init_begin, __init_end)``.
"""

from __future__ import annotations

from typing import Callable

from unwind.core.errors import DumpError
from unwind.core.memory import NotMapped
from unwind.formats.vmcore.virtual import LinearMap, PhysReader, read_entry
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

_U64 = (1 << 64) - 1

# --- pgtable-hwdef.h ---
PTDESC_ORDER = 3
#: bits [1:0] of every descriptor
PTE_TYPE_MASK = 0b11
#: a table above level 3, a page at level 3 (PTE_TYPE_PAGE, PMD_TYPE_TABLE, ...)
PMD_TYPE_TABLE = PTE_TYPE_PAGE = 0b11
#: a block above level 3 (PMD_TYPE_SECT, PUD_TYPE_SECT, P4D_TYPE_SECT)
PMD_TYPE_SECT = 0b01
PTE_VALID = 1 << 0
#: SH[1:0]; with LPA2 these bits are PA[51:50] (PTE_MAYBE_SHARED is then 0)
PTE_SHARED = 0b11 << 8
#: 64K pages, FEAT_LPA: PA[51:48] in descriptor bits [15:12]
PTE_ADDR_HIGH_64K = 0xF << 12
PTE_ADDR_HIGH_SHIFT_64K = 36
#: 4K/16K pages, FEAT_LPA2: PA[51:50] in descriptor bits [9:8]
PTE_ADDR_HIGH_LPA2 = 0x3 << 8
PTE_ADDR_HIGH_SHIFT_LPA2 = 42
GRANULES = {12: "4K", 14: "16K", 16: "64K"}


# ARM64_HW_PGTABLE_LEVELS()
def arm64_hw_pgtable_levels(va_bits: int, page_shift: int) -> int:
    """Levels to resolve ``va_bits`` bits: ``(va_bits - PTDESC_ORDER - 1) / PTDESC_TABLE_SHIFT``."""
    return (va_bits - PTDESC_ORDER - 1) // (page_shift - PTDESC_ORDER)


# ARM64_HW_PGTABLE_LEVEL_SHIFT()
def arm64_hw_pgtable_level_shift(n: int, page_shift: int) -> int:
    """Bits mapped by an entry at level ``n``: ``PTDESC_TABLE_SHIFT * (4 - n) + PTDESC_ORDER``."""
    return (page_shift - PTDESC_ORDER) * (4 - n) + PTDESC_ORDER


# PTE_ADDR_LOW
def pte_addr_low(page_shift: int) -> int:
    """Descriptor bits ``[49:PAGE_SHIFT]``: the output address below bit 50."""
    return ((1 << (50 - page_shift)) - 1) << page_shift


# _PAGE_OFFSET()
def _page_offset(va: int) -> int:
    """``-(1 << va)``: the start of the linear map (``PAGE_OFFSET`` is ``_PAGE_OFFSET(VA_BITS)``)."""
    return -(1 << va) & _U64


# _PAGE_END()
def _page_end(va: int) -> int:
    """``-(1 << (va - 1))``: the end of the linear map without KASAN (``PAGE_END``)."""
    return -(1 << (va - 1)) & _U64


# VA_BITS_MIN
def va_bits_min(va_bits: int, page_shift: int) -> int:
    """48 (47 with 16K pages) when VA_BITS is 52, else VA_BITS."""
    if va_bits > 48:
        return 47 if page_shift == 14 else 48
    return va_bits


# untagged_addr(): TBI, sign-extend bit 55 over the tag byte
def untagged_addr(addr: int) -> int:
    """The address without a top-byte tag (MTE, KASAN software tags)."""
    return addr | (0xFF << 56) if addr >> 55 & 1 else addr & ~(0xFF << 56)


class Arm64Translator:
    """Kernel virtual to physical on one arm64 dump (TTBR1: the upper half of the address space)."""

    def __init__(self, phys: PhysReader, pgd: int, *, page_shift: int, va_bits: int, lpa2: bool = False,
                 linear: tuple[LinearMap, ...] = ()) -> None:
        if page_shift not in GRANULES or not page_shift < va_bits <= 52:
            raise DumpError(f"arm64: no translation for {1 << page_shift}-byte pages with a {va_bits}-bit VA")
        self.phys = phys
        #: physical address of ``swapper_pg_dir``
        self.pgd = pgd
        self.page_shift = page_shift
        self.va_bits = va_bits
        self.levels = arm64_hw_pgtable_levels(va_bits, page_shift)
        self.start_level = 4 - self.levels
        self.pgdir_shift = arm64_hw_pgtable_level_shift(self.start_level, page_shift)
        #: PTRS_PER_PGD: the root may be smaller than a page
        self.ptrs_per_pgd = 1 << (va_bits - self.pgdir_shift)
        self.ptrs_per_table = 1 << (page_shift - PTDESC_ORDER)
        self.addr_low = pte_addr_low(page_shift)
        if page_shift == 16:
            self.addr_high, self.addr_high_shift, self.maybe_shared = PTE_ADDR_HIGH_64K, PTE_ADDR_HIGH_SHIFT_64K, 0
        elif lpa2:
            self.addr_high, self.addr_high_shift, self.maybe_shared = PTE_ADDR_HIGH_LPA2, PTE_ADDR_HIGH_SHIFT_LPA2, 0
        else:
            self.addr_high, self.addr_high_shift, self.maybe_shared = 0, 0, PTE_SHARED
        self.linear = linear
        self._names = ("pgd", "p4d", "pud", "pmd", "pte")[-self.levels:]

    # __pte_to_phys() (also __pmd_to_phys(), __pud_to_phys(), ... : the same encoding at every level)
    def pte_to_phys(self, entry: int) -> int:
        """The output address of a descriptor."""
        entry &= ~self.maybe_shared
        return (entry & self.addr_low) | ((entry & self.addr_high) << self.addr_high_shift)

    # pgd_index()
    def pgd_index(self, address: int) -> int:
        """``(address >> PGDIR_SHIFT) & (PTRS_PER_PGD - 1)``."""
        return (address >> self.pgdir_shift) & (self.ptrs_per_pgd - 1)

    # pXd_index(): the index at a level below the root
    def index(self, address: int, level: int) -> int:
        """``pud_index()``, ``pmd_index()``, ``pte_index()``."""
        return (address >> arm64_hw_pgtable_level_shift(level, self.page_shift)) & (self.ptrs_per_table - 1)

    # pXd_table(): (entry & PMD_TYPE_MASK) == PMD_TYPE_TABLE
    @staticmethod
    def table(entry: int) -> bool:
        """Does an entry above level 3 point to a table?"""
        return entry & PTE_TYPE_MASK == PMD_TYPE_TABLE

    # pXd_sect(): (entry & PMD_TYPE_MASK) == PMD_TYPE_SECT
    @staticmethod
    def sect(entry: int) -> bool:
        """Is an entry above level 3 a block mapping?"""
        return entry & PTE_TYPE_MASK == PMD_TYPE_SECT

    # pte_valid() on a level-3 descriptor, which must also be PTE_TYPE_PAGE
    @staticmethod
    def pte_page(entry: int) -> bool:
        """Is a level-3 entry a valid page?"""
        return entry & PTE_TYPE_MASK == PTE_TYPE_PAGE

    # the pgd_offset_k() .. pte_offset_kernel() chain, as the MMU walks it
    def walk(self, address: int) -> int:
        """Descend from ``swapper_pg_dir`` to the block or page of ``address``."""
        table = self.pgd + 8 * self.pgd_index(address)
        for level in range(self.start_level, 4):
            name = self._names[level - self.start_level].upper()
            entry = read_entry(self.phys, table, address, name)
            if level < 3 and self.table(entry):
                table = self.pte_to_phys(entry) + 8 * self.index(address, level + 1)
                continue
            if not (self.sect(entry) if level < 3 else self.pte_page(entry)):
                raise NotMapped(address, 1, f"{name} entry not valid")
            mask = (1 << arm64_hw_pgtable_level_shift(level, self.page_shift)) - 1
            return (self.pte_to_phys(entry) & ~mask) | (address & mask)
        raise AssertionError("level 3 always returns")

    def translate(self, vaddr: int) -> int:
        """``__virt_to_phys_nodebug()`` where a shortcut covers ``vaddr``, else the table walk."""
        vaddr = untagged_addr(vaddr)
        if vaddr < _page_offset(self.va_bits):
            raise NotMapped(vaddr, 1, f"below the {self.va_bits}-bit kernel address space (TTBR1)")
        for lm in self.linear:
            if lm.start <= vaddr < lm.end:
                return lm.pa(vaddr)
        return self.walk(vaddr)


# __lm_to_phys() over __is_lm_address()
def linear_map(va_bits: int, page_end: int, phys_offset: int) -> LinearMap:
    """``pa = va - PAGE_OFFSET + PHYS_OFFSET`` over ``[PAGE_OFFSET, PAGE_END)``."""
    page_offset = _page_offset(va_bits)
    return LinearMap(page_offset, page_end, (page_offset - phys_offset) & _U64)


#: map_kernel() (arch/arm64/mm/mmu.c; arch/arm64/kernel/pi/map_kernel.c from 6.9): the image segments mapped at
#: kimage_voffset and never unmapped. 5.9's map_kernel() maps [_text, _etext); 6.1's and 6.12's start at _stext,
#: leaving [_text, _stext) a free hole of the vmalloc area; a later pi/map_kernel.c maps [_text, _stext) again. The
#: init segments ([__inittext_begin, __inittext_end), [__initdata_begin, __initdata_end)) are unmapped by
#: free_initmem() (vunmap_range(__init_begin, __init_end)) once the kernel has booted. Both are walked.
KERNEL_SEGMENTS = (("_stext", "_etext"), ("__start_rodata", "__inittext_begin"), ("_data", "_end"))


# __kimg_to_phys() over map_kernel_segment()
def kimage_map(start: int, end: int, kimage_voffset: int) -> LinearMap:
    """``pa = va - kimage_voffset`` over one segment ``[start, end)`` of the image mapping."""
    return LinearMap(start, end, kimage_voffset)


# map_kernel(): the segments that stay mapped at kimage_voffset
def kimage_segments(symbol: Callable[[str], int | None], kimage_voffset: int) -> list[LinearMap]:
    """:func:`kimage_map` over each of :data:`KERNEL_SEGMENTS` whose bounds the image's symbols give."""
    out = []
    for first, last in KERNEL_SEGMENTS:
        start, end = symbol(first), symbol(last)
        if start is not None and end is not None and start < end:
            out.append(kimage_map(start, end, kimage_voffset))
    return out


def translator(info: VmcoreInfo, phys: PhysReader, symbol: Callable[[str], int | None]) -> Arm64Translator:
    """Build the translation of a dump from its VMCOREINFO and the image's (runtime) symbols.

    Required: ``PAGESIZE``, ``NUMBER(VA_BITS)``, ``NUMBER(kimage_voffset)``
    (4.12+) and ``SYMBOL(swapper_pg_dir)``. The walk uses ``64 - TCR_EL1_T1SZ``
    bits (5.9+) except with 64K pages, where a 52-bit kernel keeps its 52-bit
    layout even on 48-bit hardware (drgn reads it the same way). The linear
    shortcut needs ``PHYS_OFFSET`` and is not taken on a KASAN kernel, whose
    ``PAGE_END`` moves with the shadow; the image one is taken over the
    segments of :data:`KERNEL_SEGMENTS` the symbols bound.
    """
    page_size = info.number("PAGESIZE", lo=1, hi=1 << 16)
    if page_size is None or page_size.bit_length() - 1 not in GRANULES or page_size & (page_size - 1):
        raise DumpError(f"arm64: VMCOREINFO PAGESIZE={info.get('PAGESIZE')} is not 4K, 16K or 64K")
    page_shift = page_size.bit_length() - 1
    va_bits = info.number("NUMBER(VA_BITS)", lo=page_shift + 1, hi=52)
    voffset = info.word("NUMBER(kimage_voffset)")
    swapper = info.symbol("swapper_pg_dir")
    for key, value in (("NUMBER(VA_BITS)", va_bits), ("NUMBER(kimage_voffset)", voffset),
                       ("SYMBOL(swapper_pg_dir)", swapper)):
        if value is None:
            raise DumpError(f"arm64: VMCOREINFO has no {key}: cannot translate kernel addresses")
    assert va_bits is not None and voffset is not None and swapper is not None
    t1sz = info.number("NUMBER(TCR_EL1_T1SZ)", lo=64 - 52, hi=64 - page_shift - 1)
    walk_bits = va_bits if page_shift == 16 or t1sz is None else 64 - t1sz
    if walk_bits <= page_shift:
        raise DumpError(f"arm64: {walk_bits}-bit VA with {page_size}-byte pages")
    # With 4K/16K pages a 52-bit VA means LPA2 and a 52-bit PA (required since 6.9, 352b0395b505)
    lpa2 = page_shift != 16 and walk_bits == 52
    linear: list[LinearMap] = []
    phys_offset = info.word("NUMBER(PHYS_OFFSET)")
    stext = info.symbol("_stext") or symbol("_stext")
    # 5.4 (14c127c957c1) flipped the layout: the image moved above PAGE_END, the linear map to the bottom
    flipped = stext is not None and stext >= _page_end(va_bits)
    if phys_offset is not None and flipped and symbol("kasan_early_shadow_page") is None:
        page_end = info.word("NUMBER(MODULES_VADDR)") or _page_end(va_bits_min(va_bits, page_shift))
        if _page_offset(va_bits) < page_end:
            linear.append(linear_map(va_bits, page_end, phys_offset))
    linear.extend(kimage_segments(symbol, voffset))
    return Arm64Translator(phys, (swapper - voffset) & _U64, page_shift=page_shift, va_bits=walk_bits,
                           lpa2=lpa2, linear=tuple(linear))
