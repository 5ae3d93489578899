"""x86-64 translation on page tables built by construction (4- and 5-level, 4K/2M/1G pages)."""

from __future__ import annotations

import pytest

from unwind.arch.x86_64 import mm
from unwind.formats.dump import DumpError
from unwind.core.memory import NotMapped
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from tests.vmcore.phys import RadixTables, SparsePhys

# Entry bits as the SDM numbers them: P 0, RW 1, A 5, D 6, PS 7, PAT(large) 12, NX 63
P, RW, A, D, PS, PAT_LARGE, NX = 1, 2, 1 << 5, 1 << 6, 1 << 7, 1 << 12, 1 << 63
LEVELS_4 = [(39, 9), (30, 9), (21, 9), (12, 9)]
LEVELS_5 = [(48, 9)] + LEVELS_4
KTEXT = 0xFFFFFFFF80000000


def tables(l5: bool, sme: int = 0) -> RadixTables:
    levels = LEVELS_5 if l5 else LEVELS_4
    last = len(levels) - 1

    def leaf(pa: int, lvl: int) -> int:
        huge = PS | PAT_LARGE if lvl < last else 0  # PAT set on purpose: it is not an address bit
        return pa | sme | P | RW | A | D | NX | huge

    return RadixTables(SparsePhys(), levels, lambda pa: pa | sme | P | RW | A | D, leaf)


def walker(t: RadixTables, l5: bool, sme: int = 0) -> mm.X86_64Translator:
    return mm.X86_64Translator(t.phys, t.root, l5=l5, sme_mask=sme)


@pytest.mark.parametrize("l5", [False, True])
def test_pages_of_each_size(l5):
    t = tables(l5)
    top = 1 if l5 else 0
    va4k, va2m, va1g = 0xFFFFC90000003000, 0xFFFFFFFF81000000, 0xFFFF888040000000
    if l5:
        va4k, va1g = 0xFFA0000000003000, 0xFF11000040000000
    t.map(va4k, 0x7000, top + 3)
    t.map(va2m, 0x1E00000, top + 2)
    t.map(va1g, 0x80000000, top + 1)
    x = walker(t, l5)
    assert x.translate(va4k + 0x123) == 0x7123
    assert x.translate(va2m + 0x1FFFF8) == 0x1E00000 + 0x1FFFF8
    assert x.translate(va1g + 0x3FFFFFFF) == 0x80000000 + 0x3FFFFFFF
    for hole in (va4k + 0x1000, va2m + 0x200000, va1g + 0x40000000):
        with pytest.raises(NotMapped):
            x.translate(hole)


def test_sme_mask_is_not_an_address_bit():
    sme = 1 << 47
    t = tables(False, sme)
    t.map(0xFFFFC90000005000, 0x9000, 3)
    assert walker(t, False, sme).translate(0xFFFFC90000005008) == 0x9008


@pytest.mark.parametrize("l5,addr", [(False, 0x0000800000000000), (False, 0xFFFF7FFFFFFFF000),
                                     (True, 0x0100000000000000), (True, 0xFEFFFFFFFFFFF000)])
def test_non_canonical_addresses_are_not_mapped(l5, addr):
    with pytest.raises(NotMapped, match="canonical"):
        walker(tables(l5), l5).translate(addr)


def test_a_walk_through_remembered_table_words_translates_alike_and_reads_each_entry_once():
    """``TableWords`` (how a vmcore's translator reads its tables): the same answers and faults as the dump's own
    reader, each table entry read from the dump once over many translations."""
    from unwind.formats.vmcore.virtual import TableWords

    t = tables(False)
    base = 0xFFFFC90000000000
    for i in range(8):
        t.map(base + i * 0x1000, 0x10000 + i * 0x1000, 3)
    reads: list[int] = []
    read_phys = t.phys.read_phys
    t.phys.read_phys = lambda paddr, size: reads.append(paddr) or read_phys(paddr, size)
    plain, remembered = walker(t, False), mm.X86_64Translator(TableWords(t.phys), t.root, l5=False)
    for _ in range(2):
        for i in range(9):
            va = base + i * 0x1000 + 0x18
            if i < 8:
                assert remembered.translate(va) == plain.translate(va) == 0x10000 + i * 0x1000 + 0x18
            else:
                for x in (plain, remembered):
                    with pytest.raises(NotMapped):
                        x.translate(va)
    walks = len(reads)
    reads.clear()
    for i in range(9):
        try:
            remembered.translate(base + i * 0x1000)
        except NotMapped:
            pass
    assert reads == [] and walks > 0  # every entry was read before


