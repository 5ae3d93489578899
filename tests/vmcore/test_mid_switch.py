"""A real x86-64 6.12 vmcore taken while cpu1 was in the middle of a context switch.

``corpora/x86_64/6.12.117+deb13-amd64/vmcore/switch-000.elf.xz``: QEMU's ``dump-guest-memory`` of a 4 GiB lab
guest (``--fill 1024``) stopped by a gdbstub breakpoint at ``__switch_to+0x122``, the store of ``next_p`` to
``pcpu_hot.current_task``, with ``next_p`` rcu_preempt, cut to what the project and drgn read. There
``__switch_to_asm()`` has loaded the next task's ``thread.sp`` while ``current`` is still the previous task,
and both have ``task_struct.on_cpu`` set (``prepare_task()`` set it for next, ``finish_task()`` has not yet
cleared it for prev). The kernel's own walks end at once for both: the NMI backtrace of cpu1 finds its sp on
no stack of ``current`` (``get_stack_info()``), and the walk of the other task from another CPU is refused
by ``task_on_another_cpu()``. drgn, the oracle (``switch-000.drgn-tasks.json.xz``, from the full ELF), reads
``on_cpu`` and ``task_cpu()`` of every task and unwinds both from cpu1's registers, whose frames run on the
next task's stack.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from unwind import Session
from unwind.cli.main import main
from unwind.core.walk import StopReason
from unwind.session.batch import replay_all

HERE = Path(__file__).resolve().parents[2] / "corpora" / "x86_64" / "6.12.117+deb13-amd64"
VMCORE = HERE / "vmcore" / "switch-000.elf.xz"
IMAGE = next(HERE.glob("vmlinux-*.slim.xz"))


@pytest.fixture(scope="module")
def elf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("switch") / "switch-000.elf"
    out.write_bytes(lzma.decompress(VMCORE.read_bytes()))
    return out


@pytest.fixture(scope="module")
def drgn() -> dict:
    return json.loads(lzma.decompress(VMCORE.with_name("switch-000.drgn-tasks.json.xz").read_bytes()))


def _switching(drgn: dict, session: Session) -> tuple[int, int, dict]:
    """(prev pid, next pid, drgn's entry of next) by drgn: the two tasks ``on_cpu`` on a CPU whose current
    (our running task there) is one of them; next is the one whose stack holds drgn's frames."""
    running = {t.cpu: t.pid for t in session.select(every=True) if t.running}
    by_cpu: dict[int, list[dict]] = {}
    for t in drgn["tasks"]:
        if t.get("on_cpu"):
            by_cpu.setdefault(t["cpu"], []).append(t)
    (cpu, pair), = ((c, ts) for c, ts in by_cpu.items() if len(ts) == 2)
    prev = running[cpu]
    nxt = next(t for t in pair if t["pid"] != prev)
    return prev, nxt["pid"], nxt


def test_drgn_unwinds_the_switching_cpu_on_the_next_tasks_stack(elf, drgn) -> None:
    s = Session.load(elf, vmlinux=IMAGE)
    prev, nxt, entry = _switching(drgn, s)
    (stack,) = [st for t in s.select(every=True) if t.pid == nxt for st in t.stacks if st.kind == "task"]
    sps = [int(f["sp"], 16) for f in entry["frames"]]
    assert entry["frames"][0]["symbol"].startswith("__switch_to+") and entry["frames"][0]["interrupted"]
    assert sps and all(stack.low <= sp < stack.high for sp in sps)
    # drgn unwinds prev from the same registers: the CPU's, not prev's stack
    (prev_entry,) = [t for t in drgn["tasks"] if t["pid"] == prev]
    assert prev_entry["frames"] == entry["frames"]


def test_both_walks_end_where_the_kernels_do(elf, drgn) -> None:
    s = Session.load(elf, vmlinux=IMAGE)
    prev, nxt, _ = _switching(drgn, s)
    tasks = {t.pid: t for t in s.select(every=True)}
    assert tasks[prev].running and not tasks[nxt].running
    assert tasks[prev].extra["switching_to"] == nxt and tasks[nxt].extra["switching_from"] == prev
    r = s.replay(tasks[prev])
    assert r.frames == [] and r.stop.reason is StopReason.KERNEL_LIMIT
    assert r.stop.detail.startswith(f"sp {tasks[prev].regs['rsp']:#x} is on the stack of pid {nxt}, to which "
                                    f"cpu{tasks[prev].cpu} is switching")
    r = s.replay(tasks[nxt])
    assert r.frames == [] and r.stop.reason is StopReason.KERNEL_LIMIT
    assert f"switching to it from pid {prev}" in r.stop.detail and "task_on_another_cpu()" in r.stop.detail
    # the lockstep batch leaves the refused task to the scalar start, which refuses it the same way
    (batch,) = replay_all([s], lockstep=True)
    assert {t.pid: b.stop for t, b in zip(batch.tasks, batch)}[nxt] == r.stop


def test_every_other_on_cpu_task_is_running(elf, drgn) -> None:
    """No task but next is refused: every other task drgn says is on_cpu is some CPU's current."""
    s = Session.load(elf, vmlinux=IMAGE)
    _, nxt, _ = _switching(drgn, s)
    on_cpu = {t["pid"] for t in drgn["tasks"] if t.get("on_cpu")}
    refused = {t.pid for t in s.select(every=True) if t.extra.get("on_cpu")}
    assert refused == {nxt} and refused < on_cpu


def test_replay_all_exits_clean(elf, capsys) -> None:
    assert main(["replay", "--all", "--vmlinux", str(IMAGE), str(elf)]) == 0
    out = capsys.readouterr().out
    assert "(ERROR)" not in out and out.count("(clean, truncated)") == 2


def test_the_switching_cpu_prints_its_registers_before_an_empty_call_trace(elf, drgn, capsys) -> None:
    """``show_regs()`` (arch/x86/kernel/process_64.c) prints ``__show_regs()`` before ``show_trace_log_lvl()``
    starts the walk: the registers of the CPU (drgn's first frame is their ip, ``__switch_to+0x122``), then
    ``Call Trace:`` and no frame."""
    s = Session.load(elf, vmlinux=IMAGE)
    prev, _, entry = _switching(drgn, s)
    cpu = next(t.cpu for t in s.select(every=True) if t.pid == prev)
    assert main(["replay", "--cpu", str(cpu), "--vmlinux", str(IMAGE), str(elf)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rip = next(i for i, ln in enumerate(lines) if ln.startswith("RIP: "))
    assert lines[rip].startswith(f"RIP: 0010:{entry['frames'][0]['symbol'].split('/')[0]}/")  # sizes: kallsyms's
    call = lines.index("Call Trace:")
    assert rip < call and lines[call + 1].startswith("-- stop: ")
