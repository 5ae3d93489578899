"""Captured memory and the common.h stack rules."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from unwind.core.memory import Memory, MemoryFault, Segment
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
