"""arm64 translation on page tables built by construction: 4K/16K/64K granules, 36..52-bit VA, LPA/LPA2.

Descriptors are encoded here from the Arm ARM (VMSAv8-64): bits [1:0] 0b11 table/page, 0b01 block;
AF 10, PXN 53, UXN 54; output address [47:G], with 64K FEAT_LPA PA[51:48] in [15:12] and 4K/16K
FEAT_LPA2 PA[49:48] in [49:48] and PA[51:50] in [9:8] (where SH otherwise lives).
"""

from __future__ import annotations

import pytest

from unwind.arch.arm64 import mm
from unwind.formats.dump import DumpError
from unwind.core.memory import NotMapped
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from tests.vmcore.phys import RadixTables, SparsePhys

U64 = (1 << 64) - 1
AF, PXN, UXN, SH_INNER = 1 << 10, 1 << 53, 1 << 54, 0b11 << 8

#: (granule shift, VA bits) -> the (shift, index bits) of each level from the root, per the Arm ARM
MODES = {
    (12, 39): [(30, 9), (21, 9), (12, 9)],
    (12, 48): [(39, 9), (30, 9), (21, 9), (12, 9)],
    (12, 52): [(48, 4), (39, 9), (30, 9), (21, 9), (12, 9)],
    (14, 36): [(25, 11), (14, 11)],
    (14, 47): [(36, 11), (25, 11), (14, 11)],
    (14, 48): [(47, 1), (36, 11), (25, 11), (14, 11)],
    (14, 52): [(47, 5), (36, 11), (25, 11), (14, 11)],
    (16, 42): [(29, 13), (16, 13)],
    (16, 48): [(42, 6), (29, 13), (16, 13)],
    (16, 52): [(42, 10), (29, 13), (16, 13)],
}


def encode(pa: int, g: int, va_bits: int) -> int:
    """The output-address bits of a descriptor for ``pa``."""
    if g == 16:
        return (pa & ((1 << 48) - 1) & ~((1 << g) - 1)) | ((pa >> 48) & 0xF) << 12 | SH_INNER
    if va_bits == 52:  # LPA2
        return (pa & ((1 << 50) - 1) & ~((1 << g) - 1)) | ((pa >> 50) & 0x3) << 8
    return (pa & ~((1 << g) - 1)) | SH_INNER


def tables(g: int, va_bits: int) -> RadixTables:
    levels = MODES[(g, va_bits)]
    # with a 52-bit PA the tables themselves live above 2^48, so their addresses need the high bits too
    base = (0xB << 48) if va_bits == 52 else 0x40000000
    phys = SparsePhys(page_size=1 << g, alloc_base=base)
    last = len(levels) - 1

    def leaf(pa: int, lvl: int) -> int:
        return encode(pa, g, va_bits) | (0b11 if lvl == last else 0b01) | AF | PXN | UXN

    return RadixTables(phys, levels, lambda pa: encode(pa, g, va_bits) | 0b11, leaf, table_size=1 << g)


def walker(t: RadixTables, g: int, va_bits: int) -> mm.Arm64Translator:
    return mm.Arm64Translator(t.phys, t.root, page_shift=g, va_bits=va_bits, lpa2=(g != 16 and va_bits == 52))


@pytest.mark.parametrize("g,va_bits", sorted(MODES))
def test_pages_and_blocks(g, va_bits):
    t = tables(g, va_bits)
    levels = MODES[(g, va_bits)]
    last = len(levels) - 1
    start = -(1 << va_bits) & U64
    high = (0xA << 48) if va_bits == 52 else 0x80000000  # a 52-bit PA where the mode has one
    page = 1 << g
    block = 1 << levels[last - 1][0]
    va_page = start + 5 * block + 3 * page
    va_block = start + 9 * block
    t.map(va_page, high + 7 * page, last)
    t.map(va_block, high + 64 * block, last - 1)
    x = walker(t, g, va_bits)
    assert x.translate(va_page + 0x18) == high + 7 * page + 0x18
    assert x.translate(va_block + block - 8) == high + 64 * block + block - 8
    with pytest.raises(NotMapped):
        x.translate(va_page + page)  # the next PTE is invalid
    with pytest.raises(NotMapped):
        x.translate(va_block + block)  # the next block is invalid
    with pytest.raises(NotMapped, match="TTBR1"):
        x.translate(start - page)
    if len(levels) >= 3 and g == 12:  # a 1 GiB block at level 1
        va_huge = start + (5 << 30)
        t.map(va_huge, high + (3 << 30), last - 2)
        assert x.translate(va_huge + 0x3FFF0000) == high + (3 << 30) + 0x3FFF0000


