"""Captured memory and the common.h stack rules."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from unwind.core.memory import ExcludedPage, Memory, MemoryFault, NotMapped, Segment, WordCursor
from unwind.core.stackinfo import Refusal, StackInfo, StackSet


def mem() -> Memory:
    return Memory([Segment(0x1000, bytes(range(16)) * 2), Segment(0x2000, b"\xff" * 8)])


def test_reads_inside_segments():
    m = mem()
    assert m.read_u64(0x1000) == int.from_bytes(bytes(range(8)), "little")
    assert m.read_u64(0x2000) == 2**64 - 1
    assert m.read(0x101E, 2) == bytes([14, 15])


def test_words_are_the_segments_little_endian_words():
    m = Memory([Segment(0x1000, bytes(range(20))), Segment(0x2004, bytes(range(100, 120)))])
    base, words = m.words(0x1008, 8)
    assert base == 0x1000
    assert list(words) == [m.read_u64(0x1000), m.read_u64(0x1008)]  # the 4 bytes past the last word left out
    assert m.words(0x1000, 16)[1] is words  # made once per segment
    base, words = m.words(0x2008, 8)  # a segment not 8-byte aligned: its words from the first aligned address
    assert base == 0x2008 and list(words) == [m.read_u64(0x2008), m.read_u64(0x2010)]
    with pytest.raises(MemoryFault):
        m.words(0x1010, 8)


def _word_at(addr: int) -> int:
    """The word the synthetic segments below hold at each 8-aligned address: its address, marked."""
    return 0xA5 << 56 | addr


def _words_from(start: int, n: int) -> bytes:
    return b"".join(_word_at(a).to_bytes(8, "little") for a in range(start, start + 8 * n, 8))


class _CountingMemory(Memory):
    """Counts the segments asked for as words; ``as_words=False`` plays a host with no word view."""

    def __init__(self, segments: list[Segment], as_words: bool = True, **kw: object) -> None:
        super().__init__(segments, **kw)  # type: ignore[arg-type]
        self.loads = 0
        self.as_words = as_words

    def words(self, addr: int, size: int) -> tuple[int, memoryview] | None:
        self.loads += 1
        got = super().words(addr, size)
        return got if self.as_words else None


#: a segment starting 4 bytes before its first word and ending 4 bytes past its last (0x1ff8), then one
#: 4 bytes above it (its words from 0x2008 to 0x2018, 4 bytes on each side), and one apart (0x3000)
_SEGMENTS = [Segment(0xFFC, b"\xee" * 4 + _words_from(0x1000, 0x200) + b"\xdd" * 4),
             Segment(0x2004, b"\x22" * 4 + _words_from(0x2008, 3) + b"\x11" * 4),
             Segment(0x3000, _words_from(0x3000, 8))]


def _bytes_at(addr: int, size: int) -> bytes | None:
    """The ``size`` bytes at ``addr`` as built above, or None when no one segment holds them."""
    for seg in _SEGMENTS:
        if seg.start <= addr and addr + size <= seg.end:
            return seg.data[addr - seg.start:addr - seg.start + size]
    return None


def test_word_cursor_reads_a_kept_segment_and_loads_on_a_miss():
    m = _CountingMemory(_SEGMENTS)
    c = WordCursor(m)
    assert c.word(0x1010) == _word_at(0x1010) and m.loads == 1
    assert c.pair(0x1100) == (_word_at(0x1100), _word_at(0x1108)) and m.loads == 1  # a hit: no load
    assert c.word(0x1FF0) == _word_at(0x1FF0) and c.pair(0x1FF0) == (_word_at(0x1FF0), _word_at(0x1FF8))
    assert c.word(0x1FF8) == _word_at(0x1FF8) and m.loads == 1  # the segment's last word
    assert c.word(0x3008) == _word_at(0x3008) and m.loads == 2  # a miss: the other segment is kept
    assert c.pair(0x3000) == (_word_at(0x3000), _word_at(0x3008)) and m.loads == 2
    assert c.pair(0x1000) == (_word_at(0x1000), _word_at(0x1008)) and m.loads == 3


def test_word_cursor_reads_unaligned_and_partial_words_through_memory():
    c = WordCursor(Memory(_SEGMENTS))
    assert c.word(0x1010) == _word_at(0x1010)
    # unaligned, in the kept segment: the bytes across two words
    assert c.word(0x1014) == int.from_bytes(_word_at(0x1010).to_bytes(8, "little")[4:]
                                            + _word_at(0x1018).to_bytes(8, "little")[:4], "little")
    assert c.pair(0x1004) == tuple(int.from_bytes(_bytes_at(a, 8), "little") for a in (0x1004, 0x100C))
    # the bytes before the first word and past the last are no word of the view, yet captured
    assert c.word(0xFFC) == int.from_bytes(b"\xee" * 4 + _word_at(0x1000).to_bytes(8, "little")[:4], "little")
    assert c.word(0x1FFC) == int.from_bytes(_word_at(0x1FF8).to_bytes(8, "little")[4:] + b"\xdd" * 4, "little")
    assert c.pair(0x1FF4)[1] == int.from_bytes(_bytes_at(0x1FFC, 8), "little")
    assert c.word(0x2018) == _word_at(0x2018)  # a segment not 8-aligned: its whole words, then its tail
    assert c.word(0x201C) == int.from_bytes(_word_at(0x2018).to_bytes(8, "little")[4:] + b"\x11" * 4, "little")


@pytest.mark.parametrize("addr,size", [(0x1FFC, 8 * 2), (0x1FF8, 8 * 2), (0x2000, 8), (0x2018, 8 * 2),
                                        (0x1FFC + 1, 8), (0x0, 8), (0x3038, 8 * 2), (0x3040, 8)])
def test_word_cursor_faults_where_no_one_segment_holds_the_words(addr, size):
    m = Memory(_SEGMENTS)
    c = WordCursor(m)
    c.word(0x1FF8) if addr < 0x3000 else c.word(0x3038)  # the segment below addr kept
    with pytest.raises(MemoryFault) as e:
        c.word(addr) if size == 8 else c.pair(addr)
    assert (e.value.addr, e.value.size) == (addr, size)
    assert c.word(0x1000) == _word_at(0x1000)  # a fault leaves the cursor usable


#: a segment ending at 2**64: its last words are at addresses whose ``addr + 8`` (``+ 16``) is 2**64 or past it
_TOP = 2**64 - 0x20
_TOP_SEGMENTS = [Segment(0x1000, _words_from(0x1000, 4)), Segment(_TOP, _words_from(_TOP, 4))]


@pytest.mark.parametrize("addr", [-8, -0x1000 + 0x10, -2**64 + 0x1000, 2**64, 2**64 + 0x1000, 2**64 + _TOP, 2**65,
                                  2**64 - 8 + 8 * 2**64, -1])
@pytest.mark.parametrize("kept", [0x1000, _TOP])
def test_word_cursor_faults_outside_the_u64_range(addr, kept):
    # no such address is read as a word of the kept segment (one equal to a captured one mod 2**64 included)
    c = WordCursor(_CountingMemory(_TOP_SEGMENTS))
    c.word(kept)
    for size, read in ((8, c.word), (16, c.pair)):
        with pytest.raises(MemoryFault) as e:
            read(addr)
        assert (e.value.addr, e.value.size) == (addr, size)
    assert c.word(kept + 8) == _word_at(kept + 8) and c.mem.loads == 1 + 2  # each fault asked Memory once


def test_word_cursor_faults_outside_the_u64_range_in_a_hole():
    c = WordCursor(Memory(_SEGMENTS, holes=[(-0x100, 0x100, ExcludedPage), (2**64 - 0x100, 2**64 + 0x100, NotMapped)]))
    with pytest.raises(ExcludedPage):
        c.word(-8)
    with pytest.raises(NotMapped):
        c.pair(2**64)


def test_word_cursor_reads_the_last_words_below_2_64():
    c = WordCursor(_CountingMemory(_TOP_SEGMENTS))
    assert c.word(2**64 - 8) == _word_at(2**64 - 8)  # addr + 8 is 2**64
    assert c.pair(2**64 - 16) == (_word_at(2**64 - 16), _word_at(2**64 - 8)) and c.mem.loads == 1
    for addr, size in ((2**64 - 8, 16), (2**64 - 4, 8), (2**64 - 4, 16)):  # past 2**64, or unaligned over it
        with pytest.raises(MemoryFault) as e:
            c.word(addr) if size == 8 else c.pair(addr)
        assert (e.value.addr, e.value.size) == (addr, size)
    assert c.word(2**64 - 0x1C) == int.from_bytes(_bytes_at_top(2**64 - 0x1C, 8), "little")  # unaligned, inside
    assert c.word(0x1018) == _word_at(0x1018) and c.word(2**64 - 0x20) == _word_at(2**64 - 0x20)


def _bytes_at_top(addr: int, size: int) -> bytes:
    seg = _TOP_SEGMENTS[1]
    return seg.data[addr - seg.start:addr - seg.start + size]


def test_word_cursor_straddling_two_adjacent_segments_faults():
    m = Memory([Segment(0x1000, _words_from(0x1000, 2)), Segment(0x1010, _words_from(0x1010, 2))])
    c = WordCursor(m)
    assert c.pair(0x1000) == (_word_at(0x1000), _word_at(0x1008))
    assert c.word(0x1008) == _word_at(0x1008) and c.word(0x1010) == _word_at(0x1010)
    with pytest.raises(MemoryFault):
        c.pair(0x1008)  # one word in each segment: not a record captured in one segment


def test_word_cursor_raises_a_holes_fault():
    c = WordCursor(Memory(_SEGMENTS, holes=[(0x5000, 0x6000, ExcludedPage)]))
    with pytest.raises(ExcludedPage):
        c.pair(0x5008)
    with pytest.raises(ExcludedPage):
        c.word(0x5ff8)


def test_word_cursor_without_a_word_view_reads_through_memory():
    m = _CountingMemory(_SEGMENTS, as_words=False)
    c = WordCursor(m)
    assert c.word(0x1010) == _word_at(0x1010) and c.pair(0x3000) == (_word_at(0x3000), _word_at(0x3008))
    with pytest.raises(MemoryFault):
        c.pair(0x1FF8)


@given(st.lists(st.tuples(st.integers(0xFF0, 0x3050), st.booleans()), max_size=30))
def test_word_cursor_reads_what_the_segments_hold(reads):
    c = WordCursor(Memory(_SEGMENTS))
    for addr, two in reads:
        size = 16 if two else 8
        want = _bytes_at(addr, size)
        if want is None:
            with pytest.raises(MemoryFault):
                c.pair(addr) if two else c.word(addr)
        else:
            got = c.pair(addr) if two else (c.word(addr),)
            assert got == tuple(int.from_bytes(want[k:k + 8], "little") for k in range(0, size, 8))


@pytest.mark.parametrize("addr,size", [(0xFFF, 8), (0x101C, 8), (0x1020, 1), (0x2001, 8), (0x1800, 8), (0, 8)])
def test_reads_outside_fault_with_address_and_size(addr, size):
    with pytest.raises(MemoryFault) as e:
        mem().read(addr, size) if size != 8 else mem().read_u64(addr)
    assert e.value.addr == addr and e.value.size == size


def test_no_read_spans_two_segments():
    m = Memory([Segment(0x1000, b"a" * 8), Segment(0x1008, b"b" * 8)])
    assert m.read(0x1000, 8) == b"a" * 8
    with pytest.raises(MemoryFault):
        m.read_u64(0x1004)


def test_overlapping_segments_are_refused():
    with pytest.raises(ValueError):
        Memory([Segment(0x1000, b"a" * 16), Segment(0x1008, b"b" * 16)])


@given(st.integers(0, 0x3000), st.integers(1, 64))
def test_reads_never_leave_a_segment(addr, size):
    m = mem()
    inside = any(s.start <= addr and addr + size <= s.end for s in m.segments)
    try:
        data = m.read(addr, size)
    except MemoryFault:
        assert not inside
    else:
        assert inside and len(data) == size


def test_on_stack_rules():
    s = StackInfo(0x1000, 0x2000, "task")
    assert s.on_stack(0x1000, 16) and s.on_stack(0x1FF0, 16)
    assert not s.on_stack(0x1FF8, 16) and not s.on_stack(0xFF8, 16)
    assert not StackInfo(0, 0x2000, "unknown").on_stack(0x10, 8)
    assert not s.on_stack(2**64 - 8, 16)


def test_consume_raises_low_and_transitions_are_one_way():
    ss = StackSet([StackInfo(0x1000, 0x2000, "task"), StackInfo(0x8000, 0x9000, "irq", 0)])
    irq = ss.find(0x8100, 16)
    assert irq is not None and irq.kind == "irq"
    assert ss.consume(irq, 0x8100, 16) is None          # from no stack at all
    assert ss.stack.low == 0x8110
    assert ss.find(0x8100, 16) is None                   # below what was consumed
    assert ss.why_not(0x8100, 16) is Refusal.BELOW_CONSUMED
    task = ss.find(0x1100, 16)
    assert task is not None and ss.consume(task, 0x1100, 16) == "irq@cpu0"
    assert ss.find(0x8800, 16) is None                   # the IRQ stack is gone for good
    assert ss.why_not(0x8800, 16) is Refusal.LEFT_BEHIND
    assert ss.why_not(0x5000, 16) is Refusal.OUTSIDE
    assert ss.kind_of(0x8800).kind == "irq"              # labels still know it


def test_stackset_copies_its_input():
    orig = StackInfo(0x1000, 0x2000, "task")
    ss = StackSet([orig])
    ss.consume(ss.find(0x1100, 16), 0x1100, 16)
    assert orig.low == 0x1000


def test_stackset_transitions_leave_its_input_alone():
    """The stacks a walk moves to and leaves are the caller's objects, found in place: none is changed, and a
    second walk over the same list finds them all again."""
    given = [StackInfo(0x1000, 0x2000, "task"), StackInfo(0x8000, 0x9000, "irq", 0)]
    for _ in range(2):
        ss = StackSet(given)
        ss.consume(ss.find(0x8100, 16), 0x8100, 16)
        ss.consume(ss.find(0x1100, 16), 0x1100, 16)
        assert ss.find(0x8800, 16) is None and ss.stack.kind == "task"
        assert [(s.low, s.high) for s in given] == [(0x1000, 0x2000), (0x8000, 0x9000)]


@given(st.lists(st.integers(0, 0x3FF), min_size=1, max_size=200))
def test_any_record_sequence_terminates(offsets):
    """Each consume raises low strictly, so no address is accepted twice."""
    ss = StackSet([StackInfo(0x1000, 0x1000 + 0x400 * 8, "task")])
    seen = set()
    for off in offsets:
        sp = 0x1000 + off * 8
        info = ss.find(sp, 16)
        if info is None:
            continue
        assert sp not in seen
        seen.add(sp)
        ss.consume(info, sp, 16)


def test_memory_table_is_its_segments() -> None:
    mem = Memory([Segment(0x2000, b"\1" * 24), Segment(0x1000, b"\2" * 8), Segment(0x3000, b"")])
    assert (list(mem.table[0::3]), list(mem.table[1::3])) == ([0x1000, 0x2000], [0x1008, 0x2018])


def test_an_arena_segment_holds_its_bytes_read_only_at_a_word_aligned_place() -> None:
    """A segment made by a SegmentArena has the bytes given, as a read-only view of its chunk at an offset congruent
    to its start modulo 8; segments fill a chunk in order and a new chunk is taken when one is full; a segment
    larger than a quarter of a chunk keeps its own bytes (by construction: known bytes at every alignment)."""
    from unwind.core.memory import SegmentArena

    arena = SegmentArena(chunk_bytes=256)
    made = [arena.segment(0x1000 + 64 * k + k % 8, bytes([k]) * (20 + k)) for k in range(12)]
    for k, seg in enumerate(made):
        assert bytes(seg.data) == bytes([k]) * (20 + k) and seg.start == 0x1000 + 64 * k + k % 8
        assert seg.at % 8 == seg.start % 8
        assert bytes(seg.chunk[seg.at:seg.at + len(seg.data)]) == bytes(seg.data)
        with pytest.raises(TypeError):
            seg.data[0] = 1  # type: ignore[index]
    chunks = [seg.chunk for seg in made]
    assert chunks[0] is chunks[1] and chunks[-1] is not chunks[0]  # a second chunk once the first was full
    for a, b in zip(made, made[1:]):  # in one chunk, in order and apart
        if a.chunk is b.chunk:
            assert a.at + len(a.data) <= b.at
    big = arena.segment(0x5000, bytes(65))
    assert big.chunk is None and bytes(big.data) == bytes(65)


def test_a_memory_of_arena_segments_names_their_chunk_only_when_all_share_one() -> None:
    """``Memory.chunk`` is the chunk every segment is in (and its ``table`` where each begins), ``None`` when they are
    in several or any keeps its own bytes; reads give bytes either way."""
    from unwind.core.memory import SegmentArena

    arena = SegmentArena(chunk_bytes=64)
    one = [arena.segment(0x1000, bytes(range(8))), arena.segment(0x2003, bytes(range(8, 16)))]
    m = Memory(one)
    assert m.chunk is one[0].chunk and list(m.table) == [0x1000, 0x1008, one[0].at, 0x2003, 0x200b, one[1].at]
    assert m.read(0x2003, 4) == bytes(range(8, 12)) and type(m.read(0x1000, 8)) is bytes
    assert m.read_u64(0x1000) == int.from_bytes(bytes(range(8)), "little")
    other = arena.segment(0x3000, bytes(range(16, 48)))  # too large for what is left of the chunk: a new one
    assert other.chunk is not one[0].chunk
    assert Memory(one + [other]).chunk is None
    assert Memory(one + [Segment(0x4000, bytes(8))]).chunk is None
    assert Memory([]).chunk is None


def test_a_dumps_segments_are_read_into_the_arena() -> None:
    """A dump read from a file has its segments in one chunk of the shared arena, holding the bytes of the file's
    PT_LOAD segments as pyelftools reads them."""
    import io
    import lzma
    from pathlib import Path

    from elftools.elf.elffile import ELFFile

    from unwind.formats.dump import Dump

    path = sorted((Path(__file__).resolve().parents[2] / "corpora" / "riscv").glob("*/stop-*.bin.xz"))[0]
    memory = Dump.open(path).memory
    elf = ELFFile(io.BytesIO(lzma.decompress(path.read_bytes())))
    loads = {s["p_vaddr"]: s.data() for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_filesz"]}
    assert memory.chunk is not None and len(memory.segments) == len(loads)
    for seg, at in zip(memory.segments, memory.table[2::3]):
        assert seg.chunk is memory.chunk and at % 8 == seg.start % 8
        assert bytes(memory.chunk[at:at + len(seg.data)]) == loads[seg.start]


def test_an_arena_chunk_is_private_to_a_process_forked_after_it() -> None:
    """A process forked after the arena took a chunk fills its own copy of it: what the child reads in never shows
    in the parent's chunk (a worker of a fleet triage reads its dumps while the parent keeps its own)."""
    import os

    from unwind.core.memory import SegmentArena

    arena = SegmentArena(chunk_bytes=4096)
    first = arena.segment(0x1000, bytes(range(64)))
    pid = os.fork()
    if pid == 0:  # the child: its next segment goes right after the first, where the parent's would
        arena.segment(0x2000, b"\xaa" * 64)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    after = first.at + len(first.data)
    assert bytes(first.chunk[after:after + 64]) == bytes(64)
    assert bytes(first.data) == bytes(range(64))


@pytest.mark.parametrize("keep", [False, True], ids=["nothing-left", "one-view-left"])
def test_a_full_arena_chunk_is_filled_again_once_nothing_refers_to_its_bytes(keep: bool) -> None:
    """A full chunk is kept and filled again once no segment, memory or view of its bytes is left; a chunk whose
    bytes something still refers to (one segment's data alone) is not, and keeps what it holds."""
    import gc

    from unwind.core.memory import SegmentArena

    arena = SegmentArena(chunk_bytes=256)
    first = [arena.segment(0x1000 + 64 * k, bytes([k]) * 60) for k in range(4)]  # fills the first chunk
    chunk_one = first[0].chunk.obj
    kept = first[2].data if keep else None
    del first
    gc.collect()
    second = [arena.segment(0x2000 + 64 * k, bytes([9]) * 60) for k in range(4)]  # the first chunk is full
    assert (second[0].chunk.obj is chunk_one) is not keep
    for seg in second:
        assert bytes(seg.data) == bytes([9]) * 60 and seg.at % 8 == seg.start % 8
    if kept is not None:
        assert bytes(kept) == bytes([2]) * 60
