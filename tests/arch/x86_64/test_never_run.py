"""A real x86-64 6.1 dump with one blocked task turned into a child forked but never run.

``copy_thread()`` leaves a new task's ``inactive_task_frame`` with ``ret_addr = ret_from_fork``; 6.1's
``__unwind_start()`` takes that frame as a signal frame (``state->signal = ip == ret_from_fork``), so
``orc_find()`` looks up ``ret_from_fork`` itself, whose ``UNWIND_HINT_EMPTY`` (end=1) is the end of the
stack: ``show_trace_log_lvl()`` prints that one address and the walk is done, with no error (a reliable
walk succeeds). The dump is a committed capture with that one word changed.
"""

from __future__ import annotations

import lzma
from pathlib import Path


from tests.elf_offsets import file_offset
from unwind import Options, Session
from unwind.cli.main import main
from unwind.core.walk import StopReason

ROOT = Path(__file__).resolve().parents[3]
DUMP = ROOT / "corpora" / "x86_64" / "6.1.0-57-amd64" / "stop-001-random.bin.xz"
PID = 2  # kthreadd, blocked in schedule()
IMAGE = next(DUMP.parent.glob("vmlinux-*.slim.xz"))


def _never_run(tmp_path: Path) -> tuple[Path, Session]:
    """The dump with task ``PID``'s ``inactive_task_frame->ret_addr`` (the last of its 7 words) set to
    ``ret_from_fork``, as ``copy_thread()`` writes it."""
    plain = tmp_path / "plain.bin"
    plain.write_bytes(lzma.decompress(DUMP.read_bytes()))
    s = Session.load(plain, vmlinux=IMAGE)
    task = next(t for t in s.select(every=True) if t.pid == PID)
    entry = s.symbols.address("ret_from_fork")
    assert entry is not None and s.symbols.address("ret_from_fork_asm") is None  # 6.1: the entry is asm
    raw = bytearray(plain.read_bytes())
    at = file_offset(plain, task.context["sp"] + 6 * 8)
    assert int.from_bytes(raw[at:at + 8], "little") != entry
    raw[at:at + 8] = entry.to_bytes(8, "little")
    bad = tmp_path / "never-run.bin"
    bad.write_bytes(bytes(raw))
    return bad, Session.load(bad, vmlinux=IMAGE)


def test_never_run_child_ends_cleanly_at_ret_from_fork(tmp_path, capsys) -> None:
    bad, s = _never_run(tmp_path)
    task = next(t for t in s.select(every=True) if t.pid == PID)
    r = s.replay(task, Options(), reliable=True)
    # printk_stack_address()'s %pB looks up address - 1 (sprint_backtrace()): the byte before ret_from_fork is
    # the last of __switch_to_asm, which ends where ret_from_fork starts
    entry, switch = s.symbols.address("ret_from_fork"), s.symbols.lookup(s.symbols.address("ret_from_fork") - 1)
    assert switch is not None and switch.name == "__switch_to_asm" and switch.addr + switch.size == entry
    printed = f"__switch_to_asm+{switch.size:#x}/{switch.size:#x}"
    assert [(f.pc, f.symbol) for f in r.frames] == [(entry, printed)]
    assert r.stop.reason is StopReason.END_OF_STACK and r.stop.clean
    assert r.reliable is not None and r.reliable.ok
    assert main(["replay", "--task", str(PID), "--reliable", "--vmlinux", str(IMAGE), str(bad)]) == 0
    out = capsys.readouterr().out
    assert f"\n {printed}\n" in out and "UNDEFINED" not in out
