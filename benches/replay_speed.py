"""Single-task replay speed: ``Session.replay(task, Options(), symbolize=False)`` per frame, in CPU time.

Compares this checkout with another one (``--base``, e.g. a ``git worktree`` of main) on the same
committed corpora, and with drgn's bare unwinder (``--drgn-python``). Every measurement runs in a fresh
child process and the children are interleaved round by round (base, new, drgn for each arch), so load
from other processes falls on all of them alike. Figures are medians over rounds of
``time.process_time``, divided by the frames walked::

    git worktree add --detach /tmp/base main
    python benches/replay_speed.py --base /tmp/base --rounds 3 \\
        --drgn-python /path/to/venv-with-drgn/bin/python

- **first**: the first replay of every task of each dump, in a process that opens the dumps one by one
  (the first walk over each image also decodes its ORC table and decides its call sites);
- **fresh**: the first replay of every task of a new :class:`Session` of each dump, its image already
  open (as in a batch over many dumps of one kernel: the image's tables and verdicts are shared);
- **warm**: every task of every dump replayed again, ``--passes`` times; the fastest pass counts (the
  least disturbed by other processes);
- **per task** / **per further frame**: the warm passes again with ``max_frames=1`` (set-up, first frame,
  stop, call-site check and ``Replay`` of every task), and what each frame past the first adds.

The drgn peer walks the committed vmcores (``corpora/<arch>/<release>/vmcore/*.elf.xz``, decompressed
to a temporary folder, or the lab's full vmcore of the same stop where it is at hand): ours opens each with
its committed slim image, drgn takes the same slim image as its kernel file and walks from a ``struct pt_regs``
of each task's registers (``benchkit.DRGN_CHILD`` mode ``regs``), so that drgn unwinds as we do: ORC on x86-64
and frame pointers on arm64, no type lookups, nothing looked up in DWARF per frame (drgn has no riscv unwinder). Both sides walk the tasks drgn walks (``benchkit.peer_keys``);
the figure is CPU µs per kernel frame over the tasks no side walked a user frame of (drgn walks on into user
frames, in the same call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import DRGN_CHILD, IMPORT_ROOT, OURS_PEER_CHILD, drgn_args, peer_cores, peer_keys, run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARCHES = ("x86_64", "arm64", "riscv")
#: the figures of each checkout, per arch
KINDS = ("first", "fresh", "warm")

OURS = IMPORT_ROOT + r"""
import json, time
from unwind.session.replay import Options, load_session
from unwind.cli.corpus import paths_under
frames = tasks = 0
fresh, warm = 0.0, None
sessions = []
for path in paths_under(sys.argv[3]):
    s = load_session(path)
    todo = s.select(every=True)
    t0 = time.process_time()
    for t in todo:
        frames += len(s.replay(t, Options(), symbolize=False).frames)
    fresh += time.process_time() - t0
    tasks += len(todo)
    sessions.append((s, todo))
for _ in range(int(sys.argv[4])):
    t0 = time.process_time()
    for s, todo in sessions:
        for t in todo:
            s.replay(t, Options(), symbolize=False)
    warm = min(warm or 1e9, time.process_time() - t0)
one = None
for _ in range(int(sys.argv[4])):  # the per-task part: each walk cut after its first frame
    t0 = time.process_time()
    for s, todo in sessions:
        for t in todo:
            s.replay(t, Options(), symbolize=False, max_frames=1)
    one = min(one or 1e9, time.process_time() - t0)
again = 0.0
for path in paths_under(sys.argv[3]):  # a new Session of each dump, its image already open
    s = load_session(path)
    todo = s.select(every=True)
    t0 = time.process_time()
    for t in todo:
        s.replay(t, Options(), symbolize=False)
    again += time.process_time() - t0
