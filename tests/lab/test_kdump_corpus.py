"""The committed true kdump (``corpora/x86_64/6.12.117+deb13-amd64/vmcore/kdump-000.*``): the crash CPU.

``kdump-000.elf.xz`` is ``/proc/vmcore`` of a 6.12 guest crashed by sysrq ``c`` with a kexec'ed crash
kernel, cut to the pages ``unwind`` and drgn read. CPU 0 saved its registers in ``__crash_kexec()``
(``crash_setup_regs()``, ``rip = _THIS_IP_``), a function with no ORC (``STACK_FRAME_NON_STANDARD``);
CPU 1 was stopped by the crash NMI. Oracles: the first kernel's own panic trace
(``kdump-000.console.txt``, printed by ``dump_stack()`` in ``panic()`` just before ``__crash_kexec()``)
and drgn 0.3.0 on the full vmcore (``kdump-000.drgn-tasks.json.xz``; drgn unwinds ``__crash_kexec``
through its DWARF CFI).
"""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import pytest

from unwind.cli.main import main

HERE = Path(__file__).resolve().parents[2] / "corpora" / "x86_64" / "6.12.117+deb13-amd64"
VMCORE = HERE / "vmcore" / "kdump-000.elf.xz"
_STAMP = re.compile(r"^\[\s*\d+\.\d+\] ")


@pytest.fixture(scope="module")
def kdump() -> dict:
    """The slice (read as it is committed, xz), the slim image, drgn's tasks and the console's panic trace."""
    elf = VMCORE
    drgn = json.loads(lzma.decompress(VMCORE.with_name("kdump-000.drgn-tasks.json.xz").read_bytes()))
    console = VMCORE.with_name("kdump-000.console.txt").read_text().splitlines()
    trace = [_STAMP.sub("", ln) for ln in console]
    trace = trace[trace.index("Call Trace:") + 1:]
    return {"elf": elf, "slim": next(HERE.glob("vmlinux-*.slim.xz")), "drgn": {t["pid"]: t for t in drgn["tasks"]},
            "panic_trace": trace[:trace.index(" </TASK>") + 1]}


def _run(capsys, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().out.splitlines()


def _trace(lines: list[str]) -> list[str]:
    """The lines between ``Call Trace:`` and the stop line."""
    return lines[lines.index("Call Trace:") + 1:next(i for i, ln in enumerate(lines) if ln.startswith("-- stop"))]


def _from_panic(trace: list[str]) -> list[str]:
    """The lines after panic()'s own frame (the console's and ours differ only below it)."""
    i = next(i for i, ln in enumerate(trace) if ln.lstrip(" ?").startswith("panic+"))
    return trace[i + 1:]


def test_faithful_crash_cpu_is_what_the_kernels_unwinder_prints_from_those_registers(kdump, capsys) -> None:
    """unwind_next_frame() from the NT_PRSTATUS regs: ORC_TYPE_UNDEFINED -> goto err, so the printer
    marks every text word '?'; those words, from panic's frame up, are the console's lines. The walk ends
    where the kernel's does, at a function objtool skips by design: a clean, truncated stop (exit 0), and
    the reliable walk fails as arch_stack_walk_reliable() does on unwind_error()."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", "0",
                   "--reliable")
    assert rc == 0 and out[0] == "pid 1 (init) on cpu0:" and out[1] == "RIP: 0010:__crash_kexec+0x120/0x140"
    trace = _trace(out)
    words = [ln for ln in trace if ln not in (" <TASK>", " </TASK>")]
    assert words and all(ln.startswith(" ? ") for ln in words)
    console = [ln.replace(" ? ", " ") for ln in _from_panic(kdump["panic_trace"]) if ln.startswith(" ")]
    ours = [ln.replace(" ? ", " ") for ln in _from_panic(trace)]
    kernel_words = console[:console.index(" entry_SYSCALL_64_after_hwframe+0x76/0x7e") + 1]
    assert ours[:len(kernel_words)] == kernel_words
    stop, reliable = out[-2], out[-1]
    assert stop.startswith("-- stop: the kernel's unwinder stops here: ") and stop.endswith("(clean, truncated)")
    assert "is UNDEFINED" in stop and "STACK_FRAME_NON_STANDARD" in stop and "--complete" in stop
    assert reliable.startswith("-- reliable: no: ")


def test_complete_crash_cpu_prints_the_kernels_panic_trace(kdump, capsys) -> None:
    """--complete: the caller of __crash_kexec proven by its call, then ORC: from panic's frame up,
    line for line the trace the kernel printed (the user-mode register block without its Code: line)."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", "0", "--complete")
    assert rc == 0 and out[-1].startswith("-- stop: reached user-mode registers")
    trace = _trace(out)
    assert " panic+0x123/0x2db [complete: called __crash_kexec]" in trace
    assert " panic+0x118/0x2db" in kdump["panic_trace"]  # the console's panic frame is its dump_stack() call
    assert _from_panic(trace) == [ln for ln in _from_panic(kdump["panic_trace"]) if not ln.startswith("Code: ")]


