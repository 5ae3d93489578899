"""The drgn configurations of the peer table walk what drgn walks, and what we walk (no timings here).

On the committed vmcores, with drgn and the Debian ``-dbg`` vmlinux of the release (``unwind kernels
fetch``; found under ``$UNWIND_CACHE/kernels/<release>/vmlinux``), one child per configuration of
``benches/benchkit.py`` ``DRGN_CHILD`` and ours (``OURS_PEER_CHILD``), no timed pass:

- drgn from ``pt_regs`` walks the same pcs as drgn from the task with the same unwinder (``types``, and
  ``orc`` on x86-64): the ``struct pt_regs`` built from drgn's first registers starts the walk where
  the task does, so the bare-unwinder row times the same walk; where it stops sooner, it stops at a
  module's pc (with no types, drgn cannot read a module's ORC from its ``struct module``);
- ours starts with drgn's kernel pcs, on every task, up to the first frame drgn cannot name (a
  module's text: drgn has no module file) or names a return trampoline of the function-graph tracer
  (which ours resolves to the caller it replaced).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))
import benchkit  # noqa: E402

#: drgn's names of the function-graph tracer's return trampolines (ours names the caller they replaced)
TRAMPOLINES = ("ftrace_stub_graph", "return_to_handler")


def _kernels() -> Path:
    return Path(os.environ.get("UNWIND_CACHE", Path.home() / ".cache/unwind")) / "kernels"


def _drgn_prefix(run: dict, pcs: list[int]) -> list[int]:
    """drgn's pcs up to the first it cannot name or names a return trampoline."""
    out = []
    for pc in pcs:
        name = run["names"].get(f"{pc:#x}")
        if name is None or name.startswith(TRAMPOLINES):
            break
        out.append(pc)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_drgn_configurations_walk_the_same_frames_as_ours(arch: str, tmp_path: Path) -> None:
    pytest.importorskip("drgn", reason="drgn is not installed (pip install drgn)")
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy (binutils) is missing: drgn's slim image is made with it")
    cores = benchkit.peer_cores(tmp_path, [arch], _kernels(), None).get(arch)
    if not cores:
        pytest.skip(f"no {arch} committed vmcore with its -dbg vmlinux under {_kernels()} "
                    f"(unwind kernels fetch --arch {arch} --release RELEASE)")
    compared = 0
    for pc in cores:
        found = benchkit.peer_keys(sys.executable, pc)
        if found is None:
            continue  # a kdump slice drgn cannot list the tasks of (said on stderr)
        keys = json.dumps(found[0])
        runs = {m: benchkit.run_child(sys.executable, benchkit.DRGN_CHILD, *benchkit.drgn_args(m, pc, 0, keys))
                for m in benchkit.drgn_modes(arch)}
        ours = benchkit.run_child(sys.executable, benchkit.OURS_PEER_CHILD, str(benchkit.REPO), arch, str(pc.core),
                                  str(pc.slim), "0", keys)
        regs = runs["regs"]
        assert regs["failed"] == 0 and len(regs["keys"]) == len(found[0])
        for mode in ("types", "orc"):
            if mode not in runs:
                continue
            _, n, differ = benchkit.same_pcs(regs, runs[mode])
            assert n == len(found[0])
            for k, bare, full in differ:
                assert full[:len(bare)] == bare and bare, (mode, k)
                assert f"{bare[-1]:#x}" not in regs["names"], (mode, k, "stopped at a pc drgn names")
        theirs = {tuple(k): p for k, p in zip(regs["keys"], regs["pcs"])}
        for k, mine in zip(ours["keys"], ours["pcs"]):
            prefix = _drgn_prefix(regs, theirs[tuple(k)])
            assert prefix, (pc.name, k)
            assert mine[:len(prefix)] == prefix, (pc.name, k, [hex(p) for p in mine], [hex(p) for p in prefix])
            compared += 1
    if not compared:
        pytest.skip(f"drgn listed the tasks of none of the {arch} vmcores")