def test_tagged_addresses_translate_as_untagged():
    t = tables(12, 48)
    va = 0xFFFF800012345000
    t.map(va, 0x9000, 3)
    x = walker(t, 12, 48)
    assert x.translate((va & ~(0xFF << 56)) | (0xF4 << 56) | 0x10) == 0x9010


def info(**kv: str) -> VmcoreInfo:
    return VmcoreInfo.parse("".join(f"{k}={v}\n" for k, v in kv.items()))


def test_translator_from_vmcoreinfo_linear_and_image():
    t = tables(12, 48)
    kimage_voffset = 0xFFFF7FFF40000000  # image at 0xffff800080000000 loaded at 0x40000000
    text, end = 0xFFFF800080000000, 0xFFFF800082000000
    for off in range(0, end - text, 1 << 21):
        t.map(text + off, text + off - kimage_voffset, 2)
    swapper = text + 0x1000000
    t.phys.pages[(swapper - kimage_voffset) >> 12] = t.phys.pages[t.root >> 12]
    vi = info(PAGESIZE="4096", **{"NUMBER(VA_BITS)": "48", "NUMBER(kimage_voffset)": f"{kimage_voffset:#x}",
                                  "NUMBER(PHYS_OFFSET)": "0x40000000", "NUMBER(TCR_EL1_T1SZ)": "0x10",
                                  "SYMBOL(swapper_pg_dir)": f"{swapper:x}", "SYMBOL(_stext)": f"{text + 0x10000:x}"})
    syms = {"_text": text, "_end": end}
    x = mm.translator(vi, t.phys, syms.get)
    assert x.translate(0xFFFF000000001234) == 0x40001234  # PAGE_OFFSET + x -> PHYS_OFFSET + x, no table
    assert x.translate(text + 0x123456) == text + 0x123456 - kimage_voffset
    walk_only = mm.Arm64Translator(t.phys, swapper - kimage_voffset, page_shift=12, va_bits=48)
    assert walk_only.translate(text + 0x123456) == x.translate(text + 0x123456)
    with pytest.raises(NotMapped):
        x.translate(0xFFFF800000000000)  # the module area: no shortcut, and the walk finds nothing


@pytest.mark.parametrize("page,va_bits,t1sz,walk_bits,levels", [
    ("4096", "52", "0x10", 48, 4),     # a 52-bit LPA2 kernel on 48-bit hardware folds a level
    ("16384", "52", "0x11", 47, 3),
    ("65536", "52", "0x10", 52, 3),    # 64K keeps the 52-bit layout (TTBR1 offset)
    ("4096", "48", None, 48, 4),       # before TCR_EL1_T1SZ (5.9) VA_BITS is all there is
])
def test_walk_width_follows_t1sz_except_with_64k(page, va_bits, t1sz, walk_bits, levels):
    kv = {"NUMBER(VA_BITS)": va_bits, "NUMBER(kimage_voffset)": "0xffff7fff40000000",
          "SYMBOL(swapper_pg_dir)": "ffff800081000000"}
    if t1sz:
        kv["NUMBER(TCR_EL1_T1SZ)"] = t1sz
    x = mm.translator(info(PAGESIZE=page, **kv), SparsePhys(), {}.get)
    assert (x.va_bits, x.levels) == (walk_bits, levels)


