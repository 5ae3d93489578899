"""One warm pass of ``Session.replay(task, Options(), symbolize=False)`` over every task of an arch's corpus
dumps, or one fresh batch of them, for callgrind to count (instruction counts do not move with the load of a
shared machine)::

    valgrind --tool=callgrind --instr-atstart=no --toggle-collect=functools_reduce \\
        python benches/count_replay.py CHECKOUT ARCH [cut | keep | batch | batch-first]

``CHECKOUT`` is the tree whose ``unwind`` is imported (this one, or a worktree of main). After untimed
passes the child switches callgrind's instrumentation on (``callgrind_control -i on``: loading the dumps
is not simulated) and runs the counted part inside ``functools.reduce``, so ``--toggle-collect`` counts it
alone. With ``cut`` each walk stops after its first frame (``max_frames=1``): what a task costs whatever
its depth. With ``keep`` the pass keeps every ``Replay`` in a list, as a caller holding its results does
(``speed_peer.py``'s warm pass): the cyclic collector's collections, which the objects a pass keeps bring
on, are counted too. The tasks and frames of a whole pass are printed on stderr.

``batch`` counts one ``unwind.session.batch.replay_all(sessions, tasks=..., symbolize=False)`` over the
dumps ``corpora/ARCH/*/stop-*.bin.xz`` on sessions just opened, after one batch over sessions of the same
dumps (the images' batch memos and shared constants decided: a triage's later dumps of a kernel), as
``ab_speed.BATCH`` times it; ``batch-first`` the same after a scalar pass only (the first batch of a
process, which decides them: ``batch_replay.py``'s "batch fresh"). Set ``PYTHONHASHSEED`` for counts that
repeat.
"""

import functools
import gc
import glob
import os
import re
import subprocess
import sys
from pathlib import Path

# benchkit's child preamble, run before anything imports unwind: unwind from the checkout in argv[1]
_kit = (Path(__file__).resolve().parent / "benchkit.py").read_text()
exec(re.search(r'IMPORT_ROOT = r"""(.*?)"""', _kit, re.S).group(1), {"__name__": "count_replay_root"})

from unwind.cli.corpus import paths_under  # noqa: E402
from unwind.session.replay import Options, load_session  # noqa: E402

arch, mode = sys.argv[2], (sys.argv[3:] or ["warm"])[0]
root = Path(__file__).resolve().parents[1]


def counted(step, items) -> None:  # type: ignore[no-untyped-def]
    """``step`` over ``items``, the only part callgrind counts."""
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], stdout=subprocess.DEVNULL, check=False)
    functools.reduce(step, items, 0)


if mode in ("batch", "batch-first"):
    from unwind.session.batch import replay_all

    paths = sorted(glob.glob(str(root / "corpora" / arch / "*" / "stop-*.bin.xz")))

    def opened() -> tuple[list, list]:  # type: ignore[type-arg]
        sessions = [load_session(p) for p in paths]
        return sessions, [s.select(every=True) for s in sessions]
    sessions, tasks = opened()
    if mode == "batch":
        replay_all(sessions, tasks=tasks, symbolize=False)
    else:
        for s, ts in zip(sessions, tasks):
            for t in ts:
                s.replay(t, Options(), symbolize=False)
    sessions, tasks = opened()
    batches: list = []  # type: ignore[type-arg]
    counted(lambda n, _: batches.append(replay_all(sessions, tasks=tasks, symbolize=False)) or n, [0])
    print(arch, "dumps", len(paths), "tasks", sum(map(len, tasks)), "batched frames",
          sum(b.batched_frames for b in batches[0]), file=sys.stderr)
else:
    cut = mode == "cut"
    sessions = [load_session(p) for p in paths_under(str(root / "corpora" / arch))]
    todo = [(s, t) for s in sessions for t in s.select(every=True)]
    for _ in range(2):
        frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for s, t in todo)

    kept: list = []  # type: ignore[type-arg]
    keep = kept.append if mode == "keep" else None

    def step(n: int, st: tuple) -> int:  # type: ignore[type-arg]
        s, t = st
        replay = s.replay(t, Options(), symbolize=False, max_frames=1 if cut else None)
        if keep is not None:
            keep(replay)
        return n
    gc.collect()
    counted(step, todo)
    print(arch, "tasks", len(todo), "frames", frames, file=sys.stderr)