def test_a_missing_table_page_is_not_mapped():
    t = tables(False)
    t.map(0xFFFFC90000003000, 0x7000, 3)
    pte_table = t.phys.read_phys(t.root + 8 * ((0xFFFFC90000003000 >> 39) & 511), 8)
    del t.phys.pages[(int.from_bytes(pte_table, "little") & 0xFFFFFFFFFF000) // 4096]
    with pytest.raises(NotMapped, match="not in the dump"):
        walker(t, False).translate(0xFFFFC90000003000)


def info(**numbers: str) -> VmcoreInfo:
    return VmcoreInfo.parse("".join(f"{k}={v}\n" for k, v in numbers.items()))


@pytest.mark.parametrize("phys_base", [0x2000000, -0x1000000])  # a KASLR kernel may load below 16 MiB
def test_translator_from_vmcoreinfo_and_symbols(phys_base):
    # the kernel's layout: image near 16 MiB physical and a KASLR slide of 0x1f000000
    t = tables(False)
    text, end = 0xFFFFFFFF9F000000, 0xFFFFFFFF9F400000
    for off in range(0, end - text, 1 << 21):
        t.map(text + off, text + off - KTEXT + phys_base, 2)
    pgd_va = text + 0x200000  # init_top_pgt inside the image; its page holds the tree's root
    t.phys.pages[(pgd_va - KTEXT + phys_base) // 4096] = t.phys.pages[t.root // 4096]
    vars_va = text + 0x300000
    page_offset_base, vmalloc_base = 0xFFFF9A0000000000, 0xFFFFB00000000000
    t.phys.write_u64(vars_va - KTEXT + phys_base, page_offset_base)
    t.phys.write_u64(vars_va + 8 - KTEXT + phys_base, vmalloc_base)
    syms = {"_text": text, "_end": end, "page_offset_base": vars_va, "vmalloc_base": vars_va + 8}
    x = mm.translator(info(**{"NUMBER(phys_base)": str(phys_base), "SYMBOL(init_top_pgt)": f"{pgd_va:x}"}),
                      t.phys, syms.get)
    assert x.translate(text + 0x1234) == text + 0x1234 - KTEXT + phys_base
    assert x.translate(page_offset_base + 0x5000) == 0x5000  # the direct map, without a table for it
    with pytest.raises(NotMapped):
        x.translate(vmalloc_base + 0x1000)  # past the direct map the walk answers
    # without the symbols the walk gives the same image translation
    bare = mm.translator(info(**{"NUMBER(phys_base)": str(phys_base), "SYMBOL(init_top_pgt)": f"{pgd_va:x}"}),
                         t.phys, {}.get)
    assert bare.linear == ()
    assert bare.translate(text + 0x1234) == x.translate(text + 0x1234)


@pytest.mark.parametrize("lines,msg", [
    ({}, "phys_base"),
    ({"NUMBER(phys_base)": "0"}, "init_top_pgt"),
    ({"NUMBER(phys_base)": "12zz", "SYMBOL(init_top_pgt)": "ffffffff82000000"}, "not a number"),
    ({"NUMBER(phys_base)": "9" * 40, "SYMBOL(init_top_pgt)": "ffffffff82000000"}, "not a number"),
    ({"NUMBER(phys_base)": "0", "SYMBOL(init_top_pgt)": "1" * 17}, "hex"),
    ({"NUMBER(phys_base)": "0", "SYMBOL(init_top_pgt)": "1000"}, "kernel image"),
    ({"NUMBER(phys_base)": "0", "SYMBOL(init_top_pgt)": "ffffffff82000000", "NUMBER(pgtable_l5_enabled)": "7"},
     "outside"),
])
def test_bad_vmcoreinfo_is_one_dump_error(lines, msg):
    with pytest.raises(DumpError, match=msg):
        mm.translator(info(**lines), SparsePhys(), {}.get)