def test_complete_crash_cpu_equals_drgn(kdump, capsys) -> None:
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", "0",
                   "--complete", "--json")
    frames = json.loads(out[0])["frames"]
    assert [int(f["pc"], 16) for f in frames] == [int(f["pc"], 16) for f in kdump["drgn"][1]["frames"]]
    assert frames[1]["flags"][:2] == ["unreliable", "complete"] and frames[1]["source"] == "caller"


def test_complete_crash_cpu_is_not_reliable(kdump, capsys) -> None:
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", "0",
                   "--complete", "--reliable")
    assert out[-1].startswith("-- reliable: no: complete-mode frame at 0xffffffff81cbe5e3")


def test_every_other_task_equals_drgn(kdump, capsys) -> None:
    """CPU 1 (stopped by the crash NMI) and every blocked task walk as drgn does (faithful mode)."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--all", "--json")
    ours = {o["task"]["pid"]: o for o in map(json.loads, out) if o["task"]["pid"] != 1}
    drgn = {pid: t for pid, t in kdump["drgn"].items() if pid != 1 and "frames" in t}
    assert set(drgn) <= set(ours) and len(drgn) > 50
    for pid, t in drgn.items():
        assert [f["pc"] for f in ours[pid]["frames"]] == [f["pc"] for f in t["frames"]], pid


def _with_words(mem, words: dict[int, int]):
    """The memory ``mem`` with the words at these addresses replaced."""
    from unwind.core.memory import Memory, Segment

    segs = []
    for seg in mem.segments:
        data = bytearray(seg.data)
        for addr, value in words.items():
            if seg.start <= addr and addr + 8 <= seg.end:
                data[addr - seg.start:addr - seg.start + 8] = value.to_bytes(8, "little")
        segs.append(Segment(seg.start, bytes(data)))
    return Memory(segs, mem.holes)


def test_complete_takes_only_a_return_from_a_call_to_that_function(kdump, monkeypatch) -> None:
    """A text word that returns from a call to another function (here sysrq_handle_crash's return into
    __handle_sysrq, which follows 'call panic'), put below the real slot, is passed over; with the real
    slot gone there is no caller to prove and the walk stops as in faithful mode, saying why."""
    from unwind.session.replay import Session
    from unwind.core.target import Options
    from unwind.core.walk import StopReason

    s = Session.load(kdump["elf"], vmlinux=kdump["slim"])
    task = s.select(cpu=0)[0]
    good = s.replay(task, Options(complete=True))
    slot = good.frames[1].sp - 8
    sp = task.regs["rsp"]
    decoy = good.frames[2].pc  # returns into sysrq_handle_crash's caller: the call before it is not to __crash_kexec
    real = s.dump.task_memory
    monkeypatch.setattr(s.dump, "task_memory", lambda t: _with_words(real(t), {sp + 8: decoy}))
    assert [f.pc for f in s.replay(task, Options(complete=True)).frames] == [f.pc for f in good.frames]
    monkeypatch.setattr(s.dump, "task_memory", lambda t: _with_words(real(t), {slot: 0}))
    cut = s.replay(task, Options(complete=True))
    assert len(cut.frames) == 1 and cut.stop.reason is StopReason.KERNEL_LIMIT
    assert "no return address above sp follows a call" in cut.stop.detail
