"""The committed vmcore slices (``corpora/<arch>/<release>/vmcore/``) against drgn and the capture of the same stop.

Each slice is QEMU's ``dump-guest-memory`` ELF of a 256 MB 6.12 guest cut down to the pages the project
and drgn read (``unwind.lab.vmcores.corpus_slice``). drgn's answers were recorded from the full ELF
(``*.drgn-tasks.json.xz``); the capture (``*.bin.xz``) was taken through QEMU's gdbstub at the same stop.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.formats.dump import Dump
from unwind.formats.vmcore import open_vmcore
from tests.corpus_checks import open_slice

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
SLICES = sorted(CORPORA.glob("*/*/vmcore/stop-*.elf.xz"))
#: drgn 0.3.0 does not recover function-graph or kretprobe returns (real-kernels.md §6)
DRGN_BLIND = ("return_to_handler", "__kretprobe_trampoline", "arch_rethook_trampoline", "ftrace_stub_graph")


def _ids(p: Path) -> str:
    return f"{p.parts[-4]}/{p.parts[-3]}/{p.name.split('.')[0]}"


@pytest.fixture(scope="module", params=SLICES, ids=_ids)
def stop(request, tmp_path_factory) -> dict:
    """One committed stop: the decompressed slice, the capture, the slim image, drgn's answers."""
    return open_slice(request.param, tmp_path_factory.mktemp("slice"))


