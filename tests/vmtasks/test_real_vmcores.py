"""Real vmcores of labvmcore's 6.12 guests against the project's capture of the same stop, and drgn.

Slow: the vmcores (256 MB guests) and debug vmlinuxes are not committed. ``$UNWIND_VMCORES`` names the
folder (default ``/work/lab-out/vmcores``: ``<arch>/stop-NNN-random.{elf,kdump-zlib.kdump,...}`` beside
``stop-NNN-random.bin.xz``, the capture of that stop); ``$UNWIND_KERNELS`` the kernels cache
(``~/.cache/unwind/kernels/<release>/vmlinux``, from ``unwind kernels fetch``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from unwind.session.replay import Session
from unwind.core.target import Options

VMCORES = Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores"))
KERNELS = Path(os.environ.get("UNWIND_KERNELS", Path.home() / ".cache/unwind/kernels"))
RELEASE = {"x86_64": "6.12.117+deb13-amd64", "arm64": "6.12.117+deb13-arm64", "riscv": "6.12.117+deb13-riscv64"}
DATA = Path(__file__).parent / "data"
#: formats whose every page of the guest is in the file (makedumpfile -d 31 drops pages by design)
FULL = ("elf", "paging.elf", "kdump-zlib.kdump", "kdump-zlib.flat")

pytestmark = pytest.mark.slow


def _cases() -> list[tuple[str, Path]]:
    out = []
    for arch in RELEASE:
        for capture in sorted((VMCORES / arch).glob("stop-*.bin.xz")):
            stem = capture.name.removesuffix(".bin.xz")
            out += [(arch, p) for fmt in FULL if (p := capture.with_name(f"{stem}.{fmt}")).exists()]
    return out


def _vmlinux(arch: str) -> Path:
    p = KERNELS / RELEASE[arch] / "vmlinux"
    if not p.exists():
        pytest.skip(f"no debug vmlinux at {p}")
    return p


def _normalised(capture: Session, cpu: int | None) -> bool:
    """The capture rewrote this CPU's pc from a trap entry to the interrupted one (ELR_EL1/sepc), which
    QEMU's NT_PRSTATUS does not carry: only the first pc may differ."""
    return cpu is not None and any(c.get("cpu") == cpu and c.get("normalised")
                                   for c in capture.dump.meta.get("cpus", []))


@pytest.mark.parametrize("arch,vmcore", _cases(), ids=lambda v: getattr(v, "name", v))
def test_every_task_replays_as_from_the_capture(arch: str, vmcore: Path) -> None:
    img = _vmlinux(arch)
    vm = Session.load(vmcore, vmlinux=img)
    cap = Session.load(vmcore.with_name(vmcore.name.split(".")[0] + ".bin.xz"), vmlinux=img)
    by_task = {t.task_struct: t for t in vm.dump.tasks()}
    checked = 0
    for t in cap.dump.tasks():
        key = t.task_struct or int(next(c["current"] for c in cap.dump.meta["cpus"] if c["cpu"] == t.cpu), 16)
        u = by_task[key]
        assert (u.pid, u.comm, u.running_cpu) == (t.pid, t.comm, t.running_cpu)
        r1, r2 = cap.replay(t, Options(), symbolize=False), vm.replay(u, Options(), symbolize=False)
        p1, p2 = [f.pc for f in r1.frames], [f.pc for f in r2.frames]
        if _normalised(cap, t.cpu):
            p1, p2 = p1[1:], p2[1:]
        if p1 != p2 and p1 and _in_module(vm, p1[-1]) and not r1.stop.clean:
            # the capture holds no module ORC tables: it stops at the module pc the vmcore walks through
            assert p2[:len(p1)] == p1 and r2.stop.clean, (t.pid, t.comm)
        else:
            assert p1 == p2 and r1.stop.reason == r2.stop.reason, (t.pid, t.comm)
        checked += 1
    assert checked == len(cap.dump.tasks()) > 10


def _in_module(s: Session, pc: int) -> bool:
    return any(m.region(pc) is not None for m in getattr(s.symbols, "modules", []))


@pytest.mark.parametrize("arch,vmcore", [c for c in _cases() if c[1].name.endswith(".elf")],
                         ids=lambda v: getattr(v, "name", v))
