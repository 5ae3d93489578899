"""Real riscv 6.12 captures stopped by a breakpoint on ``do_trap_ecall_u``'s first instruction.

A system call enters ``handle_exception``, which calls the handler with ``ra`` in the entry code and ``s0``
still as user mode left it (the handler's prologue sets it). ``walk_stackframe(task, regs)`` prints
``regs->epc``, then ``fp_is_valid(s0, sp)`` fails on that user address and the loop breaks: the kernel's
trace is that one line. That is where the kernel's walk ends (clean, truncated), not a broken chain;
``--complete`` goes on from ``ra`` to the user-mode pt_regs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind import Options, Session
from unwind.cli.main import main
from unwind.core.walk import StopReason

CORPUS = Path(__file__).resolve().parents[3] / "corpora" / "riscv" / "6.12.117+deb13-riscv64"
DUMPS = sorted(CORPUS.glob("stop-*-syscall-entry-do_trap_ecall_u.bin.xz"))


@pytest.mark.parametrize("dump", DUMPS, ids=[d.name[:8] for d in DUMPS])
def test_cpu_at_handler_entry_ends_where_the_kernel_does(dump: Path, capsys) -> None:
    s = Session.load(dump)
    handler, entry = s.symbols.address("do_trap_ecall_u"), s.symbols.address("handle_exception")
    at = [t for t in s.select() if t.regs is not None and t.regs["pc"] == handler]
    assert at and entry is not None
    for task in at:
        regs = task.regs
        assert regs["s0"] < 1 << 63 and entry <= regs["ra"] < entry + s.symbols.lookup(entry).size
        r = s.replay(task, Options())
        assert [f.pc for f in r.frames] == [handler]
        assert r.stop.reason is StopReason.KERNEL_LIMIT and r.stop.clean and r.stop.truncated
        assert "do_trap_ecall_u" in r.stop.detail and "fp_is_valid()" in r.stop.detail
        full = s.replay(task, Options(complete=True))
        assert [f.pc for f in full.frames] == [handler, regs["ra"]] and full.stop.reason is StopReason.USER_MODE
    capsys.readouterr()
    assert main(["replay", "--all", str(dump)]) == 0
    assert "(ERROR)" not in capsys.readouterr().out