@pytest.mark.parametrize("kv,msg", [
    ({"PAGESIZE": "8192"}, "PAGESIZE"),
    ({"PAGESIZE": "4096", "NUMBER(VA_BITS)": "99"}, "outside"),
    ({"PAGESIZE": "4096", "NUMBER(VA_BITS)": "48"}, "kimage_voffset"),
    ({"PAGESIZE": "4096", "NUMBER(VA_BITS)": "48", "NUMBER(kimage_voffset)": "0x1"}, "swapper_pg_dir"),
    ({"PAGESIZE": "4096", "NUMBER(VA_BITS)": "48", "NUMBER(kimage_voffset)": "0x1",
      "SYMBOL(swapper_pg_dir)": "ffff800081000000", "NUMBER(TCR_EL1_T1SZ)": "0x40"}, "outside"),
    ({"PAGESIZE": "4096", "NUMBER(VA_BITS)": "48", "NUMBER(kimage_voffset)": "zz"}, "not a number"),
])
def test_bad_vmcoreinfo_is_one_dump_error(kv, msg):
    with pytest.raises(DumpError, match=msg):
        mm.translator(info(**kv), SparsePhys(), {}.get)


@pytest.mark.parametrize("t1sz,walk_bits", [(0xC, 52), (0x11, 47)])
def test_16k_kernel_from_vmcoreinfo(t1sz, walk_bits):
    """Debian's arm64-16k 6.12 (``CONFIG_ARM64_16K_PAGES``, ``VA_BITS=52``) on LPA2 hardware (T1SZ 12: four
    levels of 11/11/11/5 bits, PA[51:50] in descriptor bits [9:8]) and without it (T1SZ 17: three levels of
    47 bits, [9:8] are SH). VMCOREINFO without ``MODULES_VADDR`` (before 6.3), so the linear map ends at
    ``_PAGE_END(VA_BITS_MIN)``, VA_BITS_MIN being 47 with 16K pages (``asm/memory.h``), not 48."""
    g, page = 14, 1 << 14
    t = tables(g, walk_bits)
    levels = MODES[(g, walk_bits)]
    block = 1 << levels[-2][0]  # 32 MiB at level 2
    text, end = 0xFFFFC00080000000, 0xFFFFC00082600000
    kimage_voffset = 0xFFFFC0003FE00000
    for va in range(text, end, block):
        t.map(va, va - kimage_voffset, len(levels) - 2)
    swapper = text + 0x1D64000
    kimage_voffset = swapper - t.root  # the tables live where tables() put them: the image follows
    vmalloc = 0xFFFFC00090004000
    high = (0x9 << 48) if walk_bits == 52 else 0x7_4000_0000  # a PA above 2^50 only where LPA2 can say it
    t.map(vmalloc, high + 5 * page, len(levels) - 1)
    # arm64_memblock_init(): on 47-bit hardware memstart_addr drops by _PAGE_OFFSET(47) - _PAGE_OFFSET(52)
    page_offset = 0xFFF0000000000000
    phys_offset = (0x40000000 - ((-(1 << walk_bits) & U64) - page_offset)) & U64
    vi = info(PAGESIZE="16384", **{"NUMBER(VA_BITS)": "52", "NUMBER(kimage_voffset)": f"{kimage_voffset:#x}",
                                   "NUMBER(PHYS_OFFSET)": f"{phys_offset:#x}", "NUMBER(TCR_EL1_T1SZ)": f"{t1sz:#x}",
                                   "SYMBOL(swapper_pg_dir)": f"{swapper:x}", "SYMBOL(_stext)": f"{text + 0x10000:x}"})
    x = mm.translator(vi, t.phys, {"_text": text, "_end": end}.get)
    assert (x.page_shift, x.va_bits, x.levels) == (g, walk_bits, len(levels))
    assert x.translate(vmalloc + 0x3FF8) == high + 5 * page + 0x3FF8
    with pytest.raises(NotMapped):
        x.translate(vmalloc + page)
    # the linear map, __lm_to_phys(): [-(1 << walk_bits), PAGE_END = -(1 << 46)), no table needed
    lm_start = -(1 << walk_bits) & U64
    for va in (lm_start + 0x1230, 0xFFFF9000_00004000, 0xFFFFBFFF_FFFFFFF8):
        assert x.translate(va) == (va - page_offset + phys_offset) & U64
    assert x.translate(lm_start) == 0x40000000
    with pytest.raises(NotMapped):
        x.translate(0xFFFFC00000000000)  # MODULES_VADDR: not linear, and no table maps it
    if walk_bits < 52:
        with pytest.raises(NotMapped, match="below the 47-bit"):
            x.translate(page_offset)
