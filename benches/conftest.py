"""pytest plumbing for ``benches/``: collect ``bench_*.py``, name the machine, keep the skips.

``pytest benches/`` collects every ``bench_*.py`` here (the project's
``testpaths`` stay ``tests/``). The saved pytest-benchmark JSON gains:

- ``machine_info.unwind``: CPU model, cores, Python and numpy versions;
- top-level ``unwind``: the skipped and failed benches with their reasons, quick mode,
  the commit and the 1-minute load average at the start and the end, so that
  ``unwind bench --from-json`` can say what was not measured, and how busy
  the machine was.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import benchkit

# the source tree's root last on the path: benches may use the tests' helpers (tests.vmcore.phys)
# while an installed unwind still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))

_SKIPS: list[dict[str, str]] = []
_FAILS: list[dict[str, str]] = []
_LOAD: dict[str, float] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the load before the run: other processes on the machine slow every bench."""
    _LOAD["start"] = os.getloadavg()[0]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect ``bench_*.py`` as test modules (pytest itself collects those named on the command line)."""
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember each skipped or failed bench and why."""
    if report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPS.append({"bench": report.nodeid, "reason": reason.removeprefix("Skipped: ")})
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        _FAILS.append({"bench": report.nodeid, "reason": crash.message if crash else str(report.longrepr)[:300]})


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(benchkit.REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """Name the machine as the report does."""
    machine_info["unwind"] = {"cpu_model": cpu_model(), "cores": os.cpu_count(),
                              "python": platform.python_version(), "numpy": np.__version__}


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list[dict[str, Any]],
                                 output_json: dict[str, Any]) -> None:
    """Store the skips, failures, quick mode, the commit and the load beside the results."""
    output_json["unwind"] = {"skipped": list(_SKIPS), "failed": list(_FAILS), "quick": benchkit.QUICK,
                             "commit": _commit(), "load": {**_LOAD, "end": os.getloadavg()[0]}}

