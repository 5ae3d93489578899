"""Translation on the committed vmcores (``corpora/*/*/vmcore/*.elf.xz``): shortcuts against the walk, and the
running CPUs' traces against an independent trace.

The slices hold the pages ``unwind`` and drgn read (``corpora/README.md``), so the page-table pages behind an
address a shortcut served may be missing: such an address cannot be walked here and is counted, not judged.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import lzma
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from unwind.cli.main import main
from unwind.core.memory import LeftOut, MemoryFault
from unwind.formats.dump import Dump
from unwind.formats.vmcore.virtual import VirtualMemory

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
VMCORES = sorted(CORPORA.glob("*/*/vmcore/*.elf.xz"))
#: drgn 0.3.0 does not follow function-graph or kretprobe returns: its trace goes astray after one
DRGN_BLIND = ("return_to_handler", "__kretprobe_trampoline", "arch_rethook_trampoline", "ftrace_stub_graph")


def _ids(p: Path) -> str:
    return f"{p.parts[-4]}/{p.parts[-3]}/{p.name.split('.')[0]}"


def _slim(vmcore: Path) -> Path:
    return next(vmcore.parents[1].glob("vmlinux-*.slim.xz"))


@dataclass
class _FaultSeen:
    """A physical reader that notes whether a read faulted (a page-table page the slice lacks)."""

    phys: Any
    faulted: bool = False
    #: the fault was RAM the dump's own headers leave out (riscv kexec-tools drops the linear map's tables)
    left_out: bool = False

    def read_phys(self, paddr: int, size: int) -> bytes:
        try:
            return self.phys.read_phys(paddr, size)
        except MemoryFault as e:
            self.faulted = True
            self.left_out = isinstance(e, LeftOut)
            raise


@pytest.fixture(scope="module", params=VMCORES, ids=_ids)
def pages_read(request) -> tuple[Path, list[tuple[Any, set[int]]]]:
    """Every page a full replay (``--all``, plain and ``--json --reliable --complete``) and ``ps`` read,
    per translator: ``VirtualMemory.page_phys`` sees each one."""
    vmcore: Path = request.param
    seen: dict[int, tuple[Any, set[int]]] = {}
    page_phys = VirtualMemory.page_phys

    def recording(self: VirtualMemory, vaddr: int) -> int:
        seen.setdefault(id(self.translator), (self.translator, set()))[1].add(vaddr >> self.page_shift)
        return page_phys(self, vaddr)

    slim = str(_slim(vmcore))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VirtualMemory, "page_phys", recording)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(["replay", str(vmcore), "--vmlinux", slim, "--all"]) in (0, 1)
            assert main(["replay", str(vmcore), "--vmlinux", slim, "--all", "--json", "--reliable",
                         "--complete"]) in (0, 1)
            assert main(["ps", str(vmcore), "--vmlinux", slim]) == 0
    return vmcore, list(seen.values())


def test_every_address_a_replay_reads_translates_the_same_by_shortcut_and_by_walk(pages_read) -> None:
    """Where a shortcut claims a page the replay read, the walk from the kernel's page tables must give
    the same physical page, or be unable to run here (a table page not in the slice)."""
    vmcore, per_translator = pages_read
    counts: Counter[str] = Counter()
    wrong = []
    for tr, pages in per_translator:
        walk = copy.copy(tr)
        walk.linear = ()  # every arch's translate() takes a shortcut only from here
        for vpage in sorted(pages):
            va = vpage << tr.page_shift
            shortcut = next((lm for lm in tr.linear if va in lm), None)
            if shortcut is None:
                counts["walked"] += 1
                continue
            walk.phys = seen = _FaultSeen(tr.phys)
            try:
                walked: int | None = walk.translate(va)
            except MemoryFault:
                walked = None
            if walked == shortcut.pa(va):
                counts["agree"] += 1
            elif walked is None and seen.left_out:
                counts["table left out by the dump's headers"] += 1
            elif walked is None and seen.faulted:
                counts["table not in the slice"] += 1
            else:
                wrong.append(f"{va:#x}: shortcut {shortcut.pa(va):#x}, walk {walked and hex(walked)}")
    assert not wrong, (vmcore.name, wrong[:10])
    # the replay reads through both kinds, and enough shortcut pages are confirmed by the walk to mean something,
    # unless the dump itself lacks the tables (then the load said so, and no page was merely cut from the slice)
    lacking = counts["table left out by the dump's headers"] > 0 and not counts["table not in the slice"]
    assert counts["walked"] >= 100 and (counts["agree"] >= 100 or lacking), counts


def _replay_cpu(dump: Path, cpu: int, *mode: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["replay", str(dump), "--vmlinux", str(_slim(dump)), "--cpu", str(cpu), "--json", *mode]) in (0, 1)
    return json.loads(out.getvalue().splitlines()[0])


def _drgn_running(vmcore: Path) -> dict[int, dict[str, Any]]:
    """drgn's traces of the running tasks, by CPU (none where drgn could not unwind them)."""
    f = vmcore.with_name(vmcore.name.split(".")[0] + ".drgn-tasks.json.xz")
    if not f.exists():
        return {}
    tasks = json.loads(lzma.decompress(f.read_bytes()))["tasks"]
    return {t["cpu"]: t for t in tasks if t["on_cpu"] and "error" not in t}


