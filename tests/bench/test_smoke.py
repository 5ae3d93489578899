"""The benches never rot: run every bench of ``benches/`` once, with tiny inputs, timing off.

``UNWIND_BENCH_QUICK=1`` shrinks every workload (``bench_orc.py`` included)
and ``--benchmark-disable`` calls each bench function once. A bench may skip
(no corpus, no peer dump, no compiler) but none may fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytest_benchmark")

REPO = Path(__file__).resolve().parents[2]


def test_every_bench_runs_once() -> None:
    env = {**os.environ, "UNWIND_BENCH_QUICK": "1"}
    env.pop("UNWIND_PEER_DUMPS", None)  # a real peer pair opens a 1 GB dump: not for the smoke run
    cmd = [sys.executable, "-m", "pytest", "benches/", "-q", "-p", "no:cacheprovider", "--benchmark-disable", "-rs"]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout, run.stdout[-2000:]
    # every arch has its synth builders now: their depth benches must run, not skip
    assert "synth builders yet" not in run.stdout, run.stdout[-3000:]
