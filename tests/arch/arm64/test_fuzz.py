"""Arbitrary stack contents: every walk ends with a stop (never an exception), within the stack's size."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from unwind import Options
from unwind.arch.arm64 import synth as S
from unwind.core.walk import collect

LOW, SIZE = S.TASK_LOW, 0x400

word = st.one_of(st.integers(0, 2**64 - 1),
                 st.integers(LOW - 0x20, LOW + SIZE + 0x20),          # near and on the stack
                 st.sampled_from([0, S.RETURN_TO_HANDLER, S.KRETPROBE_TRAMPOLINE, 1, 2]),
                 st.integers(0, 0xFFF).map(lambda pac: S.sign(S.ret(3), pac)))


@settings(max_examples=40, deadline=None)
@given(words=st.lists(word, min_size=SIZE // 8, max_size=SIZE // 8), fp=st.integers(LOW - 0x10, LOW + SIZE),
       generation=st.sampled_from(["6.12", "6.13"]), complete=st.booleans(), record=st.booleans())
def test_any_stack_terminates_with_a_stop(words, fp, generation, complete, record):
    a = S.Arm64Synth(generation)
    stack = a.sd.stack("task", LOW, SIZE, pid=7)
    stack.put_bytes(LOW, struct.pack(f"<{len(words)}Q", *words))
    a.blocked(7, "fuzz", fp=fp, pc=S.ret(1), sp=LOW, fgraph=[{"ret": S.ret(5), "retp": LOW + 0x100, "func": 0}],
              kretprobes=[{"ret": S.ret(6), "fp": LOW + 0x200}])
    s = a.session(S.FUNCS, with_text=True)
    frames, stop = collect(s.backend.unwinder(s.target(s.select(pid=7)[0], Options(complete=complete, record=record))))
    assert frames and stop.reason is not None
    assert len(frames) <= SIZE // 16 + 2  # each record consumes 16 bytes of a 1 KiB stack


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.one_of(st.integers(0, 2**32 - 1),
                                st.sampled_from([S.NOP, S.PACIASP, S.STP_FP_LR_PRE16, S.MOV_FP_SP, S.RET, S.BR_X16,
                                                 S.LDP_FP_LR_POST16, S.AUTIASP, S.ADD_X0_X0_1])),
                      min_size=64, max_size=64),
       off=st.integers(0, 63).map(lambda i: 4 * i))
def test_any_text_gives_a_verdict(words, off):
    """The live-LR proof on arbitrary instruction words: a verdict with a reason, never an exception."""
    from unwind.arch.arm64.complete import LrAnalyser
    from unwind.core.memory import Memory
    from unwind.kernel.symbols import SymbolTable
    from unwind.core.target import Target, Task

    image = S.SynthImage()
    image.put(S.fn(0), words)
    symbols = SymbolTable([(S.fn(0), "T", "f"), (S.fn(1), "T", "g")])
    proof = LrAnalyser(Target("arm64", Memory([]), Task(1, "x"), symbols=symbols, image=image)).prove(S.fn(0) + off)  # type: ignore[arg-type]
    assert proof.reason
