"""Which task runs on which CPU, from real vmcores whose notes or per-CPU areas are damaged by construction.

- A CPU's ``NT_PRSTATUS`` lost (its note type changed, or the note before it grown over it, so the notes
  after it are read out of step; the committed QEMU ELF files): the task the intact file runs there is still
  shown running on it (``>`` in ``ps``), the loss is said once on stderr, and its walk stops saying the
  registers are missing, not a walk of its stale saved context. A corrupt ``__cpu_online_mask`` loses
  nothing: the CPUs that saved registers are read all the same.
- The per-CPU areas left out of a true kdump (kexec-tools on riscv does that): with the runqueues, ``current``
  and the ``crash_notes`` buffers gone, the notes are the CPUs in order and each ``pr_pid`` names the task
  running there: ``ps`` and the walks equal the intact file's. QEMU's notes (``pr_pid = cpu + 1``, no
  ``CRASHTIME``) name no task, and are not read as pids.
- A VMCOREINFO line dropped as malformed is said on stderr even when the load then fails.
"""

from __future__ import annotations

import lzma
import struct
from functools import cache
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from tests.elf_offsets import file_offset
from unwind.cli.main import main
from unwind.core.walk import StopReason
from unwind.formats.vmcore import open_vmcore
from unwind.session.replay import Session

from .synth import kdump_of

ROOT = Path(__file__).resolve().parents[2]
QEMU = sorted(ROOT.glob("corpora/*/*/vmcore/stop-*.elf.xz"))
KDUMP = ROOT / "corpora/x86_64/6.12.117+deb13-amd64/vmcore/kdump-000.elf.xz"
NT_PRSTATUS = 1


def _image(vmcore: Path) -> Path:
    return next(vmcore.parent.parent.glob("vmlinux-*"))


def _name(vmcore: Path) -> str:
    return f"{vmcore.parts[-4]}-{vmcore.parts[-3]}-{vmcore.name.split('.')[0]}"


@cache
def _intact(vmcore: Path, tmp: Path) -> tuple[Path, Session]:
    path = tmp / f"{_name(vmcore)}.intact.elf"
    path.write_bytes(lzma.decompress(vmcore.read_bytes()))
    return path, Session.load(path, vmlinux=_image(vmcore))


