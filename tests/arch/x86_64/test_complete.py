"""Complete mode past a function without ORC, on synthetic text whose calls are known by construction.

The function holding ``ip`` (``nonstd``) is covered by one ORC_TYPE_UNDEFINED entry, as objtool leaves a
``STACK_FRAME_NON_STANDARD`` function. Its caller called it through its ``__pfx_`` padding (the call-depth
thunks of CONFIG_CALL_DEPTH_TRACKING land there and fall through into the function). The stack holds,
above ``sp``, decoys first and then the one return address whose ``call rel32`` is that call.
"""

from __future__ import annotations

from unwind import Options, StopReason
from unwind.arch.x86_64.synth import END_OF_STACK, TEXT, UNDEFINED, OrcBuilder, call, session
from unwind.core.frame import Flag, Source
from unwind.dev.synth import SynthDump
from unwind.core.walk import collect

TASK_LO, STACK = 0xFFFFC90000010000, 0x4000
TSP = TASK_LO + 0x3000


def kernel() -> OrcBuilder:
    """``caller`` -> ``__pfx_nonstd`` (16 bytes of padding) -> ``nonstd`` (no ORC); a stray ``__pfx_nonstd``
    symbol elsewhere, and ``other`` with its own padding."""
    b = OrcBuilder()
    b.func("__pfx_other", 0x10)
    b.func("other", 0x40, (0, call(8)))
    b.func("__pfx_nonstd", 0x10)
    b.func("nonstd", 0x80, (0, UNDEFINED))
    b.func("caller", 0x80, (0, call(8)))
    b.func("kthread", 0x100, (0, call(8)))
    b.func("ret_from_fork_asm", 0x20, (0, END_OF_STACK))
    b.func("__pfx_nonstd", 0x10)  # same name, not next to nonstd: not its padding
    return b


def replay(b: OrcBuilder, above_sp: list[int], complete: bool):
    """A task blocked in ``nonstd+0x10``; ``above_sp`` are the words from its sp up."""
    sd = SynthDump("x86_64", "6.12.0-synthetic")
    st = sd.stack("task", TASK_LO, STACK, pid=7)
    st.put(TSP, 0, 0, 0, 0, 0, 0xB0B0, b.addr["nonstd"] + 0x10)  # inactive_task_frame, ret_addr last
    st.put(TSP + 56, *above_sp)
    sd.blocked_task(7, "worker", {"sp": TSP})
    s = session(sd, b.image())
    return collect(s.backend.unwinder(s.target(s.select(pid=7)[0], Options(complete=complete))))


def test_the_caller_of_a_function_without_orc_is_the_return_from_its_padding():
    b = kernel()
    a = b.addr
    pad, stray = sorted(addr for addr, name in b.syms if name == "__pfx_nonstd")
    assert pad + 0x10 == a["nonstd"]
    decoy_other = b.call_rel32(a["caller"] + 0x10, a["__pfx_other"])  # a call to another function's pad
    decoy_stray = b.call_rel32(a["caller"] + 0x20, stray)  # a "__pfx_nonstd" not ending where nonstd starts
    ret = b.call_rel32(a["caller"] + 0x30, pad)
    words = [0x1234, decoy_other, decoy_stray, ret, a["kthread"] + 0x30, a["ret_from_fork_asm"] + 8]
    frames, stop = replay(b, words, complete=True)
    assert [f.pc for f in frames] == [a["nonstd"] + 0x10, ret, a["kthread"] + 0x30, a["ret_from_fork_asm"] + 8]
    proven = frames[1]
    assert proven.sp == TSP + 56 + 4 * 8 and proven.fp == 0xB0B0  # the slot above ret; bp unchanged
    assert proven.source is Source.CALLER and proven.flags & Flag.COMPLETE and proven.flags & Flag.UNRELIABLE
    assert not any(f.flags & Flag.COMPLETE for f in frames[2:])
    assert stop.reason is StopReason.END_OF_STACK


def test_faithful_mode_stops_at_the_function_without_orc():
    b = kernel()
    a = b.addr
    ret = b.call_rel32(a["caller"] + 0x30, a["nonstd"] - 0x10)
    frames, stop = replay(b, [ret, a["kthread"] + 0x30, a["ret_from_fork_asm"] + 8], complete=False)
    assert [f.pc for f in frames] == [a["nonstd"] + 0x10]
    assert stop.reason is not StopReason.END_OF_STACK and "--complete" in stop.detail


def test_no_call_to_the_function_or_its_own_padding_means_no_caller():
    b = kernel()
    a = b.addr
    stray = max(addr for addr, name in b.syms if name == "__pfx_nonstd")
    words = [b.call_rel32(a["caller"] + 0x10, a["__pfx_other"]), b.call_rel32(a["caller"] + 0x20, stray),
             b.call_rel32(a["caller"] + 0x30, a["other"]), TEXT + 0x10]
    frames, stop = replay(b, words, complete=True)
    assert [f.pc for f in frames] == [a["nonstd"] + 0x10]
    assert "no return address above sp follows a call" in stop.detail
