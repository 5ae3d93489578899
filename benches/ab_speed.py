"""This checkout against another one (``--base``) on what a user pays: warm replay with and without symbols,
a fresh lockstep batch, and fleet triage per dump, in CPU time.

Every figure comes from a fresh child process; the children of the two checkouts alternate, figure by
figure and round by round, so load from other processes falls on both alike. Medians over rounds::

    git worktree add --detach /tmp/base main
    python benches/ab_speed.py --base /tmp/base --rounds 3

- **warm** / **warm+symbols**: ``Session.replay(task, Options(), symbolize=False)`` (``True``) over every task
  of every committed dump of an arch, after two untimed passes; the fastest of ``--passes`` passes, CPU µs
  per frame;
- **batch fresh**: :func:`unwind.session.batch.replay_all` over every dump of an arch on sessions just
  opened (lane inputs, per-dump constants, call-site flags, stops), M frames walked per CPU second;
- **triage**: ``unwind.cli.triage.triage_dump`` of every committed dump in one process (each dump opened,
  every task replayed with symbols and bucketed), after one untimed pass that fills the caches: dumps and
  tasks per CPU second (one core).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import IMPORT_ROOT, run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARCHES = ("x86_64", "arm64", "riscv")

WARM = IMPORT_ROOT + r"""
import json, time
from unwind.session.replay import Options, load_session
from unwind.cli.corpus import paths_under
sym = sys.argv[4] == "1"
sessions = [load_session(p) for p in paths_under(sys.argv[3])]
todo = [(s, t) for s in sessions for t in s.select(every=True)]
for _ in range(2):
    frames = sum(len(s.replay(t, Options(), symbolize=sym).frames) for s, t in todo)
best = 1e9
for _ in range(int(sys.argv[5])):
    t0 = time.process_time()
    for s, t in todo:
        s.replay(t, Options(), symbolize=sym)
    best = min(best, time.process_time() - t0)
print(json.dumps({"tasks": len(todo), "frames": frames, "cpu": best}))
"""

BATCH = IMPORT_ROOT + r"""
import gc, glob, importlib, json, time
from unwind.session.batch import replay_all
from unwind.session.replay import load_session
importlib.import_module("unwind.arch." + sys.argv[2] + ".batch")
paths = sorted(glob.glob(sys.argv[3] + "/*/stop-*.bin.xz"))
def opened():
    sessions = [load_session(p) for p in paths]
    return sessions, [s.select(every=True) for s in sessions]
s, t = opened()
replay_all(s, tasks=t, symbolize=False)  # the images' decoding and call-site verdicts are not the batch's
s, t = opened()
gc.collect()
t0 = time.process_time()
batches = replay_all(s, tasks=t, symbolize=False)
cpu = time.process_time() - t0
print(json.dumps({"frames": sum(b.batched_frames for b in batches), "cpu": cpu}))
"""

TRIAGE = IMPORT_ROOT + r"""
import glob, json, time
from unwind.cli.triage import triage_dump
paths = sorted(glob.glob(sys.argv[3] + "/*/*/stop-*.bin.xz"))
for p in paths:
    triage_dump(p)
best, tasks = 1e9, 0
for _ in range(int(sys.argv[4])):
    t0 = time.process_time()
    tasks = sum(d.tasks or 0 for p in paths for d in triage_dump(p).dumps)
    best = min(best, time.process_time() - t0)
print(json.dumps({"dumps": len(paths), "tasks": tasks, "cpu": best}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the other checkout (e.g. a worktree of main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=5, help="warm passes per child; the fastest counts (default 5)")
    p.add_argument("--corpora", type=Path, default=ROOT / "corpora", help="corpora/<arch>/ of each arch")
    a = p.parse_args()
    roots = {"base": a.base.resolve(), "new": ROOT}
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for r in range(a.rounds):
        for arch in ARCHES:
            corpus = str(a.corpora / arch)
            for kind, code, args in (("warm", WARM, (corpus, "0", str(a.passes))),
                                     ("warm+symbols", WARM, (corpus, "1", str(a.passes))),
                                     ("batch fresh", BATCH, (corpus,))):
                for name, root in roots.items():
                    runs.setdefault((kind, arch, name), []).append(run_child(sys.executable, code, str(root), arch, *args))
        for name, root in roots.items():
            runs.setdefault(("triage", "all", name), []).append(
                run_child(sys.executable, TRIAGE, str(root), "all", str(a.corpora), "3"))
        print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)

    def med(kind: str, arch: str, name: str, f) -> float:  # type: ignore[no-untyped-def]
        return statistics.median(f(x) for x in runs[(kind, arch, name)])

    print(f"CPU time, median of {a.rounds} rounds (time.process_time in fresh child processes)\n")
    print("| figure | arch | base | new | new/base |\n|---|---|---|---|---|")
    for kind, unit, f in (("warm", "µs/frame", lambda x: x["cpu"] / x["frames"] * 1e6),
                          ("warm+symbols", "µs/frame", lambda x: x["cpu"] / x["frames"] * 1e6),
                          ("batch fresh", "M frames/s", lambda x: x["frames"] / x["cpu"] / 1e6)):
        for arch in ARCHES:
            b, n = med(kind, arch, "base", f), med(kind, arch, "new", f)
            print(f"| {kind} ({unit}) | {arch} | {b:.2f} | {n:.2f} | {n / b:.2f} |")
    for unit, key in (("dumps/s", "dumps"), ("tasks/s", "tasks")):
        b = med("triage", "all", "base", lambda x: x[key] / x["cpu"])
        n = med("triage", "all", "new", lambda x: x[key] / x["cpu"])
        print(f"| triage ({unit}, one core) | all | {b:.1f} | {n:.1f} | {n / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