def _notes(raw: bytes) -> list[tuple[int, int, int, int]]:
    """(file offset, n_namesz, n_descsz, n_type) of each note of the ELF core's PT_NOTE segments."""
    from io import BytesIO

    out = []
    for seg in ELFFile(BytesIO(raw)).iter_segments("PT_NOTE"):
        pos, end = seg["p_offset"], seg["p_offset"] + seg["p_filesz"]
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", raw, pos)
            if namesz == descsz == ntype == 0:
                break
            out.append((pos, namesz, descsz, ntype))
            pos += 12 + -(-namesz // 4) * 4 + -(-descsz // 4) * 4
    return out


def _lose_cpu1_note(raw: bytearray, how: str) -> None:
    """The second NT_PRSTATUS (QEMU's cpu1) made unreadable: its type changed, or the first note's size grown
    to swallow it (the notes after the first are then read out of step, as a corrupt n_descsz does)."""
    first, second = [n for n in _notes(bytes(raw)) if n[3] == NT_PRSTATUS][:2]
    if how == "type":
        struct.pack_into("<I", raw, second[0] + 8, 0x4242)
    else:  # the first note's desc then runs to the end of the second note
        desc = first[0] + 12 + -(-first[1] // 4) * 4
        struct.pack_into("<I", raw, first[0] + 4, second[0] + 12 + -(-second[1] // 4) * 4 + second[2] - desc)


def _running(s: Session) -> dict[int, str]:
    """cpu -> task_struct of each task shown running."""
    return {t.running_cpu: t.task_struct for t in s.dump.tasks() if t.running_cpu is not None}


@pytest.mark.parametrize("how", ["type", "desync"])
@pytest.mark.parametrize("vmcore", QEMU, ids=_name)
def test_a_lost_register_note_shows_its_task_running_without_a_stale_walk(vmcore: Path, how: str, tmp_path_factory,
                                                                          capsys) -> None:
    path, intact = _intact(vmcore, tmp_path_factory.getbasetemp())
    raw = bytearray(path.read_bytes())
    _lose_cpu1_note(raw, how)
    bad = tmp_path_factory.mktemp("note") / f"{_name(vmcore)}.{how}.elf"
    bad.write_bytes(bytes(raw))
    s = Session.load(bad, vmlinux=_image(vmcore))
    assert _running(s) == _running(intact)
    task = next(t for t in s.dump.tasks() if t.running_cpu == 1)
    assert task.regs is None and task.context is None and task.lacks is not None and task.lacks.registers
    r = s.replay(task)
    assert r.frames == [] and r.stop.reason is StopReason.MISSING_REGISTER and "cpu1" in r.stop.detail
    cpu0 = next(t for t in s.dump.tasks() if t.running_cpu == 0)
    r0 = intact.replay(next(t for t in intact.dump.tasks() if t.running_cpu == 0))
    assert [f.pc for f in s.replay(cpu0).frames] == [f.pc for f in r0.frames]
    capsys.readouterr()
    assert main(["ps", "--vmlinux", str(_image(vmcore)), str(bad)]) == 0
    out, err = capsys.readouterr()
    said = [ln for ln in err.splitlines() if "NT_PRSTATUS" in ln]
    assert len(said) == 1 and said[0].startswith("unwind: warning: cpu1: no registers"), err
    row = next(ln for ln in out.splitlines() if f"{task.task_struct:016x}" in ln)
    assert row.startswith(">") and row.split()[3] == "1" and "registers are not in the dump" in row


@pytest.mark.parametrize("mask", [0, 1])
@pytest.mark.parametrize("vmcore", QEMU, ids=_name)
def test_a_corrupt_online_mask_loses_no_running_cpu(vmcore: Path, mask: int, tmp_path_factory) -> None:
    path, intact = _intact(vmcore, tmp_path_factory.getbasetemp())
    k = intact.dump.kernel
    raw = bytearray(path.read_bytes())
    at = file_offset(path, intact.dump.memory.translator.translate(k.require("__cpu_online_mask")), "p_paddr")
    raw[at:at + 8] = mask.to_bytes(8, "little")
    bad = tmp_path_factory.mktemp("mask") / f"{_name(vmcore)}.mask{mask}.elf"
    bad.write_bytes(bytes(raw))
    s = Session.load(bad, vmlinux=_image(vmcore))
    assert _running(s) == _running(intact)
    for t in s.dump.tasks():
        if t.running_cpu is not None:
            t0 = next(u for u in intact.dump.tasks() if u.running_cpu == t.running_cpu)
            assert t.regs == t0.regs and [f.pc for f in s.replay(t).frames] == [f.pc for f in intact.replay(t0).frames]


def _without_percpu_areas(vmcore: Path, tmp: Path) -> Path:
    """The vmcore as a kdump-compressed file without any CPU's per-CPU area (``__per_cpu_start`` ..
    ``__per_cpu_end`` at each ``__per_cpu_offset``): no runqueue, no ``current``, no ``crash_notes`` buffer."""
    path, s = _intact(vmcore, tmp)
    k, translator = s.dump.kernel, s.dump.memory.translator
    lo, hi = k.require("__per_cpu_start"), k.require("__per_cpu_end")
    gone = {translator.translate(va + off) // 4096 for off in k.per_cpu_offset for va in range(lo, hi, 4096)}
    out = tmp / f"{_name(vmcore)}.no-percpu.kdump"
    with open_vmcore(path) as vm:
        out.write_bytes(kdump_of(vm, exclude=frozenset(gone)))
    return out


def test_a_true_kdump_without_per_cpu_areas_places_each_task_by_its_note(tmp_path_factory, capsys) -> None:
    tmp = tmp_path_factory.getbasetemp()
    _, intact = _intact(KDUMP, tmp)
    s = Session.load(_without_percpu_areas(KDUMP, tmp), vmlinux=_image(KDUMP))
    assert "CRASHTIME" in s.dump.vmcoreinfo and any("cannot read its runqueue" in w for w in s.warnings)
    running = {t.running_cpu: t for t in s.dump.tasks() if t.running_cpu is not None}
    want = {t.running_cpu: t for t in intact.dump.tasks() if t.running_cpu is not None}
    # the console's panic header: "CPU: 0 UID: 0 PID: 1 Comm: init"
    assert (running[0].pid, running[0].comm) == (1, "init")
    assert {c: (t.pid, t.task_struct) for c, t in running.items()} == \
        {c: (t.pid, t.task_struct) for c, t in want.items()}
    for cpu, t in running.items():
        a, b = s.replay(t), intact.replay(want[cpu])
        assert [f.pc for f in a.frames] == [f.pc for f in b.frames] and a.stop.reason is b.stop.reason


@pytest.mark.parametrize("vmcore", [v for v in QEMU if v.parts[-4] == "x86_64"], ids=_name)
def test_qemu_notes_without_per_cpu_areas_name_no_task(vmcore: Path, tmp_path_factory) -> None:
    """QEMU's pr_pid is cpu + 1: pids 1 and 2 are not put on CPUs 0 and 1."""
    tmp = tmp_path_factory.getbasetemp()
    _, intact = _intact(vmcore, tmp)
    s = Session.load(_without_percpu_areas(vmcore, tmp), vmlinux=_image(vmcore))
    assert "CRASHTIME" not in s.dump.vmcoreinfo
    was = {t.pid: t.running_cpu for t in intact.dump.tasks()}
    assert was[1] is None and was[2] is None
    assert all(t.running_cpu is None for t in s.dump.tasks() if t.pid in (1, 2))
    assert not any("crash note" in w for w in s.warnings)


def test_a_dropped_vmcoreinfo_line_is_said_when_the_load_then_fails(tmp_path_factory, capsys) -> None:
    vmcore = next(v for v in QEMU if v.parts[-4] == "arm64")
    path, _ = _intact(vmcore, tmp_path_factory.getbasetemp())
    raw = path.read_bytes()
    assert raw.count(b"PAGESIZE=4096\n") == 1
    bad = tmp_path_factory.mktemp("info") / "pagesize.elf"
    bad.write_bytes(raw.replace(b"PAGESIZE=4096\n", b"PAGESIZE=zz96\n"))
    capsys.readouterr()
    assert main(["ps", "--vmlinux", str(_image(vmcore)), str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0] == f"unwind: warning: {bad}: VMCOREINFO PAGESIZE='zz96' is not a number: dropped"
    assert err[1].startswith("unwind: error: ") and "PAGESIZE" in err[1]
