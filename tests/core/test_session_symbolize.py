"""Session.symbolize keeps each (pc, source)'s text: the same text as asking the backend frame by frame."""

from __future__ import annotations

from pathlib import Path

from unwind.core.frame import Frame, Source
from unwind.kernel.symbols import SymbolTable
from unwind.session.replay import Options, load_session

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "corpora/x86_64/6.12.117+deb13-amd64"


def test_symbols_are_the_backends_answer_for_every_frame():
    session = load_session(next(X86.glob("stop-*.bin.xz")))
    for task in session.select(every=True):
        r = session.replay(task, Options())
        for f in r.frames:
            assert f.symbol == session.backend.symbolize(f, r.target)


def test_one_pc_is_named_by_its_source():
    session = load_session(next(X86.glob("stop-*.bin.xz")))
    target = session.target(session.select(every=True)[0], Options())
    start = session.symbols.address("schedule")
    # at a function's first byte %pS (registers) names the function, %pB (a return address) the one before it
    regs, ret = Frame(start, source=Source.REGS_PC), Frame(start, source=Source.FRAME)
    session.symbolize([regs, ret], target)
    before = session.symbols.lookup(start - 1)
    assert regs.symbol.startswith("schedule+0x0/")
    assert ret.symbol == f"{before.name}+{before.offset + 1:#x}/{before.size:#x}" != regs.symbol


def test_another_symbol_table_is_asked_again():
    session = load_session(next(X86.glob("stop-*.bin.xz")))
    task = session.select(every=True)[0]
    first = session.replay(task, Options()).frames[0]
    pc = first.pc
    session.symbols = SymbolTable([(pc - 0x10, "T", "renamed_for_the_test"), (pc + 0x100, "T", "next_one")])
    again = session.replay(task, Options()).frames[0]
    assert again.pc == pc and again.symbol.startswith("renamed_for_the_test+")
