"""One warm pass of ``Session.replay(task, Options(), symbolize=False)`` over every task of an arch's corpus
dumps, for callgrind to count (instruction counts do not move with the load of a shared machine)::

    valgrind --tool=callgrind --instr-atstart=no --toggle-collect=functools_reduce \\
        python benches/count_replay.py CHECKOUT ARCH [cut]

``CHECKOUT`` is the tree whose ``unwind`` is imported (this one, or a worktree of main). After two untimed
passes the child switches callgrind's instrumentation on (``callgrind_control -i on``: loading the dumps
is not simulated) and runs the counted pass inside ``functools.reduce``, so ``--toggle-collect`` counts it
alone. With ``cut`` each walk stops after its first frame (``max_frames=1``): what a task costs whatever
its depth. The tasks and frames of a whole pass are printed on stderr.
"""

import functools
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

arch, cut = sys.argv[2], sys.argv[3:] == ["cut"]
root = Path(__file__).resolve().parents[1]
sessions = [load_session(p) for p in paths_under(str(root / "corpora" / arch))]
todo = [(s, t) for s in sessions for t in s.select(every=True)]
for _ in range(2):
    frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for s, t in todo)


def step(n: int, st: tuple) -> int:  # type: ignore[type-arg]
    s, t = st
    s.replay(t, Options(), symbolize=False, max_frames=1 if cut else None)
    return n


subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], stdout=subprocess.DEVNULL, check=False)
functools.reduce(step, todo, 0)
print(arch, "tasks", len(todo), "frames", frames, file=sys.stderr)