print(json.dumps({"frames": frames, "tasks": tasks, "first": fresh, "fresh": again, "warm": warm, "one": one}))
"""


def _med(runs: list[dict], key: str, frames: str = "frames") -> float:
    """Median over rounds of ``key`` per frame, in µs."""
    return statistics.median(r[key] / r[frames] * 1e6 for r in runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, help="another checkout to compare with (e.g. a worktree of main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=3, help="warm passes per child; the fastest counts (default 3)")
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeat for several (default: all)")
    p.add_argument("--corpora", type=Path, default=ROOT / "corpora", help="corpora/<arch>/ of each arch")
    p.add_argument("--drgn-python", help="a python with drgn installed: adds the drgn peer")
    p.add_argument("--vmlinux-dir", type=Path, default=Path(os.environ.get("UNWIND_CACHE", Path.home() / ".cache/unwind"))
                   / "kernels", help="<release>/vmlinux debug images for drgn (default: the lab's fetched kernels)")
    p.add_argument("--vmcores", type=Path, default=Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores")),
                   help="the lab's full vmcores, DIR/<arch>/<stop>.elf, read instead of the committed slices")
    a = p.parse_args()
    arches = a.arch or list(ARCHES)
    roots = {"new": ROOT} | ({"base": a.base.resolve()} if a.base else {})
    ours: dict[tuple[str, str], list[dict]] = {}
    peer: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cores = peer_cores(Path(tmp), arches, a.vmlinux_dir, a.vmcores) if a.drgn_python else {}
        keys = {pc: json.dumps(found[0]) for cs in cores.values() for pc in cs
                if (found := peer_keys(a.drgn_python, pc)) is not None}
        for _ in range(a.rounds):
            for arch in arches:
                for name, root in roots.items():
                    ours.setdefault((arch, name), []).append(
                        run_child(sys.executable, OURS, str(root), arch, str(a.corpora / arch), str(a.passes)))
                for pc in (pc for pc in cores.get(arch, []) if pc in keys):
                    peer.setdefault((arch, "drgn"), []).append(
                        run_child(a.drgn_python, DRGN_CHILD, *drgn_args("regs", pc, a.passes, keys[pc])))
                    for name, root in roots.items():
                        peer.setdefault((arch, name), []).append(
                            run_child(sys.executable, OURS_PEER_CHILD, str(root), arch, str(pc.core), str(pc.slim),
                                      str(a.passes), keys[pc]))
    print(f"CPU us/frame, median of {a.rounds} rounds (time.process_time in fresh child processes)\n")
    print("| arch | tasks | frames | " + " | ".join(f"{k} {n}" for n in roots for k in KINDS)
          + (" | warm new/base" if a.base else "") + " |")
    print("|---" * (3 + len(KINDS) * len(roots) + bool(a.base)) + "|")
    for arch in arches:
        runs = {n: ours[(arch, n)] for n in roots}
        r0 = runs["new"][0]
        cells = [f"{_med(runs[n], k):.2f}" for n in roots for k in KINDS]
        ratio = [f"{_med(runs['new'], 'warm') / _med(runs['base'], 'warm'):.2f}"] if a.base else []
        print(f"| {arch} | {r0['tasks']} | {r0['frames']} | " + " | ".join(cells + ratio) + " |")
    print("\nWarm, split: CPU us per task of walks cut after their first frame (max_frames=1), and us per "
          "further frame ((warm - that) / (frames - tasks)), median of rounds\n")
    print("| arch | " + " | ".join(f"per task {n} | per further frame {n}" for n in roots) + " |")
    print("|---" * (1 + 2 * len(roots)) + "|")
    for arch in arches:
        cells = []
        for n in roots:
            rs = [r for r in ours[(arch, n)] if r.get("one") is not None]  # an older checkout has no split
            cells += [f"{statistics.median(r['one'] / r['tasks'] * 1e6 for r in rs):.2f}",
                      f"{statistics.median((r['warm'] - r['one']) / (r['frames'] - r['tasks']) * 1e6 for r in rs):.2f}"] \
                if rs else ["-", "-"]
        print(f"| {arch} | " + " | ".join(cells) + " |")
    if peer:
        print("\nEqual inputs: the committed vmcores, the kernel-only tasks both drgn modes walk; warm CPU us per "
              "kernel frame (drgn with the slim image: ORC on x86-64, frame pointers on arm64)\n")
        print("| arch | tasks | frames ours / drgn | drgn | " + " | ".join(roots) + " | "
              + " | ".join(f"{n} / drgn" for n in roots) + " |")
        print("|---" * (4 + 2 * len(roots)) + "|")
        for arch in arches:
            if (arch, "drgn") not in peer:
                continue
            per_round = len(peer[(arch, "drgn")]) // a.rounds
            # several vmcores per arch: sum each round's parts, then take the median over rounds
            def total(name: str) -> list[dict]:
                rs = peer[(arch, name)]
                return [{k: sum(r[k] for r in rs[i:i + per_round]) for k in ("k_frames", "k_tasks", "k_warm")}
                        for i in range(0, len(rs), per_round)]
            d = total("drgn")
            mine = {n: total(n) for n in roots}
            dr = _med(d, "k_warm", "k_frames")
            print(f"| {arch} | {d[0]['k_tasks']} | {mine['new'][0]['k_frames']} / {d[0]['k_frames']} | {dr:.2f} | "
                  + " | ".join(f"{_med(mine[n], 'k_warm', 'k_frames'):.2f}" for n in roots) + " | "
                  + " | ".join(f"{_med(mine[n], 'k_warm', 'k_frames') / dr:.2f}" for n in roots) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
