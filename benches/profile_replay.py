"""Where a warm single-task replay spends its time: cProfile, per arch, for the benchmark report.

For each arch, a fresh child process opens every committed dump of ``corpora/<arch>/``, replays every
task once untimed (``--warm-passes``; images decoded, call-site verdicts made), then profiles one pass
of ``Session.replay(task, Options(), symbolize=False)`` over every task, as ``speed_peer.py`` times it.
The JSON keeps the ``--top`` functions by cumulative time (calls, cumulative and own seconds) and
the six with the most time of their own. cProfile
adds a fixed cost to every call, so many short calls look dearer than they are; the shares say where
the time goes, not what a pass costs (``speed_peer.py`` says that)::

    python benches/profile_replay.py --json out/profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import ARCHES, IMPORT_ROOT, REPO, run_child  # noqa: E402

PROFILE = IMPORT_ROOT + r"""
import cProfile, glob, json, os, pstats
from unwind.session.replay import Options, load_session
paths = sorted(glob.glob(sys.argv[3] + "/*/stop-*.bin.xz"))
sessions = [load_session(p) for p in paths]
todo = [(s, t) for s in sessions for t in s.select(every=True)]
for _ in range(int(sys.argv[4])):
    frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for s, t in todo)
def one_pass():
    for s, t in todo:
        s.replay(t, Options(), symbolize=False)
prof = cProfile.Profile()
prof.runcall(one_pass)
stats = pstats.Stats(prof)
def label(func):
    path, line, name = func
    if path == "~":
        return name
    for root in (ROOT + "/", os.path.dirname(os.__file__) + "/"):
        if path.startswith(root):
            path = path[len(root):]
    return f"{path}:{line} {name}"
rows = sorted(stats.stats.items(), key=lambda kv: kv[1][3], reverse=True)
top = [{"function": label(f), "calls": nc, "own": tt, "cumulative": ct} for f, (cc, nc, tt, ct, _) in rows
       if f[2] != "one_pass"][:int(sys.argv[5])]
own = [{"function": label(f), "calls": nc, "own": tt, "cumulative": ct}
       for f, (cc, nc, tt, ct, _) in sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)][:6]
total = next(ct for f, (cc, nc, tt, ct, _) in rows if f[2] == "one_pass")
print(json.dumps({"tasks": len(todo), "frames": frames, "total": total, "top": top, "top_own": own}))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeat for several (default: all)")
    p.add_argument("--corpora", type=Path, default=REPO / "corpora", help="corpora/<arch>/ of each arch")
    p.add_argument("--warm-passes", type=int, default=1, help="untimed passes before the profiled one (default 1)")
    p.add_argument("--top", type=int, default=12, help="functions kept per arch (default 12)")
    p.add_argument("--json", type=Path, help="write the profile here")
    a = p.parse_args(argv)
    out = {"warm_passes": a.warm_passes, "arches": {}}
    for arch in a.arch or list(ARCHES):
        if not (a.corpora / arch).is_dir():
            continue
        r = run_child(sys.executable, PROFILE, str(REPO), arch, str(a.corpora / arch), str(a.warm_passes), str(a.top))
        out["arches"][arch] = r
        print(f"\n{arch}: {r['tasks']} tasks, {r['frames']} frames, {r['total'] * 1e3:.0f} ms under cProfile")
        for row in r["top"]:
            print(f"  {row['cumulative'] / r['total']:5.0%} {row['own'] / r['total']:5.0%} {row['calls']:>9,} "
                  f"{row['function']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
