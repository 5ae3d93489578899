"""Per-frame replay against drgn, CPU and wall time, same run: the report's headline.

Every measurement runs in a fresh child process, and the children are interleaved round by round,
so load from other processes falls on all of them alike. Each child times ``--passes`` warm passes
and keeps the fastest, by ``time.process_time`` (CPU) and by ``time.perf_counter`` (wall);
the figures are medians over rounds.

- **ours, corpora**: ``Session.replay(task, Options(), symbolize=False)`` of every task of every
  committed dump of the arch (the call-site check on), on sessions just opened (**fresh**) and
  again (**warm**): the single-task targets;
- **ours, vmcores**: the same call on the committed vmcores' tasks that drgn walks
  (``benchkit.OURS_PEER_CHILD``, the committed slim image): **fresh** (the first pass in a Session
  just loaded) and **warm**;
- each of those for both builds (``unwind.accel``): the pure-Python modules (``ours``, ``UNWIND_PURE=1``)
  and the compiled build of this checkout's sources (``ours compiled``; made first, and left out with
  ``--pure-only`` or where it cannot be made: no Cython or C compiler);
- **drgn**, 0.3.0 ``stack_trace`` of the same tasks, in each configuration of ``benchkit.DRGN_CHILD``
  (``benchkit.drgn_modes``): **regs**, its bare unwinder from a ``struct pt_regs`` of the registers it
  starts the task with, the slim image its only kernel file, no type lookups; **types**, from the task
  with its layouts read from the debug vmlinux's DWARF in drgn's C, the CFI hidden so it unwinds as
  regs does; **orc** (x86-64) and **dwarf**, as users run it: the debug vmlinux, ORC preferred
  (``DRGN_PREFER_ORC_UNWINDER=1``) or drgn's default, DWARF CFI.

Frames are counted alike on every side: real frames (not drgn's inline ones) before the first pc
outside the kernel half of the address space. drgn walks on into the user frames of a task that
entered from user space (on x86-64 through whatever the user stack holds, up to its 1,024-frame
limit), and that time cannot be split off its ``stack_trace``; so the per-frame figures come from
the **kernel-only** tasks (no side walked a user frame), and the per-task figures from every task.
The tasks are those drgn walks in every configuration, within 64 kernel frames (``benchkit.peer_keys``). The
kernel pcs of each side are compared task by task, and a few traces are printed beside ours.

drgn has no riscv unwinder; riscv has the corpus rows only::

    python benches/speed_peer.py --rounds 3 --drgn-python /path/to/venv-with-drgn/bin/python --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import (DRGN_CHILD, IMPORT_ROOT, OURS_PEER_CHILD, REPO, TIMED, PeerCore, compiled_build,  # noqa: E402
                      drgn_args, drgn_modes, peer_cores, peer_keys, run_child, same_pcs)

ARCHES = ("arm64", "x86_64", "riscv")


def sides(arch: str, builds: tuple[str, ...]) -> tuple[str, ...]:
    """The sides walked on each peer vmcore of ``arch``, in the order each round runs them: ``ours`` is the
    pure-Python build, ``ours compiled`` the compiled one."""
    return (*(f"drgn {m}" for m in drgn_modes(arch)), *(_ours(b) for b in builds))


def _ours(build: str) -> str:
    return "ours" if build == "pure" else f"ours {build}"


OURS_CORPUS = IMPORT_ROOT + TIMED + r"""
import glob, json
from unwind.session.replay import Options, load_session
paths = sorted(glob.glob(sys.argv[3] + "/*/stop-*.bin.xz"))
sessions = [load_session(p) for p in paths]
todo = [(s, s.select(every=True)) for s in sessions]
c, w = time.process_time(), time.perf_counter()
frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for s, ts in todo for t in ts)
fresh, fresh_wall = time.process_time() - c, time.perf_counter() - w
warm, warm_wall = timed(lambda: [s.replay(t, Options(), symbolize=False) for s, ts in todo for t in ts],
                        int(sys.argv[4]))
print(json.dumps({"dumps": len(paths), "tasks": sum(len(ts) for _, ts in todo), "frames": frames,
                  "fresh": fresh, "fresh_wall": fresh_wall, "warm": warm, "warm_wall": warm_wall}))
