"""A replay leaves nothing for the cyclic garbage collector.

A walk whose objects point back at each other (a bound method kept on the unwinder, a kept exception
whose traceback holds the frame naming it) is freed only by a collection, and every such walk makes the
collections come sooner; each full one then visits every object of the process. So every replay of every
committed corpus dump and vmcore slice, in each mode, must free all it made by reference counting alone: the expected
answer, no garbage, is known by construction. (The first replay of a dump with some options works out
the dump's constants, once, and a vmcore's module ORC tables as walks reach them; a construct parse there
may leave a few cycles, which this does not count.)
"""

from __future__ import annotations

import collections
import gc
from pathlib import Path

import pytest

from unwind.session.replay import Session, load_session
from unwind.core.target import Options

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
MODES = {
    "plain": (Options(), {"symbolize": False}),
    "symbolized": (Options(), {}),
    "record": (Options(record=True), {}),
    "complete": (Options(complete=True, record=True), {}),
    "reliable": (Options(), {"reliable": True}),
}


def _vmcores() -> list[Session]:
    """The committed vmcores (slices and the x86 kdump capture), each with its slim image."""
    return [load_session(xz, vmlinux=next(xz.parents[1].glob("vmlinux-*.slim.xz")))
            for xz in sorted(CORPORA.glob("*/*/vmcore/*.elf.xz"))]


@pytest.mark.parametrize("which", ["arm64", "riscv", "x86_64", "vmcores"])
def test_no_replay_leaves_a_reference_cycle(which: str) -> None:
    sessions = _vmcores() if which == "vmcores" else \
        [load_session(p) for p in sorted(CORPORA.glob(f"{which}/*/stop-*.bin.xz"))]
    assert sessions
    for s in sessions:  # each dump's constants, per options (a vmcore's module ORC tables: every task once)
        for options, kw in MODES.values():
            for task in s.select(every=True)[:None if which == "vmcores" else 1]:
                s.replay(task, options, **kw)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for s in sessions:  # every task's first replay (its memory and frame limit kept) and a second one
            for options, kw in (*MODES.values(), *MODES.values()):
                for task in s.select(every=True):
                    s.replay(task, options, **kw)
        gc.collect()
        garbage = collections.Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not garbage, garbage.most_common(8)
