"""Replaying every task of a vmcore, side by side with drgn on the same file, in the same run.

Each round runs, in fresh processes, ``unwind`` (open the vmcore and its image, then replay every task)
and drgn (``Program`` + ``load_debug_info``, then ``stack_trace`` of every ``for_each_task()``); rounds
are interleaved so load from other processes falls on both alike. Figures are medians of each child's
``time.process_time``; the ratio is drgn's time over ours. drgn comes from ``--drgn-python`` (a venv with
drgn installed), since it is not a dependency of this project::

    python benches/vmcore_tasks.py VMCORE VMLINUX --arch x86_64 --drgn-python /path/to/venv/bin/python

Also prints the size ``unwind convert --all`` makes of it (plain and ``.xz``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the children import this checkout's unwind (and, for drgn, unwind.lab.translations)
_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

OURS = """
import json, sys, time
t0 = time.process_time()
from unwind.session.replay import Session
s = Session.load(sys.argv[1], vmlinux=sys.argv[2])
t1 = time.process_time()
frames = sum(len(s.replay(t).frames) for t in s.select(every=True))
print(json.dumps({"open": t1 - t0, "walk": time.process_time() - t1, "tasks": len(s.select(every=True)),
                  "frames": frames}))
"""

DRGN = """
import json, os, sys, time
os.environ.setdefault("DRGN_PREFER_ORC_UNWINDER", "1")
t0 = time.process_time()
from drgn.helpers.linux.pid import for_each_task
from unwind.lab.translations import drgn_program
prog = drgn_program(sys.argv[1], sys.argv[2], sys.argv[3])
t1 = time.process_time()
tasks = frames = 0
for t in for_each_task(prog):
    try:
        frames += len(prog.stack_trace(t))
        tasks += 1
    except Exception:
        pass
print(json.dumps({"open": t1 - t0, "walk": time.process_time() - t1, "tasks": tasks, "frames": frames}))
"""


def _run(python: str, code: str, *args: str) -> dict[str, float]:
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, check=True, env=_ENV)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vmcore")
    p.add_argument("vmlinux")
    p.add_argument("--arch", required=True, choices=["x86_64", "arm64", "riscv"])
    p.add_argument("--drgn-python", help="a python with drgn (omit to time unwind alone)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"unwind": [], "drgn": []}
    for _ in range(a.rounds):
        runs["unwind"].append(_run(sys.executable, OURS, a.vmcore, a.vmlinux))
        if a.drgn_python:
            runs["drgn"].append(_run(a.drgn_python, DRGN, a.vmcore, a.vmlinux, a.arch))
    print(f"{Path(a.vmcore).name} ({Path(a.vmcore).stat().st_size / 2**20:.0f} MiB), {a.rounds} rounds, "
          "median CPU s\n\n| tool | open | walk all tasks | tasks | frames |\n|---|---|---|---|---|")
    med = {}
    for tool, rs in runs.items():
        if rs:
            med[tool] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            m = med[tool]
            print(f"| {tool} | {m['open']:.2f} | {m['walk']:.3f} | {m['tasks']:.0f} | {m['frames']:.0f} |")
    if "drgn" in med:
        print(f"\ndrgn / unwind: open {med['drgn']['open'] / med['unwind']['open']:.2f}, "
              f"walk {med['drgn']['walk'] / med['unwind']['walk']:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("all.bin", "all.bin.xz"):
            out = Path(tmp) / name
            subprocess.run([sys.executable, "-m", "unwind", "convert", a.vmcore, "--vmlinux", a.vmlinux, "--all",
                            "-o", str(out)], check=True, capture_output=True, env=_ENV)
            print(f"convert --all -> {name}: {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
