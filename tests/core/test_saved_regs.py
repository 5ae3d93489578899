"""``replay --regs``: a blocked task's saved context, checked against what our code did not produce: the
kernel's own printed trace (its first frame is the saved pc), drgn's first frame of each task, and the raw
bytes of the dump at the kernel's struct offsets (read here with ``struct``)."""

from __future__ import annotations

import json
import lzma
import struct
from pathlib import Path

import pytest

from tests.elf_offsets import file_offset
from unwind.cli.main import main
from unwind.session.replay import load_session

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "corpora/x86_64/6.12.117+deb13-amd64"
ARM64 = ROOT / "corpora/arm64/6.12.117+deb13-arm64"
#: the register each arch's blocked walk starts from: the first frame the kernel prints
FIRST_PC = {"x86_64": "ret_addr", "arm64": "pc", "riscv": "ra"}
#: struct inactive_task_frame (arch/x86/include/asm/switch_to.h, CONFIG_X86_64), eight bytes a member
INACTIVE_TASK_FRAME = ("r15", "r14", "r13", "r12", "bx", "bp", "ret_addr")


@pytest.mark.parametrize("dump", [
    X86 / "stop-004-random.bin.xz", ROOT / "corpora/x86_64/7.2.13+deb14-amd64/stop-001-random.bin.xz",
    ARM64 / "stop-000-random.bin.xz", ROOT / "corpora/arm64/7.2.13+deb14-arm64/stop-000-random.bin.xz",
    ROOT / "corpora/riscv/6.12.117+deb13-riscv64/stop-000-random.bin.xz"], ids=lambda p: p.parent.name)
def test_the_saved_pc_is_the_first_frame_the_kernel_printed(dump):
    s = load_session(dump)
    tasks = {t.pid: t for t in s.dump.tasks() if not t.running}
    checked = 0
    for o in s.dump.oracles():
        if o["source"] != "sysrq-t" or o.get("stale") or o["pid"] not in tasks:
            continue
        saved = s.saved_regs(tasks[o["pid"]])
        assert saved is not None and saved.regs[FIRST_PC[s.backend.name]] == int(o["frames"][0], 16), o["pid"]
        checked += 1
    assert checked >= 20


def test_x86_inactive_task_frame_is_the_bytes_at_thread_sp(tmp_path):
    elf = tmp_path / "dump.elf"
    elf.write_bytes(lzma.decompress((X86 / "stop-004-random.bin.xz").read_bytes()))
    s = load_session(elf, vmlinux=next(X86.glob("vmlinux-*.slim.xz")))  # the dump's folder, not tmp_path's
    raw = elf.read_bytes()
    blocked = [t for t in s.dump.tasks() if not t.running]
    for t in blocked:
        saved = s.saved_regs(t)
        assert saved is not None and saved.missing == ()
        tsp = saved.regs["sp"]
        at = file_offset(elf, tsp)
        words = struct.unpack_from("<7Q", raw, at)
        assert {k: saved.regs[k] for k in INACTIVE_TASK_FRAME} == dict(zip(INACTIVE_TASK_FRAME, words))
    assert len(blocked) > 50


def _drgn_first_frames(folder: Path, stop: str) -> dict[int, dict]:
    data = json.loads(lzma.decompress((folder / "vmcore" / f"{stop}.drgn-tasks.json.xz").read_bytes()))
    return {int(t["task"], 16): t["frames"][0] for t in data["tasks"] if not t["on_cpu"] and t.get("frames")}


@pytest.mark.parametrize("folder", [X86, ARM64], ids=lambda p: p.parent.name)
def test_vmcore_saved_context_is_where_drgn_starts(folder):
    """drgn starts a blocked task at its saved context: arm64 cpu_context.pc/sp, x86-64 the
    inactive_task_frame's ret_addr with sp just above the frame."""
    stop = "stop-001-random" if folder is X86 else "stop-000-random"
    s = load_session(folder / "vmcore" / f"{stop}.elf.xz")
    first = _drgn_first_frames(folder, stop)
    checked = 0
    for t in s.dump.tasks():
        f = first.get(t.task_struct)
        if t.running or f is None:
            continue
        saved = s.saved_regs(t)
        assert saved is not None
        if s.backend.name == "arm64":
            assert (saved.regs["pc"], saved.regs["sp"]) == (int(f["pc"], 16), int(f["sp"], 16)), t.pid
        else:
            assert (saved.regs["ret_addr"], saved.regs["sp"] + 56) == (int(f["pc"], 16), int(f["sp"], 16)), t.pid
        checked += 1
    assert checked >= 40