def _replay_all(dump: Path, slim: Path, status: dict[str, int], name: str) -> dict[str, dict]:
    """``unwind replay --all --json`` of ``dump``: task_struct -> the task's JSON object; its exit status
    goes into ``status[name]``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status[name] = main(["replay", str(dump), "--vmlinux", str(slim), "--all", "--json"])
    return {o["task"]["task_struct"]: o for o in map(json.loads, out.getvalue().splitlines())}


@pytest.fixture(scope="module")
def replays(stop) -> dict[str, dict]:
    """Every task replayed once from the slice and once from the capture (``exit``: each one's exit status)."""
    status: dict[str, int] = {}
    return {"vmcore": _replay_all(stop["elf"], stop["slim"], status, "vmcore"),
            "capture": _replay_all(stop["capture"], stop["slim"], status, "capture"), "exit": status}


def test_every_task_of_the_capture_replays_with_no_error(replays) -> None:
    # exit 0: every walk ended cleanly (where the kernel's own walk ends too), none on an error
    stopped = [(o["task"]["pid"], o["stop"]["detail"]) for o in replays["capture"].values() if not o["stop"]["clean"]]
    assert (replays["exit"]["capture"], stopped) == (0, [])


def test_module_kthreads_walk_from_the_capture_as_drgn_walks_them(stop, replays) -> None:
    """Blocked tasks whose stack holds module code (the lab's ``scsi_eh_0`` in ``scsi_error_handler()``
    and ``dd`` in ``uhid_char_read()``): the capture's walk is drgn's, pc for pc, and where the capture lists
    the modules (x86-64 follows their ORC, read from it) each module frame names its module."""
    if stop["drgn"] is None:
        pytest.skip("drgn 0.3.0 has no riscv stack unwinder")
    modules = Dump.open(stop["capture"]).info.modules
    ours = replays["capture"]
    walked = []
    for t in stop["drgn"]["tasks"]:
        module_pcs = [int(f["pc"], 16) for f in t.get("frames", ())
                      if (f["symbol"] or "").startswith(("scsi_error_handler+", "uhid_char_read+"))]
        if t["on_cpu"] or "error" in t or not module_pcs:
            continue
        frames = ours[t["task"]]["frames"]
        assert [f["pc"] for f in frames if f["reliable"]] == [f["pc"] for f in t["frames"]], (t["pid"], t["comm"])
        if modules:
            named = {int(f["pc"], 16): f["symbol"] for f in frames}
            assert all(any(m.contains(pc) and named[pc].endswith(f" [{m.name}]") for m in modules)
                       for pc in module_pcs), (t["pid"], t["comm"])
        walked.append(t["comm"])
    if "virtio-scsi-pci" in Dump.open(stop["capture"]).meta["capture"]["qemu"]:
        assert {"scsi_eh_0", "dd"} <= set(walked)


def test_slice_is_the_vmcore_of_the_captured_stop(stop) -> None:
    cap = Dump.open(stop["capture"])
    with open_vmcore(stop["elf"]) as vm:
        assert vm.format == "elf"
        assert len(vm.prstatus) == len(cap.cpus)
        if stop["arch"] == "riscv":  # QEMU 7.2 refuses -device vmcoreinfo on riscv
            assert vm.vmcoreinfo is None
        else:
            assert vm.vmcoreinfo_dict["BUILD-ID"] == cap.build_id


def test_ps_lists_the_tasks_drgn_lists(stop, capsys) -> None:
    capsys.readouterr()
    assert main(["ps", str(stop["elf"]), "--vmlinux", str(stop["slim"]), "--json"]) == 0
    listed = {(r["pid"], int(r["task_struct"], 16)) for r in map(json.loads, capsys.readouterr().out.splitlines())}
    if stop["drgn"] is not None:
        expected = {(t["pid"], int(t["task"], 16)) for t in stop["drgn"]["tasks"]}
    else:  # riscv: drgn cannot unwind it; the capture walked the same list through QEMU's MMU
        expected = {(t.pid, t.task_struct) for t in Dump.open(stop["capture"]).tasks()}
    # the idle tasks of the other CPUs are on no task list: drgn's for_each_task has only init_task
    assert {t for t in listed if t[0]} == {t for t in expected if t[0]}
    assert len([t for t in listed if not t[0]]) == len(Dump.open(stop["capture"]).cpus)


def test_blocked_tasks_unwind_as_drgn_unwinds_them(stop, replays) -> None:
    if stop["drgn"] is None:
        pytest.skip("drgn 0.3.0 has no riscv stack unwinder")
    ours = replays["vmcore"]
    compared = 0
    for t in stop["drgn"]["tasks"]:
        if t["on_cpu"] or "error" in t or any((f["symbol"] or "").startswith(DRGN_BLIND) for f in t["frames"]):
            continue
        mine = [f["pc"] for f in ours[t["task"]]["frames"] if f["reliable"]]
        if t.get("state") == "Z":
            # a zombie whose stack was freed: drgn reads the freed pages, the kernel's try_get_task_stack() fails
            assert (mine, ours[t["task"]]["stop"]["reason"]) == ([], "task_exited"), (t["pid"], t["comm"])
            continue
        assert mine == [f["pc"] for f in t["frames"]], (t["pid"], t["comm"])
        compared += 1
    assert compared >= 40


def test_module_frames_are_named_with_their_module(stop, replays) -> None:
    if "virtio-scsi-pci" not in Dump.open(stop["capture"]).meta["capture"]["qemu"]:
        pytest.skip("this guest ran without the lab modules (unwind lab boot --modules)")
    ours = replays["vmcore"]
    traces = {o["task"]["comm"]: "\n".join(line["text"] for line in o["trace"]) for o in ours.values()
              if o["task"]["comm"] == "scsi_eh_0" or any("uhid_char_read" in (f["symbol"] or "") for f in o["frames"])}
    assert " [scsi_mod]" in traces["scsi_eh_0"] and "scsi_error_handler+" in traces["scsi_eh_0"]
    assert "uhid_char_read+" in traces["dd"] and " [uhid]" in traces["dd"]


def test_blocked_tasks_replay_as_from_the_capture(stop, replays) -> None:
    """The same stop read two ways: QEMU's vmcore and our gdbstub capture.

    Running tasks are left out: the capture normalises a vCPU stopped at trap entry, the vmcore
    has the raw NT_PRSTATUS.
    """
    from_vmcore, from_capture = replays["vmcore"], replays["capture"]
    compared = 0
    for task, cap in from_capture.items():
        got = from_vmcore[task]
        if cap["task"]["running"]:
            continue
        assert [f["pc"] for f in got["frames"]] == [f["pc"] for f in cap["frames"]], cap["task"]["pid"]
        assert got["stop"]["reason"] == cap["stop"]["reason"], cap["task"]["pid"]
        compared += 1
    assert compared >= 40


def test_blocked_tasks_replay_from_the_vmcore_as_the_kernel_printed_them(stop, replays) -> None:
    """The kernel's own sysrq-t traces (kept in the capture, printed just before QEMU wrote the vmcore)
    against the faithful replay of the vmcore slice: every fresh trace of a blocked task, pc for pc."""
    by_pid = {o["task"]["pid"]: o for o in replays["vmcore"].values() if not o["task"]["running"]}
    compared = 0
    for oracle in Dump.open(stop["capture"]).oracles():
        if oracle.get("source") != "sysrq-t" or oracle.get("stale") or oracle.get("pid") not in by_pid:
            continue
        got = [int(f["pc"], 16) for f in by_pid[oracle["pid"]]["frames"]]
        assert got == [int(pc, 0) for pc in oracle["frames"]], (oracle["pid"], oracle.get("comm"))
        compared += 1
    assert compared >= 40