def _drgn_until_lost(frames: list[dict[str, Any]]) -> list[str]:
    """drgn's pcs before the first return it cannot follow (a hijacked return: drgn prints the trampoline, where
    the kernel and the replay print the return address recovered from the fgraph or kretprobe stack)."""
    out = []
    for f in frames:
        if (f["symbol"] or "").startswith(DRGN_BLIND):
            break
        out.append(f["pc"])
    return out


#: the running CPUs and the independent trace each is compared with. A true kdump with no drgn oracle has no
#: capture either (riscv's: drgn 0.3.0 cannot read it, kexec-tools 2.0.32 writes its RAM PT_LOADs' p_vaddr wrong):
#: its crash CPU is compared with the kernel's own panic trace in tests/lab/test_kdump_corpus.py
RUNNING = [(v, cpu) for v in VMCORES for cpu in (0, 1)
           if not v.name.startswith("kdump-") or v.with_name(v.name.split(".")[0] + ".drgn-tasks.json.xz").exists()]


@pytest.mark.parametrize("vmcore,cpu", RUNNING, ids=[f"{_ids(v)}-cpu{c}" for v, c in RUNNING])
def test_running_cpu_trace_matches_an_independent_trace(vmcore: Path, cpu: int) -> None:
    """x86-64: drgn 0.3.0 on the full vmcore (``DRGN_PREFER_ORC_UNWINDER=1``) unwound both running CPUs of each
    vmcore; its pcs are a prefix of the complete replay's (reliable and recovered frames), up to the first
    hijacked return drgn cannot follow (not included). arm64 (drgn: "stack pointer is not known") and riscv (drgn has no riscv
    unwinder) have no kernel or drgn trace of a running CPU: there the oracle is the capture of the same stop,
    whose stacks QEMU's MMU translated, replayed by the same unwinder; its first frame differs where the
    capture normalised a vCPU stopped at exception entry, so frames are compared from the second on. A CPU the
    crash NMI stopped in user mode (x86 kdump-001's cpu0) has no kernel frame for drgn: none for us either, the
    walk stops on the user-mode registers. A CPU caught mid-switch (x86 switch-000's cpu1) has no frame in the
    kernel's walk; drgn's first frame there must be in ``__switch_to``."""
    ours = _replay_cpu(vmcore, cpu, "--complete")
    drgn = _drgn_running(vmcore).get(cpu)
    if drgn is not None and ours["stop"]["reason"] == "kernel_limit" and "switching" in ours["stop"]["detail"]:
        # caught between __switch_to_asm() and __switch_to()'s store of current: the kernel's walk gives no frame
        # (tests/vmcore/test_mid_switch.py); drgn, which walks the registers anyway, was caught in __switch_to too
        assert ours["frames"] == [] and drgn["frames"][0]["symbol"].startswith("__switch_to+")
        return
    if drgn is not None:
        expected = _drgn_until_lost(drgn["frames"])
        got = [f["pc"] for f in ours["frames"] if f["reliable"] or "complete" in f["flags"]]
        assert got[:len(expected)] == expected, (got, drgn["frames"])
        if expected:
            assert len(expected) >= 2
        else:
            assert ours["frames"] == [] and ours["stop"]["reason"] == "user_mode"
        return
    capture = vmcore.with_name(vmcore.name.split(".")[0] + ".bin.xz")
    assert vmcore.parts[-4] in ("arm64", "riscv") and capture.exists(), "a running CPU with no independent trace"
    task = next(t for t in Dump.open(capture).tasks() if t.running and t.cpu == cpu)
    faithful, captured = _replay_cpu(vmcore, cpu), _replay_cpu(capture, cpu)
    assert faithful["task"]["pid"] == captured["task"]["pid"] == task.pid
    assert [f["pc"] for f in faithful["frames"]][1:] == [f["pc"] for f in captured["frames"]][1:]
    assert len(faithful["frames"]) >= 4
    assert faithful["stop"]["reason"] == captured["stop"]["reason"]
