"""riscv64 kernel address translation, as ``arch/riscv/include/asm/{pgtable-64,pgtable-bits,page}.h`` define it.

Sv39, Sv48 and Sv57 (3, 4 or 5 levels of 512 entries, 4 KiB pages); a
present entry with any of R, W, X (``_PAGE_LEAF``) is a leaf at its level, so
2 MiB, 1 GiB and 512 GiB pages come out of the same walk. The PFN is bits
[53:10] (``_PAGE_PFN_MASK``); a Svnapot PTE (bit 63) maps 64 KiB.

The shortcuts are the kernel's ``__va_to_pa_nodebug()``: the linear map
``linear_mapping_va_to_pa()`` (``PAGE_OFFSET``, ``phys_ram_base``) for
``is_linear_mapping()``, and the kernel mapping ``kernel_mapping_va_to_pa()``
(``va_kernel_pa_offset``) over the image.

QEMU writes no VMCOREINFO for riscv guests; :func:`find_vmcoreinfo` finds the
kernel's own ``vmcoreinfo_note`` in physical memory through the image's symbols.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from unwind.kernel.btf import BTF_MAGIC, BtfError
from unwind.core.errors import DumpError
from unwind.core.memory import MemoryFault, NotMapped
from unwind.formats.vmcore.virtual import LinearMap, PhysReader, VirtualMemory, read_entry
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo, parse_vmcoreinfo_note

if TYPE_CHECKING:
    from unwind.kernel.btf import Btf

_U64 = (1 << 64) - 1

# --- pgtable-64.h, pgtable-bits.h, page.h ---
PAGE_SHIFT = 12
PTRS_PER_PTE = 512
_PAGE_PRESENT = 1 << 0
_PAGE_READ = 1 << 1
_PAGE_WRITE = 1 << 2
_PAGE_EXEC = 1 << 3
_PAGE_LEAF = _PAGE_READ | _PAGE_WRITE | _PAGE_EXEC
_PAGE_PFN_SHIFT = 10
#: GENMASK(53, 10)
_PAGE_PFN_MASK = ((1 << 54) - 1) & ~((1 << _PAGE_PFN_SHIFT) - 1)
_PAGE_NAPOT_SHIFT = 63
_PAGE_NAPOT = 1 << _PAGE_NAPOT_SHIFT
#: satp MODE per paging mode (csr.h SATP_MODE_39/48/57), by VA_BITS
SATP_MODES = {39: "Sv39", 48: "Sv48", 57: "Sv57"}
#: the kernel is loaded at a PMD_SIZE-aligned physical address (Documentation/arch/riscv/boot.rst)
PMD_SIZE = 1 << 21


# __page_val_to_pfn()
def page_val_to_pfn(val: int) -> int:
    """``(val & _PAGE_PFN_MASK) >> _PAGE_PFN_SHIFT``."""
    return (val & _PAGE_PFN_MASK) >> _PAGE_PFN_SHIFT


# pte_pfn(): a Svnapot PTE encodes its size in the low PFN bits; clearing the lowest set bit gives the base
def pte_pfn(pte: int) -> int:
    """The first PFN a PTE maps (the 64 KiB region's for a Svnapot PTE)."""
    res = page_val_to_pfn(pte)
    if pte & _PAGE_NAPOT:
        res &= res - 1
    return res


# napot_cont_shift(): the size a Svnapot PTE maps, from the trailing zeros of its PFN
def napot_cont_shift(pte: int) -> int:
    """``PAGE_SHIFT + napot_cont_order()``: 16 for the 64 KiB order the kernel uses."""
    pfn = page_val_to_pfn(pte)
    return PAGE_SHIFT + ((pfn << 1) & -(pfn << 1)).bit_length() - 1 if pfn else PAGE_SHIFT


class RiscvTranslator:
    """Kernel virtual to physical on one riscv64 dump."""

    page_shift = PAGE_SHIFT

    def __init__(self, phys: PhysReader, pgd: int, *, va_bits: int, linear: tuple[LinearMap, ...] = ()) -> None:
        if va_bits not in SATP_MODES:
            raise DumpError(f"riscv: VA_BITS={va_bits} is none of Sv39, Sv48, Sv57")
        self.phys = phys
        #: physical address of ``swapper_pg_dir``
        self.pgd = pgd
        self.va_bits = va_bits
        self.levels = (va_bits - PAGE_SHIFT) // 9
        #: PGDIR_SHIFT is ``pgdir_shift``: 30, 39 or 48 as the kernel picked the mode
        self.pgdir_shift = va_bits - 9
        self.linear = linear
        self._names = ("PGD", "P4D", "PUD", "PMD", "PTE")[-self.levels:]

    # pgd_index()
    def pgd_index(self, address: int) -> int:
        """``(address >> PGDIR_SHIFT) & (PTRS_PER_PGD - 1)``."""
        return (address >> self.pgdir_shift) & (PTRS_PER_PTE - 1)

    # pXd_present(): _PAGE_PRESENT
    @staticmethod
    def present(entry: int) -> bool:
        """``pgd_present()``, ``p4d_present()``, ``pud_present()``, ``pmd_present()``, ``pte_present()``."""
        return bool(entry & _PAGE_PRESENT)

    # pXd_leaf(): present and any of R, W, X
    @staticmethod
    def leaf(entry: int) -> bool:
        """``pud_leaf()``, ``pmd_leaf()``: a mapping, not a pointer to the next table."""
        return bool(entry & _PAGE_PRESENT) and bool(entry & _PAGE_LEAF)

    # pfn_to_phys(__page_val_to_pfn()): the next table of a non-leaf entry (pud_pgtable(), pmd_page_vaddr(), ...)
    @staticmethod
    def table(entry: int) -> int:
        """Physical address of the table an upper entry points to."""
        return page_val_to_pfn(entry) << PAGE_SHIFT

    # the pgd_offset_k() .. pte_offset_kernel() chain
    def walk(self, address: int) -> int:
        """Descend from ``swapper_pg_dir`` to the leaf of ``address``."""
        slot = self.pgd + 8 * self.pgd_index(address)
        for level in range(self.levels):
            name = self._names[level]
            entry = read_entry(self.phys, slot, address, name)
            shift = PAGE_SHIFT + 9 * (self.levels - 1 - level)
            if not self.present(entry):
                raise NotMapped(address, 1, f"{name} entry not present")
            if self.leaf(entry):
                if entry & _PAGE_NAPOT and level == self.levels - 1:
                    shift = napot_cont_shift(entry)
                mask = (1 << shift) - 1
                return ((pte_pfn(entry) << PAGE_SHIFT) & ~mask) | (address & mask)
            if level == self.levels - 1:
                raise NotMapped(address, 1, "PTE points to another table")
            slot = self.table(entry) + 8 * ((address >> (shift - 9)) & (PTRS_PER_PTE - 1))
        raise AssertionError("the last level always returns")

    # the sign extension the MMU requires: bits above VA_BITS - 1 copy it
    def is_canonical(self, address: int) -> bool:
        """Is ``address`` a sign-extended ``VA_BITS``-bit address?"""
        top = address >> (self.va_bits - 1)
        return top == 0 or top == _U64 >> (self.va_bits - 1)

    def translate(self, vaddr: int) -> int:
        """``__va_to_pa_nodebug()`` where a shortcut covers ``vaddr``, else the table walk."""
        if not self.is_canonical(vaddr):
            raise NotMapped(vaddr, 1, f"not a canonical {SATP_MODES[self.va_bits]} address")
        for lm in self.linear:
            if lm.start <= vaddr < lm.end:
                return lm.pa(vaddr)
        return self.walk(vaddr)


# linear_mapping_va_to_pa() over is_linear_mapping()
def linear_map(page_offset: int, phys_ram_base: int, va_bits: int) -> LinearMap:
    """``pa = va - va_pa_offset`` over ``[PAGE_OFFSET, PAGE_OFFSET + KERN_VIRT_SIZE)``.

    ``KERN_VIRT_SIZE`` is ``(PTRS_PER_PGD / 2 * PGDIR_SIZE) / 2``, that is ``1 << (VA_BITS - 2)``.
    """
    end = min(page_offset + (1 << (va_bits - 2)), _U64)
    return LinearMap(page_offset, end, (page_offset - phys_ram_base) & _U64)


# kernel_mapping_va_to_pa() over is_kernel_mapping()
def kernel_mapping(start: int, end: int, va_kernel_pa_offset: int) -> LinearMap:
    """``pa = va - va_kernel_pa_offset`` over the image ``[_start, _end)``."""
    return LinearMap(start, end, va_kernel_pa_offset)


def translator(info: VmcoreInfo, phys: PhysReader, symbol: Callable[[str], int | None]) -> RiscvTranslator:
    """Build the translation of a dump from its VMCOREINFO and the image's (runtime) symbols.

    Required: ``NUMBER(va_kernel_pa_offset)`` (not written by XIP kernels) and
    ``SYMBOL(swapper_pg_dir)``. ``NUMBER(VA_BITS)`` (5.17+) picks the mode,
    Sv39 without it, as crash assumes. The linear shortcut needs
    ``NUMBER(PAGE_OFFSET)`` and ``NUMBER(phys_ram_base)`` and is not taken on a
    KASAN kernel: with Sv57 the shadow (``KASAN_SHADOW_START``
    0xffdf000000000000) begins below ``PAGE_OFFSET + KERN_VIRT_SIZE``. The image
    one needs the ``_start``/``_end`` symbols: ``create_kernel_page_table()``
    maps all of it, and ``free_initmem()`` only makes ``__init`` non-executable.
    """
    voffset = info.word("NUMBER(va_kernel_pa_offset)")
    swapper = info.symbol("swapper_pg_dir")
    if voffset is None:
        raise DumpError("riscv: VMCOREINFO has no NUMBER(va_kernel_pa_offset): cannot find the kernel page tables")
    if swapper is None:
        raise DumpError("riscv: VMCOREINFO has no SYMBOL(swapper_pg_dir): cannot find the kernel page tables")
    va_bits = info.number("NUMBER(VA_BITS)", lo=39, hi=57)
    if va_bits is None:
        va_bits = 39
    if va_bits not in SATP_MODES:
        raise DumpError(f"riscv: VMCOREINFO NUMBER(VA_BITS)={va_bits} is none of Sv39, Sv48, Sv57")
    linear: list[LinearMap] = []
    page_offset = info.word("NUMBER(PAGE_OFFSET)")
    phys_ram_base = info.word("NUMBER(phys_ram_base)")
    if (page_offset is not None and phys_ram_base is not None and page_offset >> 63
            and symbol("kasan_early_shadow_page") is None):
        linear.append(linear_map(page_offset, phys_ram_base, va_bits))
    start, end = symbol("_start"), symbol("_end")
    if start is not None and end is not None and start < end:
        linear.append(kernel_mapping(start, end, voffset))
    return RiscvTranslator(phys, (swapper - voffset) & _U64, va_bits=va_bits, linear=tuple(linear))


def find_vmcoreinfo(phys: PhysReader, ranges: Iterable[tuple[int, int]], symbol: Callable[[str], int | None],
                    btf: "Btf | None" = None) -> tuple[VmcoreInfo, str]:
    """The kernel's own VMCOREINFO, read from ``vmcoreinfo_note`` when the dump has no note of it.

    ``symbol`` gives the image's link-time addresses of ``_start``,
    ``vmcoreinfo_note`` and ``swapper_pg_dir`` (and ``kernel_map``);
    ``ranges`` are the dump's physical ``[start, end)`` ranges. The image
    sits at a 2 MiB-aligned physical address, so each candidate load address
    gives where those variables would be. ``vmcoreinfo_note`` points to a page
    of the linear map; it is followed with ``kernel_map.va_pa_offset``
    (``linear_mapping_va_to_pa()``, the offset taken from ``btf``) or, without
    BTF or where that fails, through ``swapper_pg_dir`` in Sv57, Sv48 then
    Sv39. A candidate counts when that reaches an ELF note named
    ``VMCOREINFO``, which ``update_vmcoreinfo_note()`` wrote at boot.
    Returns the parsed text and a sentence saying where it was found.
    """
    start, note_sym, swapper = symbol("_start"), symbol("vmcoreinfo_note"), symbol("swapper_pg_dir")
    if start is None or note_sym is None or swapper is None:
        raise DumpError("riscv: the dump has no VMCOREINFO and the image lacks _start, vmcoreinfo_note "
                        "or swapper_pg_dir to find the kernel's own")
    if not (start <= note_sym and start <= swapper):
        raise DumpError("riscv: vmcoreinfo_note and swapper_pg_dir lie below _start in the image")
    va_pa_offset_at = _va_pa_offset_location(symbol, btf)
    # one span over all ranges: a filtered or sliced dump splits RAM into many small PT_LOADs
    spans = sorted(ranges)
    lo, hi = (spans[0][0], max(h for _, h in spans)) if spans else (0, 0)
    base = -(-lo // PMD_SIZE) * PMD_SIZE
    while base + (note_sym - start) + 8 <= hi:
        ptr = _read_u64(phys, base + (note_sym - start))
        found = None
        if ptr is not None and ptr >> 63 and not ptr & ((1 << PAGE_SHIFT) - 1):  # alloc_pages_exact()
            if va_pa_offset_at is not None:
                found = _linear_note(phys, ptr, _read_u64(phys, base + va_pa_offset_at - start))
            if found is None:
                found = _walked_note(phys, ptr, base + (swapper - start))
        if found is not None:
            return found, (f"VMCOREINFO read from the kernel's vmcoreinfo_note (image loaded at "
                           f"physical {base:#x}): the dump has no VMCOREINFO note")
        image_btf = btf if btf is not None else _loaded_btf(phys, base, symbol)
        rebuilt = arch_crash_save_vmcoreinfo(phys, base, symbol, image_btf) if image_btf is not None else None
        if rebuilt is not None:
            return rebuilt, (f"VMCOREINFO rebuilt from kernel_map, phys_ram_base and satp_mode in the image "
                             f"(loaded at physical {base:#x}): the dump has no VMCOREINFO note, and the "
                             "kernel's own vmcoreinfo_note is not in it")
        base += PMD_SIZE
    raise DumpError("riscv: the dump has no VMCOREINFO, and the kernel's vmcoreinfo_note was not found "
                    "in its memory (wrong vmlinux?)")


#: satp MODE field (csr.h SATP_MODE_39/48/57 >> SATP_MODE_SHIFT) -> VA_BITS
SATP_MODE_VA_BITS = {8: 39, 9: 48, 10: 57}
SATP_MODE_SHIFT = 60


# arch_crash_save_vmcoreinfo() (arch/riscv/kernel/vmcore_info.c): the same keys, from the variables it prints
def arch_crash_save_vmcoreinfo(phys: PhysReader, base: int, symbol: Callable[[str], int | None],
                               btf: "Btf") -> VmcoreInfo | None:
    """The translation keys of VMCOREINFO read from the image loaded at physical ``base``, or ``None``.

    ``kernel_map`` (fields located through BTF: the struct's layout changed in
    7.x) must say it was loaded at ``base``; ``satp_mode`` gives the paging
    mode; ``kernel_map.virt_addr`` the KASLR slide of ``SYMBOL()`` values.
    """
    start = symbol("_start")
    if start is None:
        return None

    def image_u64(name: str, member: str | None = None) -> int | None:
        addr = symbol(name)
        if addr is None:
            return None
        try:
            off = btf.offsetof("kernel_mapping", member) if member else 0
        except BtfError:
            return None
        return _read_u64(phys, base + addr - start + off)

    if image_u64("kernel_map", "phys_addr") != base:
        return None
    virt_addr, page_offset = image_u64("kernel_map", "virt_addr"), image_u64("kernel_map", "page_offset")
    va_kernel_pa_offset = image_u64("kernel_map", "va_kernel_pa_offset")
    phys_ram_base, satp = image_u64("phys_ram_base"), image_u64("satp_mode")
    swapper, stext = symbol("swapper_pg_dir"), symbol("_stext")
    values = (virt_addr, page_offset, va_kernel_pa_offset, phys_ram_base, satp, swapper, stext)
    if any(v is None for v in values):
        return None
    assert virt_addr is not None and satp is not None and swapper is not None and stext is not None
    va_bits = SATP_MODE_VA_BITS.get(satp >> SATP_MODE_SHIFT)
    if va_bits is None:
        return None
    slide = virt_addr - start
    release = _osrelease(phys, base, start, symbol, btf)
    end = symbol("_end")
    # asm/pgtable.h, 64-bit: MODULES_VADDR = PFN_ALIGN(&_end) - SZ_2G, MODULES_END = PFN_ALIGN(&_start)
    modules = "" if end is None else (f"NUMBER(MODULES_VADDR)={(_pfn_align(end + slide) - (2 << 30)) & _U64:#x}\n"
                                      f"NUMBER(MODULES_END)={_pfn_align(start + slide) & _U64:#x}\n")
    return VmcoreInfo.parse(
        (f"OSRELEASE={release}\n" if release else "") + modules +
        f"PAGESIZE={1 << PAGE_SHIFT}\nSYMBOL(swapper_pg_dir)={(swapper + slide) & _U64:x}\n"
        f"SYMBOL(_stext)={(stext + slide) & _U64:x}\nNUMBER(phys_ram_base)={phys_ram_base}\n"
        f"NUMBER(PAGE_OFFSET)={page_offset:#x}\nNUMBER(VA_BITS)={va_bits}\n"
        f"NUMBER(va_kernel_pa_offset)={va_kernel_pa_offset:#x}\n")


def _pfn_align(addr: int) -> int:
    """``PFN_ALIGN()``: up to the next page boundary."""
    return (addr + (1 << PAGE_SHIFT) - 1) & ~((1 << PAGE_SHIFT) - 1)


# crash_save_vmcoreinfo_init() (kernel/vmcore_info.c): VMCOREINFO_OSRELEASE(init_uts_ns.name.release)
def _osrelease(phys: PhysReader, base: int, start: int, symbol: Callable[[str], int | None], btf: "Btf") -> str | None:
    """``init_uts_ns.name.release`` in the image loaded at physical ``base`` (the walk's kernel generation)."""
    uts = symbol("init_uts_ns")
    if uts is None:
        return None
    try:
        at = base + uts - start + btf.offsetof("uts_namespace", "name") + btf.offsetof("new_utsname", "release")
        raw = phys.read_phys(at, 65)
    except (BtfError, MemoryFault):
        return None
    text = raw.split(b"\0", 1)[0]
    return text.decode("ascii") if text and text.isascii() and text.decode("ascii").isprintable() else None


def _loaded_btf(phys: PhysReader, base: int, symbol: Callable[[str], int | None]) -> "Btf | None":
    """The kernel's BTF (``__start_BTF`` .. ``__stop_BTF``) in the image loaded at physical ``base``, for an image
    file without ``.BTF``; ``None`` unless a BTF header is there."""
    from unwind.kernel.btf import Btf

    start, lo, hi = symbol("_start"), symbol("__start_BTF"), symbol("__stop_BTF")
    if start is None or lo is None or hi is None or not 0 < hi - lo < 1 << 28 or lo < start:
        return None
    at = base + lo - start
    try:
        if int.from_bytes(phys.read_phys(at, 2), "little") != BTF_MAGIC:
            return None
        return Btf.cached(phys.read_phys(at, hi - lo))
    except (MemoryFault, BtfError):
        return None


def _va_pa_offset_location(symbol: Callable[[str], int | None], btf: "Btf | None") -> int | None:
    """The link-time address of ``kernel_map.va_pa_offset``, where the image and its BTF say."""
    kernel_map = symbol("kernel_map")
    if kernel_map is None or btf is None:
        return None
    try:
        return kernel_map + btf.offsetof("kernel_mapping", "va_pa_offset")
    except BtfError:
        return None


def _read_u64(phys: PhysReader, paddr: int) -> int | None:
    try:
        return int.from_bytes(phys.read_phys(paddr, 8), "little")
    except MemoryFault:
        return None


def _note_at(read: Callable[[int, int], bytes], addr: int) -> VmcoreInfo | None:
    """The VMCOREINFO ELF note at ``addr`` as ``read(addr, size)`` sees it, or ``None``."""
    try:
        head = read(addr, 24)
        if head[12:23] != b"VMCOREINFO\0":
            return None
        return parse_vmcoreinfo_note(head + read(addr + 24, min(int.from_bytes(head[4:8], "little"), 1 << 16)))
    except (MemoryFault, DumpError):
        return None


# linear_mapping_va_to_pa(): the note's pages are physically contiguous (alloc_pages_exact())
def _linear_note(phys: PhysReader, ptr: int, va_pa_offset: int | None) -> VmcoreInfo | None:
    """The note at ``ptr - kernel_map.va_pa_offset``, if one is there."""
    return None if va_pa_offset is None else _note_at(phys.read_phys, (ptr - va_pa_offset) & _U64)


def _walked_note(phys: PhysReader, ptr: int, pgd: int) -> VmcoreInfo | None:
    """The note ``ptr`` leads to through the page tables at ``pgd``, in the first mode that maps it."""
    for va_bits in (57, 48, 39):
        walk = RiscvTranslator(phys, pgd, va_bits=va_bits)
        if walk.is_canonical(ptr) and (found := _note_at(VirtualMemory(phys, walk).read, ptr)) is not None:
            return found
    return None
