"""A real x86-64 6.12 vmcore with one blocked task made a zombie whose stack is freed.

At an exited task's last switch ``finish_task_switch()`` drops its stack (``put_task_stack()`` ->
``release_task_stack()``: ``tsk->stack = NULL``); ``sched_show_task()`` then prints nothing for it
(``if (!try_get_task_stack(p)) return;``) and ``stack_trace_save_tsk_reliable()`` fails. The vmcore is a
committed one with three words of that task's ``task_struct`` changed as the kernel leaves a zombie:
``stack`` NULL, ``exit_state`` ``EXIT_ZOMBIE`` (``exit_notify()``), ``__state`` ``TASK_DEAD`` (``do_task_dead()``).
"""

from __future__ import annotations

import lzma
from pathlib import Path


from tests.elf_offsets import file_offset
from unwind import Session
from unwind.cli.main import main
from unwind.core.walk import StopReason

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "corpora" / "x86_64" / "6.12.117+deb13-amd64"
VMCORE = HERE / "vmcore" / "stop-001-random.elf.xz"
IMAGE = next(HERE.glob("vmlinux-*.slim.xz"))
EXIT_ZOMBIE, TASK_DEAD = 0x20, 0x80  # include/linux/sched.h


def _zombie(tmp_path: Path) -> tuple[Path, int, str]:
    """The vmcore with a blocked ``sleep`` made a zombie; its pid and comm."""
    plain = tmp_path / "plain.elf"
    plain.write_bytes(lzma.decompress(VMCORE.read_bytes()))
    s = Session.load(plain, vmlinux=IMAGE)
    kt = next(t for t in s.dump.kernel_tasks() if t.comm == "sleep" and t.running_on is None and t.stack)
    btf, translator = s.dump.kernel.btf, s.dump.memory.translator
    raw = bytearray(plain.read_bytes())
    for member, value in (("stack", 0), ("exit_state", EXIT_ZOMBIE), ("__state", TASK_DEAD)):
        m = btf.member("task_struct", member)
        at = file_offset(plain, translator.translate(kt.addr + m.offset), "p_paddr")
        raw[at:at + m.size] = value.to_bytes(m.size, "little")
    bad = tmp_path / "zombie.elf"
    bad.write_bytes(bytes(raw))
    return bad, kt.pid, kt.comm


def test_zombie_in_a_vmcore_says_its_stack_is_freed(tmp_path, capsys) -> None:
    bad, pid, comm = _zombie(tmp_path)
    s = Session.load(bad, vmlinux=IMAGE)
    task = next(t for t in s.select(every=True) if t.pid == pid)
    assert task.state == "Z" and task.regs is None
    r = s.replay(task, reliable=True)
    assert r.frames == [] and r.stop.reason is StopReason.TASK_EXITED and r.stop.clean
    assert r.reliable is not None and not r.reliable.ok
    capsys.readouterr()
    assert main(["replay", "--task", str(pid), "--reliable", "--vmlinux", str(IMAGE), str(bad)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"pid {pid} ({comm}) blocked:"
    assert out[1].startswith("-- stop: task has exited; its stack is freed: ") and out[1].endswith("(clean)")
    assert out[2].startswith("-- reliable: no: try_get_task_stack()")
