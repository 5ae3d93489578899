"""The library as the README shows it: Session.unwinder for kunwind_stack_walk, symbolised
frames from every adapter, Frame printing/comparing/serialising like drgn's StackFrame, flag letters,
and one complete-mode marker spelling on every arch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from unwind import Flag, Frame, Options, Session, iter_frames, kunwind_stack_walk, stack_walk
from unwind.session.output import trace_lines

ROOT = Path(__file__).resolve().parents[2]
DUMPS = {arch: next((ROOT / "corpora" / arch).glob("*/stop-002-*.bin.xz")) for arch in ("arm64", "x86_64", "riscv")}


@pytest.mark.parametrize("arch", sorted(DUMPS))
def test_session_unwinder_drives_the_kernel_walk_with_symbols(arch):
    s = Session.load(DUMPS[arch])
    task = s.select()[0]
    want = s.replay(task)
    got: list[Frame] = []
    stop = kunwind_stack_walk(s.unwinder(task), lambda f: got.append(f) is None)
    assert [f.pc for f in got] == [f.pc for f in want.frames] and stop.reason is want.stop.reason
    assert [f.symbol for f in got] == [f.symbol for f in want.frames] and all(f.symbol for f in got)
    assert [f.symbol for f in iter_frames(s.unwinder(task))] == [f.symbol for f in got]
    pcs: list[int] = []
    stack_walk(s.unwinder(task), lambda pc: pcs.append(pc) is None)
    assert pcs == [f.pc for f in got]


def test_frame_prints_compares_and_serialises():
    s = Session.load(DUMPS["arm64"])
    task = s.select()[0]
    a = list(iter_frames(s.unwinder(task)))
    b = list(iter_frames(s.unwinder(task)))
    assert a == b and a[0] is not b[0]                       # by value, like two walks of one state
    f = a[1]
    assert str(f).startswith(f"{f.pc:#x} ({f.symbol}) [{f.source.value}]")
    assert f.name == f.symbol.split("+")[0] and a[0].interrupted and not f.interrupted
    d = f.to_json()
    assert d["pc"] == hex(f.pc) and d["symbol"] == f.symbol and d["flags"] == f.flags.names()
    assert Frame(0x1234).name is None and str(Frame(0x1234)) == "0x1234 [unknown]"


def test_flag_letters_are_letters():
    flags = Flag.PAC_STRIPPED | Flag.FGRAPH | Flag.COMPLETE | Flag.CALLSITE_OK
    assert flags.letters() == "PFCc"
    assert flags.names() == ["pac-stripped", "fgraph", "complete", "call-ok"]
    assert Flag.NONE.letters() == "" and Flag.NONE.names() == []


@pytest.mark.parametrize("arch", ["arm64", "riscv"])
def test_complete_mode_marker_is_spelled_once(arch):
    """Every line of a frame only complete mode adds ends in ` [complete: why]`, on every arch."""
    seen = 0
    for dump in sorted((ROOT / "corpora" / arch).glob("*/stop-*.bin.xz")):
        s = Session.load(dump)
        for task in s.select():
            r = s.replay(task, Options(complete=True))
            for line in trace_lines(s, r):
                if line.frame is not None and line.frame.flags & Flag.COMPLETE:
                    assert re.search(r" \[complete(: [^\]]+)?\]$", line.text), line.text
                    seen += 1
                assert "(complete" not in line.text
    assert seen