def test_module_frames_print_as_the_kernel_printed_them(arch: str, vmcore: Path) -> None:
    """The sysrq-t blocks the capture could not resolve (module frames, no System.map names) are the
    kernel's own text: the vmcore's trace, printed, equals them line for line."""
    from unwind.formats.dump import Dump
    from unwind.session.output import replay_text

    vm = Session.load(vmcore, vmlinux=_vmlinux(arch))
    capture = Dump.open(vmcore.with_name(vmcore.name.split(".")[0] + ".bin.xz"))
    blocks = [o for o in capture.meta.get("oracles_excluded", []) if "unresolved" in o.get("why", "")]
    if not blocks:
        pytest.skip("no module frames in this stop's sysrq-t")
    for o in blocks:
        t = next(t for t in vm.dump.tasks() if t.pid == o["pid"] and not t.running)
        kernel = o["text"].splitlines()
        kernel = kernel[next(i for i, ln in enumerate(kernel) if ln.lower() == "call trace:"):]
        ours = replay_text(vm, vm.replay(t), False)
        ours = ours[next(i for i, ln in enumerate(ours) if ln.lower() == "call trace:"):]
        assert ours[:len(kernel)] == kernel, (o["pid"], o["comm"])


@pytest.mark.parametrize("oracle", sorted(DATA.glob("*-drgn-ps.json")), ids=lambda p: p.name)
def test_ps_lists_what_drgn_for_each_task_lists(oracle: Path) -> None:
    rec = json.loads(oracle.read_text())
    arch = oracle.name.split("-")[0]
    vmcore = VMCORES / arch / rec["vmcore"]
    if not vmcore.exists():
        pytest.skip(f"no {vmcore}")
    s = Session.load(vmcore, vmlinux=_vmlinux(arch))
    ours = {(t.pid, t.comm, t.task_struct) for t in s.dump.tasks()}
    theirs = {(t["pid"], t["comm"], int(t["task"], 16)) for t in rec["tasks"]}
    # drgn's for_each_task() walks init_task.tasks without init_task; crash's ps (and ours) also lists
    # each CPU's idle task (pid 0)
    assert {x for x in ours if x[0] != 0} == theirs


@pytest.mark.parametrize("arch,vmcore", [c for c in _cases() if c[1].name.endswith(".elf")],
                         ids=lambda v: getattr(v, "name", v))