def test_arm64_vmcore_cpu_context_is_the_bytes_at_its_btf_offsets(tmp_path):
    """Every register of thread.cpu_context, read here from the vmcore's physical segments at the
    task_struct address drgn translated (tests/vmcore/data) and the member offsets of the image's BTF."""
    record = json.loads(lzma.decompress((ROOT / "tests/vmcore/data/arm64-6.12.117-translations.json.xz").read_bytes()))
    pa = {int(t["va"], 16): int(t["pa"], 16) for t in record["translations"] if t["what"].startswith("task ")}
    elf = tmp_path / "vmcore.elf"
    elf.write_bytes(lzma.decompress((ARM64 / "vmcore/stop-000-random.elf.xz").read_bytes()))
    s = load_session(elf, vmlinux=next(ARM64.glob("vmlinux-*.slim.xz")))  # the dump's folder, not tmp_path's
    btf = s.image.btf
    raw = elf.read_bytes()
    checked = 0
    for t in s.dump.tasks():
        addr = t.task_struct
        if t.running or addr not in pa:
            continue
        saved = s.saved_regs(t)
        assert saved is not None
        for name, value in saved.regs.items():
            at = file_offset(elf, pa[addr] + btf.offsetof("task_struct", f"thread.cpu_context.{name}"), "p_paddr")
            assert struct.unpack_from("<Q", raw, at)[0] == value, (t.pid, name)
        checked += 1
    assert checked >= 40


def test_regs_text_and_json(capsys):
    dump = ROOT / "corpora/riscv/6.12.117+deb13-riscv64/stop-000-random.bin.xz"
    assert main(["replay", str(dump), "--task", "1", "--regs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "saved context (task_struct.thread (ra, sp, s[0..11])):"
    assert out[3] == "  not in the dump: s1 s2 s3 s4 s5 s6 s7 s8 s9 s10 s11"   # the note keeps ra, sp, s0
    assert main(["replay", str(dump), "--regs", "--json"]) == 0
    for line in capsys.readouterr().out.splitlines():
        obj = json.loads(line)
        assert obj["task"]["running"] and obj["saved_regs"] is None
    assert main(["replay", str(dump), "--task", "1", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert "saved_regs" not in obj
    # every object names its schema: the newest version docs/json.md's table lists
    table = [line.split("|")[1].strip() for line in (ROOT / "docs/json.md").read_text().splitlines()
             if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert obj["schema"] == max(int(v) for v in table) == 3


def test_riscv_vmcore_context_is_the_captured_one_and_whole():
    """The vmcore's thread.ra/sp/s0 equal those the capture of the same stop read through QEMU's gdbstub
    (the dump beside it), and the vmcore gives s1..s11 too."""
    folder = ROOT / "corpora/riscv/6.12.117+deb13-riscv64"
    image = next(folder.glob("vmlinux-*.slim.xz"))
    vm = load_session(folder / "vmcore/stop-001-random.elf.xz", vmlinux=image)
    captured = {t.pid: t.context for t in load_session(folder / "vmcore/stop-001-random.bin.xz").dump.tasks()
                if not t.running}
    checked = 0
    for t in vm.dump.tasks():
        if t.running or t.pid not in captured:
            continue
        saved = vm.saved_regs(t)
        assert saved is not None and saved.missing == () and len(saved.regs) == 14
        assert {k: saved.regs[k] for k in ("ra", "sp", "s0")} == captured[t.pid], t.pid
        checked += 1
    assert checked >= 40
