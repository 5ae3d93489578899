"""VirtualMemory over a physical reader: page splits, faults, the cache, snapshots; VMCOREINFO parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from unwind.formats.dump import DumpError
from unwind.core.memory import ExcludedPage, MemoryFault, NotMapped
from unwind.formats.vmcore.virtual import MAX_READ, TableWords, VirtualMemory
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo, parse_vmcoreinfo_note
from tests.vmcore.phys import SparsePhys

PAGE = 4096
BASE = 0xFFFF000000000000


class PageMap:
    """A translator given as a table of virtual page -> physical page, counting its calls."""

    page_shift = 12

    def __init__(self, pages: dict[int, int]) -> None:
        self.pages = pages
        self.calls = 0

    def translate(self, vaddr: int) -> int:
        self.calls += 1
        try:
            return self.pages[vaddr & ~(PAGE - 1)] | (vaddr & (PAGE - 1))
        except KeyError:
            raise NotMapped(vaddr, 1) from None


def memory() -> tuple[VirtualMemory, PageMap, SparsePhys]:
    phys = SparsePhys()
    # three virtually consecutive pages on scattered frames, then a hole, then an excluded frame
    frames = {BASE: 0x5000, BASE + PAGE: 0x2000, BASE + 2 * PAGE: 0x9000, BASE + 4 * PAGE: 0x3000}
    for va, pa in frames.items():
        phys.write(pa, bytes((va // PAGE + i) & 0xFF for i in range(PAGE)))
    phys.excluded.add(0x3)
    pm = PageMap(frames)
    return VirtualMemory(phys, pm), pm, phys


def expected(va: int, n: int) -> bytes:
    return bytes(((a & ~(PAGE - 1)) // PAGE + (a & (PAGE - 1))) & 0xFF for a in range(va, va + n))


def test_a_read_across_pages_joins_their_frames():
    vm, _, _ = memory()
    assert vm.read(BASE + PAGE - 4, 8) == expected(BASE + PAGE - 4, 8)
    assert vm.read(BASE + 10, 2 * PAGE) == expected(BASE + 10, 2 * PAGE)
    assert vm.read_u64(BASE + 2 * PAGE - 3) == int.from_bytes(expected(BASE + 2 * PAGE - 3, 8), "little")
    assert vm.read_u32(BASE + 8) == int.from_bytes(expected(BASE + 8, 4), "little")


def test_each_page_is_translated_once():
    vm, pm, _ = memory()
    for off in range(0, 3 * PAGE, 8):
        vm.read_u64(BASE + off)
    assert pm.calls == 3


def test_unmapped_and_excluded_fault_at_the_virtual_address():
    vm, _, _ = memory()
    with pytest.raises(NotMapped) as e:
        vm.read_u64(BASE + 3 * PAGE + 16)
    assert e.value.addr == BASE + 3 * PAGE + 16
    with pytest.raises(ExcludedPage, match="excluded from the dump") as x:
        vm.read(BASE + 4 * PAGE + 8, 8)
    assert (x.value.addr, x.value.size) == (BASE + 4 * PAGE + 8, 8)
    with pytest.raises(MemoryFault):
        vm.read(BASE + 3 * PAGE - 8, 16)  # half in a mapped page, half in the hole
    assert vm.contains(BASE, 3 * PAGE) and not vm.contains(BASE, 3 * PAGE + 1)


def test_a_frame_outside_the_dump_is_a_memory_fault():
    phys = SparsePhys()
    vm = VirtualMemory(phys, PageMap({BASE: 0x7000}))
    with pytest.raises(MemoryFault) as e:
        vm.read_u64(BASE + 8)
    assert e.value.addr == BASE + 8 and not isinstance(e.value, NotMapped)


@pytest.mark.parametrize("addr,size", [(-8, 8), (BASE, -1), (BASE, MAX_READ + 1), ((1 << 64) - 4, 8)])
def test_impossible_reads_fault_without_translating(addr, size):
    vm, pm, _ = memory()
    with pytest.raises(MemoryFault):
        vm.read(addr, size)
    assert pm.calls == 0


def test_snapshot_is_a_plain_memory_of_what_is_mapped():
    vm, _, _ = memory()
    snap = vm.snapshot([(BASE + 100, BASE + 5 * PAGE), (BASE + 50, BASE + 200)])
    assert [(s.start, s.end) for s in snap.segments] == [(BASE + 50, BASE + 3 * PAGE)]
    assert snap.read(BASE + 50, 3 * PAGE - 50) == expected(BASE + 50, 3 * PAGE - 50)


def test_a_span_in_every_tasks_snapshot_is_read_once():
    """The per-CPU stacks and the modules' ORC tables are in every task's snapshot: each span is read from the
    dump once, and every later snapshot of it holds the same segments (its unmapped and excluded pages left out
    alike); another span, even one overlapping it, is read for itself."""
    vm, _, phys = memory()
    reads: list[int] = []
    read_phys = phys.read_phys
    phys.read_phys = lambda paddr, size: reads.append(paddr) or read_phys(paddr, size)  # type: ignore[method-assign]
    shared = (BASE, BASE + 5 * PAGE)
    first = vm.snapshot([shared])
    n = len(reads)
    assert n and [(s.start, s.end) for s in first.segments] == [(BASE, BASE + 3 * PAGE)]
    again = vm.snapshot([(BASE + 3 * PAGE, BASE + 5 * PAGE), shared])  # merged into the same span
    assert len(reads) == n and again.segments == first.segments
    other = vm.snapshot([(BASE + 8, BASE + PAGE)])
    assert len(reads) > n and other.read(BASE + 8, PAGE - 8) == expected(BASE + 8, PAGE - 8)


def test_table_words_remember_each_entry_read_and_nothing_else():
    """The page-table walks' reader: an 8-byte read is read from the dump once; a read of another size, and a
    read that faults, go to the dump every time."""
    _, _, phys = memory()
    reads: list[tuple[int, int]] = []
    read_phys = phys.read_phys
    phys.read_phys = lambda paddr, size: reads.append((paddr, size)) or read_phys(paddr, size)  # type: ignore[method-assign]
    words = TableWords(phys)
    for _ in range(3):
        assert words.read_phys(0x5008, 8) == read_phys(0x5008, 8)
        assert words.read_phys(0x2000, 16) == read_phys(0x2000, 16)
        with pytest.raises(ExcludedPage):
            words.read_phys(0x3010, 8)
    assert reads == [(0x5008, 8), (0x2000, 16), (0x3010, 8), (0x2000, 16), (0x3010, 8), (0x2000, 16), (0x3010, 8)]


@settings(deadline=None)
@given(st.integers(0, 5 * PAGE), st.integers(0, 3 * PAGE))
def test_reads_equal_the_bytes_or_fault(off, n):
    vm, _, _ = memory()
    va = BASE + off
    try:
        got = vm.read(va, n)
    except MemoryFault:
        assert max(off + n, off + 1) > 3 * PAGE  # it touches the hole (a read of 0 bytes, its page)
    else:
        assert got == expected(va, n)


def test_vmcoreinfo_numbers_in_both_forms():
    vi = VmcoreInfo.parse("OSRELEASE=6.12.0\nNUMBER(phys_base)=-2147483648\nNUMBER(VMALLOC_START)=0xffffc90000000000\n"
                          "SYMBOL(swapper_pg_dir)=ffffffff82a0e000\nKERNELOFFSET=1e000000\nnoequals\n")
    assert vi["OSRELEASE"] == "6.12.0" and "noequals" not in vi
    assert vi.number("NUMBER(phys_base)") == -(1 << 31)
    assert vi.word("NUMBER(phys_base)") == (1 << 64) - (1 << 31)
    assert vi.word("NUMBER(VMALLOC_START)") == 0xFFFFC90000000000
    assert vi.symbol("swapper_pg_dir") == 0xFFFFFFFF82A0E000
    assert vi.hex("KERNELOFFSET") == 0x1E000000
    assert vi.symbol("absent") is None and vi.number("NUMBER(absent)") is None


@pytest.mark.parametrize("text,call", [
    ("SYMBOL(x)=0x\n", lambda v: v.symbol("x")),
    ("SYMBOL(x)=fffffffffffffffff\n", lambda v: v.symbol("x")),
    ("NUMBER(x)=1e9\n", lambda v: v.number("NUMBER(x)")),
    ("NUMBER(x)=" + "9" * 5000 + "\n", lambda v: v.number("NUMBER(x)")),
    ("NUMBER(x)=99999999999999999999\n", lambda v: v.number("NUMBER(x)")),
    ("NUMBER(x)=65\n", lambda v: v.number("NUMBER(x)", lo=0, hi=64)),
    ("A=" + "b" * (1 << 17), lambda v: v),
])
def test_bad_vmcoreinfo_values_are_dump_errors(text, call):
    with pytest.raises(DumpError):
        call(VmcoreInfo.parse(text))


def test_the_kernels_own_note_parses():
    desc = b"OSRELEASE=6.12.0\nPAGESIZE=4096\n"
    note = (11).to_bytes(4, "little") + len(desc).to_bytes(4, "little") + bytes(4) + b"VMCOREINFO\0\0" + desc
    assert parse_vmcoreinfo_note(note + bytes(64))["PAGESIZE"] == "4096"
    with pytest.raises(DumpError):
        parse_vmcoreinfo_note(note[:30])
    with pytest.raises(DumpError):
        parse_vmcoreinfo_note(note.replace(b"VMCOREINFO", b"VMCOREINFX"))


def _fuzzed_translators(phys: SparsePhys) -> list:
    from unwind.arch.arm64.mm import Arm64Translator
    from unwind.arch.riscv.mm import RiscvTranslator
    from unwind.arch.x86_64.mm import X86_64Translator

    return [X86_64Translator(phys, 0, l5=False), X86_64Translator(phys, 0, l5=True),
            Arm64Translator(phys, 0, page_shift=12, va_bits=48), Arm64Translator(phys, 0, page_shift=12, va_bits=52,
                                                                                lpa2=True),
            RiscvTranslator(phys, 0, va_bits=39), RiscvTranslator(phys, 0, va_bits=57)]


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, (1 << 12) - 1), st.integers(0, (1 << 12) - 1)),
                min_size=1, max_size=64),
       st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=16), st.integers(0, 1 << 20))
def test_garbage_page_tables_fault_or_translate_never_raise_otherwise(entries, vaddrs, seed):
    """Eight pages of mostly-garbage tables: every walk ends in an address or a MemoryFault."""
    phys = SparsePhys()
    for pfn in range(8):
        phys.page(pfn * PAGE)
    for i, (pfn, low, high) in enumerate(entries):
        slot = ((seed + 97 * i) % (8 * 512)) * 8
        # the frame of each encoding (x86 bit 12, arm64 bit 12 (4K), riscv bit 10) points into the 8 pages
        value = (high << 52) | (pfn << 12) | (pfn << 10) | low
        phys.write_u64(slot, value & ((1 << 64) - 1))
    for tr in _fuzzed_translators(phys):
        vm = VirtualMemory(phys, tr)
        for va in vaddrs + [v | (0xFFFFFF80 << 32) for v in vaddrs]:  # and as upper-half kernel addresses
            try:
                pa = tr.translate(va)
            except MemoryFault:
                continue
            assert 0 <= pa < 1 << 64
            try:
                vm.read_u64(va)
            except MemoryFault:
                pass