def test_ps_json_gives_what_drgn_reads(arch: str, vmcore: Path, capsys) -> None:
    """``ps --json``'s parent, thread group, kernel-thread flag, CPU, state and command against drgn's
    reading of the same task_struct (``real_parent->tgid``, ``tgid``, ``PF_KTHREAD``, ``task_cpu()``)."""
    pytest.importorskip("drgn")
    from drgn.helpers.linux.pid import for_each_task
    from drgn.helpers.linux.sched import task_cpu, task_state_to_char

    from unwind.cli.main import main
    from unwind.lab.translations import drgn_program

    img = _vmlinux(arch)
    prog = drgn_program(vmcore, img, arch)
    pf_kthread = 0x00200000  # include/linux/sched.h: a macro, so not in the debug info drgn reads
    theirs = {hex(t.value_()): {"pid": int(t.pid), "ppid": int(t.real_parent.tgid), "tgid": int(t.tgid),
                                "kthread": bool(t.flags & pf_kthread), "cpu": int(task_cpu(t)),
                                "state": task_state_to_char(t), "comm": t.comm.string_().decode(errors="replace")}
              for t in for_each_task(prog)}
    capsys.readouterr()
    assert main(["ps", str(vmcore), "--vmlinux", str(img), "--json"]) == 0
    ours = {o["task_struct"]: o for o in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(theirs) <= set(ours)
    for addr, want in theirs.items():
        assert {k: ours[addr][k] for k in want} == want, addr


@pytest.mark.parametrize("arch,vmcore", [c for c in _cases() if c[1].name.endswith(".elf")][:3],
                         ids=lambda v: getattr(v, "name", v))
def test_convert_replays_identically(arch: str, vmcore: Path, tmp_path: Path) -> None:
    from unwind.formats.dump import Dump
    from unwind.cli.tasks import convert

    img = _vmlinux(arch)
    vm = Session.load(vmcore, vmlinux=img)
    tasks = vm.select(every=True)
    out = tmp_path / "small.bin.xz"
    convert(vm, tasks).write(out)
    small = Session(Dump.open(out), vm.image, vm.image.symbols)
    back = {t.task_struct: t for t in small.dump.tasks()}
    for t in tasks:
        a, b = vm.replay(t), small.replay(back[t.task_struct])
        assert [(f.pc, f.symbol) for f in a.frames] == [(f.pc, f.symbol) for f in b.frames]
        assert a.stop.reason == b.stop.reason and a.stop.detail == b.stop.detail
    assert out.stat().st_size < vmcore.stat().st_size // 100


@pytest.mark.parametrize("arch,vmcore", [c for c in _cases() if c[1].name.endswith(".elf")],
                         ids=lambda v: getattr(v, "name", v))
def test_the_kernels_own_traces_from_the_vmcore(arch: str, vmcore: Path) -> None:
    """The sysrq-t (and other kernel-printed) oracles the capture holds, compared with the vmcore's replay."""
    from unwind.cli.corpus import KERNEL_SOURCES, compare_oracle

    vm = Session.load(vmcore, vmlinux=_vmlinux(arch))
    capture = Session.load(vmcore.with_name(vmcore.name.split(".")[0] + ".bin.xz"), vmlinux=_vmlinux(arch))
    results = [compare_oracle(vm, o) for o in capture.dump.oracles() if o.get("source") in KERNEL_SOURCES]
    results = [r for r in results if r is not None]
    assert results and all(r.explained for r in results), [(r.who, r.category) for r in results if not r.explained]
    assert sum(r.category == "exact" for r in results) >= len(results) * 3 // 4


KASLR = sorted(Path(os.environ.get("UNWIND_KASLR_VMCORES", "/work/lab-out/vmmm")).glob("*kaslr*.elf"))


@pytest.mark.parametrize("vmcore", KASLR, ids=lambda p: p.name)
def test_kaslr_vmcores_walk_every_task_to_a_clean_end(vmcore: Path) -> None:
    """vmmm's KASLR guests (no capture of the same stop): with the image relocated every blocked task
    walks to its natural end through symbolised frames; unrelocated, none would find its unwind data."""
    arch = "x86_64" if vmcore.name.startswith("x86") else vmcore.name.split("-")[0]
    s = Session.load(vmcore, vmlinux=_vmlinux(arch))
    from unwind.kernel.kaslr import RelocatedImage

    assert isinstance(s.image, RelocatedImage) and s.image.slide
    blocked = [t for t in s.dump.tasks() if not t.running]
    assert len(blocked) > 20
    for t in blocked:
        r = s.replay(t)
        assert r.stop.clean, (t.pid, t.comm, r.stop)
        assert all(not f.symbol.startswith("0x") for f in r.frames if f.reliable), (t.pid, t.comm)


#: drgn 0.3.0 does not recover function-graph or kretprobe returns
DRGN_BLIND = ("return_to_handler", "__kretprobe_trampoline", "arch_rethook_trampoline", "ftrace_stub_graph")
#: makedumpfile -c -d 31 and -F files of a stop beside drgn's oracle of its ELF (any arch or release folder)
MDF = sorted(p for p in VMCORES.glob("*/stop-*.mdf-*-d31.*")
             if p.with_name(p.name.split(".")[0] + ".drgn-tasks.json").exists())


@pytest.mark.parametrize("vmcore", MDF, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_makedumpfile_files_replay_as_drgn_on_the_elf(vmcore: Path) -> None:
    """A -d 31 file loses no page a task list or a blocked task's walk needs: ps lists drgn's tasks and every
    blocked task drgn unwound walks pc for pc as drgn's (drgn has no sp for arm64 running CPUs, and does not
    recover fgraph/kretprobe returns: those tasks are left out)."""
    drgn = json.loads(vmcore.with_name(vmcore.name.split(".")[0] + ".drgn-tasks.json").read_text())
    s = Session.load(vmcore)  # the image by build-id ($UNWIND_CACHE kernels)
    tasks = {t.task_struct: t for t in s.dump.tasks()}
    assert {int(t["task"], 16) for t in drgn["tasks"] if t["pid"]} <= set(tasks)
    checked = 0
    for t in drgn["tasks"]:
        ours = tasks.get(int(t["task"], 16))
        if "frames" not in t or ours is None or ours.running:
            continue
        if any(str(f.get("symbol")).startswith(DRGN_BLIND) for f in t["frames"]):
            continue
        got = [f.pc for f in s.replay(ours, symbolize=False).frames][:len(t["frames"])]
        assert got == [int(f["pc"], 16) for f in t["frames"]], (t["pid"], t["comm"])
        checked += 1
    assert checked > 40
