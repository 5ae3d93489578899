"""Running the benchmarks: the pytest-benchmark suite of ``benches/`` and the speed scripts beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .results import BenchError
from .speed import SPEED_SCRIPTS

def find_benches(explicit: str | None) -> Path:
    """The ``benches/`` folder: ``--benches``, else ``./benches``, else the one beside the package."""
    here = Path(__file__).resolve().parents[3] / "benches"
    cands = [Path(explicit)] if explicit else [Path.cwd() / "benches", here]
    for c in cands:
        if (c / "benchkit.py").is_file():
            return c
    raise BenchError("no benches/ folder found (run from the source tree, or give --benches DIR; "
                     "--from-json F reports a saved run)")


def run_suite(benches: Path, json_out: Path, quick: bool, select: str | None, cpu_time: bool) -> int:
    """Run ``pytest benches/`` writing ``json_out``; pytest's progress goes to stderr. Its exit status.

    ``cpu_time`` times with ``time.process_time`` instead of the wall clock.
    """
    try:
        import pytest_benchmark  # noqa: F401
    except ImportError:
        raise BenchError("running the suite needs pytest-benchmark: pip install '.[report]'") from None
    benches = benches.resolve()
    cmd = [sys.executable, "-m", "pytest", str(benches), "-p", "no:cacheprovider", "-v", "-rs",
           f"--benchmark-json={json_out.resolve()}", "--benchmark-columns=median,rounds"]
    if select:
        cmd += ["-k", select]
    if cpu_time:
        cmd.append("--benchmark-timer=time.process_time")
    env = dict(os.environ)
    if quick:
        env["UNWIND_BENCH_QUICK"] = "1"
    print(f"unwind bench: {' '.join(cmd)}", file=sys.stderr, flush=True)
    # run inside benches/: from the source tree's root, its unwind/ folder would shadow an installed package
    return subprocess.run(cmd, cwd=benches, stdout=sys.stderr, env=env).returncode


def run_speed_scripts(benches: Path, out: Path, drgn_python: str | None, rounds: int) -> None:
    """Run the speed scripts of ``benches/`` (those present), each writing its JSON into ``out``."""
    for script, name in SPEED_SCRIPTS:
        path = benches / script
        if not path.is_file():
            print(f"unwind bench: {script} not found: its rows are not measured", file=sys.stderr)
            continue
        cmd = [sys.executable, str(path), "--json", str((out / name).resolve())]
        if script != "profile_replay.py":  # a profile is one pass, and drgn is not profiled
            cmd += ["--rounds", str(rounds)] + (["--drgn-python", drgn_python] if drgn_python else [])
        print(f"unwind bench: {' '.join(cmd)}", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=benches, stdout=sys.stderr)
