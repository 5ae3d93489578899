"""``unwind triage`` on one core over the committed corpora: dumps/s and tasks/s per CPU second.

Runs the whole command as a user does, ``unwind triage --workers 1 --no-progress corpora/`` (its
imports, every dump opened and every task replayed and bucketed, in-process), ``--rounds`` times, each a
fresh process; the CPU time is the child's user + system (``resource.RUSAGE_CHILDREN``), the wall time
beside it; dumps and tasks are the command's own counts (its ``--json``). Figures are medians over
rounds::

    python benches/triage_throughput.py --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def unwind_command() -> list[str]:
    """``unwind`` of this Python: the console script beside it, else ``python -m unwind``."""
    script = Path(sys.executable).with_name("unwind")
    return [str(script)] if script.exists() else [sys.executable, "-m", "unwind"]


def triage_once(corpora: Path, out: Path) -> dict[str, Any]:
    """One ``unwind triage --workers 1 --no-progress --json OUT CORPORA``: its CPU and wall time, dumps, tasks."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    r = subprocess.run([*unwind_command(), "triage", "--workers", "1", "--no-progress", "--json", str(out),
                        str(corpora)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"unwind triage failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    got = json.loads(out.read_text())
    failed = got["dumps"]["failed"]
    return {"cpu": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, "wall": wall,
            "dumps": got["dumps"]["ok"], "failed": len(failed) if isinstance(failed, list) else failed,
            "failed_why": sorted({d.get("error", "") for d in failed}) if isinstance(failed, list) else [],
            "tasks": got["tasks"]}


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--rounds N --corpora DIR --json OUT``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--corpora", type=Path, default=ROOT / "corpora")
    p.add_argument("--json", type=Path, help="write every round's figures here")
    p.add_argument("--drgn-python", help=argparse.SUPPRESS)  # unwind bench --speed passes it to every script
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [triage_once(a.corpora, Path(tmp) / "triage.json") for _ in range(a.rounds)]
    git = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty=+"], capture_output=True, text=True)
    out = {"rounds": a.rounds, "command": "unwind triage --workers 1 --no-progress corpora/",
           "commit": git.stdout.strip() or None, "load": list(os.getloadavg()), "runs": runs}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    cpu, wall = statistics.median(r["cpu"] for r in runs), statistics.median(r["wall"] for r in runs)
    r0 = runs[0]
    print(f"{out['command']}: {r0['dumps']} dumps ({r0['failed']} failed), {r0['tasks']} tasks; median of "
          f"{a.rounds}: {cpu:.2f} s CPU, {wall:.2f} s wall; {r0['dumps'] / cpu:.1f} dumps/s and "
          f"{r0['tasks'] / cpu:,.0f} tasks/s per core (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
