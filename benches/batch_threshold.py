"""Where a lockstep batch starts to pay when every replay is read: the measurement behind
``unwind.session.batch.MIN_TASKS``.

The committed dumps of an arch (``corpora/<arch>/*/stop-*.bin.xz``) are cut into groups of K consecutive
dumps. For each K the child times, over all the groups, ``replay_all(group, tasks=..., lockstep=True)`` with
every replay read against ``Session.replay`` of the same tasks one by one (symbols on in both, as
``unwind replay --all`` and ``replay_all`` name frames), on sessions opened once and walked once untimed.
The two alternate round by round; each figure is the fewest CPU seconds (``time.process_time``) of
``--rounds``. The ratio batch / loop below 1 means the batch pays at that size::

    python benches/batch_threshold.py --rounds 7 --sizes 1 2 3 4 6 --json out.json

It measures the build the child imports: the compiled one where ``unwind accel build`` made it, the
pure modules with ``UNWIND_PURE=1``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import ARCHES, IMPORT_ROOT, REPO, run_child  # noqa: E402

CHILD = IMPORT_ROOT + r"""
import gc, glob, json, time
from unwind import accel
from unwind.session.batch import replay_all
from unwind.session.replay import load_session
arch, rounds, sizes = sys.argv[2], int(sys.argv[3]), [int(k) for k in sys.argv[4].split(",")]
paths = sorted(glob.glob(sys.argv[5] + "/" + arch + "/*/stop-*.bin.xz"))
sessions = [load_session(p) for p in paths]
tasks = [s.select(every=True) for s in sessions]
def loop(group):
    return sum(len(s.replay(t).frames) for s, ts in group for t in ts)
def batch(group):
    return sum(len(r.frames) for b in replay_all([s for s, _ in group], tasks=[ts for _, ts in group], lockstep=True)
               for r in b)
out = {"compiled": accel.compiled(), "dumps": len(paths)}
for k in sizes:
    groups = [list(zip(sessions[i:i + k], tasks[i:i + k])) for i in range(0, len(paths) - k + 1, k)]
    best = {"loop": 1e9, "batch": 1e9}
    frames = {}
    for n in range(rounds + 1):  # the first round is untimed: images, verdicts and memos decided
        for name, walk in (("loop", loop), ("batch", batch)) if n % 2 else (("batch", batch), ("loop", loop)):
            gc.collect()
            t = time.process_time()
            frames[name] = sum(walk(g) for g in groups)
            if n:
                best[name] = min(best[name], time.process_time() - t)
    assert frames["loop"] == frames["batch"], frames
    out[str(k)] = {"groups": len(groups), "tasks": sum(len(ts) for g in groups for _, ts in g) // len(groups),
                   "frames": frames["loop"], **best}
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--rounds N --sizes K... --arch A... --corpora DIR --json OUT``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 6], help="dumps per batch")
    p.add_argument("--arch", action="append", choices=ARCHES, help="default: every arch")
    p.add_argument("--corpora", type=Path, default=REPO / "corpora")
    p.add_argument("--json", type=Path, help="write the children's figures here")
    a = p.parse_args(argv)
    if a.rounds < 1 or min(a.sizes) < 1:
        p.error("--rounds and --sizes must be at least 1")
    results = {arch: run_child(sys.executable, CHILD, str(REPO), arch, str(a.rounds), ",".join(map(str, a.sizes)),
                               str(a.corpora)) for arch in a.arch or ARCHES}
    build = {r["compiled"] for r in results.values()}
    print(f"batch + read / Session.replay loop, every replay read, symbols on; fewest CPU seconds of {a.rounds} "
          f"rounds ({'compiled' if build == {True} else 'pure' if build == {False} else 'mixed'} build)\n")
    arches = list(results)
    print("| dumps per batch (tasks) | " + " | ".join(arches) + " |")
    print("|---|" + "---|" * len(arches))
    for k in a.sizes:
        rows = [results[arch].get(str(k)) for arch in arches]
        tasks = sorted({r["tasks"] for r in rows if r})
        span = f"{tasks[0]}-{tasks[-1]}" if len(tasks) > 1 else str(tasks[0]) if tasks else "-"
        print(f"| {k} ({span}) | " + " | ".join(f"{r['batch'] / r['loop']:.2f}" if r else "-" for r in rows) + " |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