"""

#: the figures a peer child reports that are summed over an arch's vmcores
SUMMED = ("tasks", "frames", "warm", "warm_wall", "k_tasks", "k_frames", "k_warm", "k_warm_wall", "k_fresh",
          "k_fresh_wall", "user_frames")


def side_run(drgn_python: str, side: str, pc: PeerCore, passes: int, keys: str) -> dict[str, Any]:
    """One child of ``side`` on the peer vmcore ``pc``."""
    if side.startswith("ours"):
        return run_child(sys.executable, OURS_PEER_CHILD, str(REPO), pc.arch, str(pc.core), str(pc.slim),
                         str(passes), keys, build="pure" if side == "ours" else side.split()[1])
    return run_child(drgn_python, DRGN_CHILD, *drgn_args(side.split()[1], pc, passes, keys))


def arch_rounds(peer: dict[str, dict[str, list[dict[str, Any]]]], side: str) -> list[dict[str, float]]:
    """Per round, ``side``'s figures summed over the arch's vmcores."""
    per_core = [runs[side] for runs in peer.values()]
    return [{k: sum(r[i].get(k, 0) for r in per_core) for k in SUMMED} for i in range(min(map(len, per_core)))]


def commit() -> str | None:
    """The checkout's commit (short), ``+`` when it has changes; ``None`` outside git."""
    r = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty=+"], capture_output=True, text=True)
    return r.stdout.strip() or None


def per(runs: list[dict[str, float]], key: str, count: str, scale: float = 1e6) -> float | None:
    """Median over rounds of ``key`` / ``count`` (µs by default); ``None`` when a round counted nothing."""
    if not runs or any(not r.get(count) for r in runs):
        return None
    return statistics.median(r[key] / r[count] * scale for r in runs)


def validation(first: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The kernel pcs of ours against each drgn mode, task by task, from one round's children; a few traces,
    each side's pcs named by its own symbols."""
    ours = first["ours"]

    def named(pcs: list[int], names: dict[str, str]) -> list[str]:
        return [names.get(f"{p:#x}", f"{p:#x}") for p in pcs]
    out: dict[str, Any] = {}
    for side in (x for x in first if not x.startswith("ours")):
        same, compared, differ = same_pcs(ours, first[side])
        out[side] = {"same": same, "compared": compared,
                     "differ": [{"task": k, "ours": named(a, ours["names"]), "drgn": named(b, first[side]["names"])}
                                for k, a, b in differ[:3]]}
    drgn = first["drgn regs"]
    out["samples"] = [{"task": k, "ours": named(a, ours["names"]), "drgn": named(b, drgn["names"])}
                      for k, a, b in zip(ours["keys"][:3], ours["pcs"][:3], drgn["pcs"][:3])]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=3, help="warm passes per child; the fastest counts (default 3)")
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeat for several (default: all)")
    p.add_argument("--drgn-python", help="a python with drgn installed: adds the drgn rows")
    p.add_argument("--vmlinux-dir", type=Path, default=Path(os.environ.get("UNWIND_CACHE", Path.home() / ".cache/unwind"))
                   / "kernels",
                   help="<release>/vmlinux debug images for drgn (default: the lab's fetched kernels)")
    p.add_argument("--vmcores", type=Path, default=Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores")),
                   help="the lab's full vmcores, DIR/<arch>/<stop>.elf, read instead of the committed slices")
    p.add_argument("--json", type=Path, help="write every child's figures here")
    p.add_argument("--pure-only", action="store_true", help="leave the compiled build (unwind accel) out")
    a = p.parse_args(argv)
    arches = a.arch or list(ARCHES)
    builds: tuple[str, ...] = ("pure",)
    if not a.pure_only:
        why = compiled_build()
        if why is None:
            builds += ("compiled",)
        else:
            print(f"the compiled build is left out: {why}", file=sys.stderr)
    started, load = datetime.now(timezone.utc).isoformat(timespec="seconds"), os.getloadavg()[0]
    runs: dict[str, list[dict]] = {}
    peer: dict[str, dict[str, dict[str, list[dict]]]] = {}
    checks: dict[str, dict[str, Any]] = {}
    left_out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cores = peer_cores(Path(tmp), arches, a.vmlinux_dir, a.vmcores) if a.drgn_python else {}
        keys: dict[PeerCore, str] = {}
        for arch_cores in cores.values():
            for pc in arch_cores:
                found = peer_keys(a.drgn_python, pc)
                if found is None:
                    left_out[pc.name] = "drgn cannot list its tasks"
                    continue
                keys[pc], left_out[pc.name] = json.dumps(found[0]), found[1]
        for _ in range(a.rounds):
            for arch in arches:
                for build in builds:
                    runs.setdefault(f"{arch} corpus" + ("" if build == "pure" else f" {build}"), []).append(
                        run_child(sys.executable, OURS_CORPUS, str(REPO), arch, str(REPO / "corpora" / arch),
                                  str(a.passes), build=build))
                for pc in cores.get(arch, []):
                    if pc not in keys:
                        continue
                    by_side = peer.setdefault(arch, {}).setdefault(pc.name, {})
                    first = {side: side_run(a.drgn_python, side, pc, a.passes, keys[pc])
                             for side in sides(arch, builds)}
                    if pc.name not in checks:
                        checks[pc.name] = validation(first)
                    for side, r in first.items():
                        for k in ("keys", "pcs", "names", "user"):
                            r.pop(k, None)
                        by_side.setdefault(side, []).append(r)
    out = {"rounds": a.rounds, "passes": a.passes, "builds": list(builds), "datetime": started, "commit": commit(),
           "load": [load, os.getloadavg()[0]], "runs": runs, "peer": peer, "validation": checks,
           "left_out": left_out, "vmcores": {pc.name: str(pc.core) for cs in cores.values() for pc in cs}}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    print(f"µs per frame, CPU / wall, median of {a.rounds} rounds (fastest of {a.passes} warm passes per child)\n")
    print("| arch | build | corpus tasks / frames | ours fresh | ours warm |")
    print("|---" * 5 + "|")
    for arch in arches:
        for build in builds:
            c = runs[f"{arch} corpus" + ("" if build == "pure" else f" {build}")]
            print(f"| {arch} | {build} | {c[0]['tasks']} / {c[0]['frames']} | {per(c, 'fresh', 'frames'):.2f} / "
                  f"{per(c, 'fresh_wall', 'frames'):.2f} | {per(c, 'warm', 'frames'):.2f} / "
                  f"{per(c, 'warm_wall', 'frames'):.2f} |")
    if peer:
        print("\nPeer vmcores: CPU µs per kernel frame over the kernel-only tasks (ratio: ÷ ours warm)\n")
        for arch, by_core in peer.items():
            o = arch_rounds(by_core, "ours")
            print(f"{arch}: {o[0]['k_tasks']} kernel-only tasks of {o[0]['tasks']}, {o[0]['k_frames']} kernel frames")
            warm = per(o, "k_warm", "k_frames")
            print(f"  ours warm {warm or 0:.2f}, ours fresh {per(o, 'k_fresh', 'k_frames') or 0:.2f}")
            for build in builds[1:]:
                c = arch_rounds(by_core, _ours(build))
                us = per(c, "k_warm", "k_frames")
                print(f"  ours {build} warm {us or 0:.2f} ({(us or 0) / (warm or 1):.2f}×)")
            for side in sides(arch, ()):
                d = arch_rounds(by_core, side)
                us = per(d, "k_warm", "k_frames")
                print(f"  {side}: {us or 0:.2f} ({(us or 0) / (warm or 1):.2f}×), frames {d[0]['k_frames']}")
        for name, check in checks.items():
            print(f"\n{name}: same kernel pcs as ours: " + ", ".join(
                f"{side} {c['same']} of {c['compared']}" for side, c in check.items() if side != "samples"))
            for s in check["samples"][:2] + check["drgn regs"]["differ"][:1]:
                print(f"  task {s['task']}:")
                for i in range(max(len(s["ours"]), len(s["drgn"]))):
                    ours = s["ours"][i] if i < len(s["ours"]) else ""
                    print(f"    {ours:<48} {s['drgn'][i] if i < len(s['drgn']) else ''}")
    for name, why in left_out.items():
        print(f"left out of {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
