"""Byte-identity snapshot of the ``unwind`` command line over ``corpora/``: a refactoring guard.

This is NOT a correctness oracle. It checks that every (input, mode) still prints byte for byte what
it printed when ``tests/snapshot/snapshot.json`` was recorded (before a restructure of the package):
the sha256 of stdout and stderr, the exit status and any written file, for ``replay --all`` (text,
``--json``, ``--explain``, ``--complete``, ``--reliable``), ``ps``, ``convert --all``, ``diff`` and,
per arch folder, ``triage``. A wrong trace recorded then stays "right" here. Correctness is tested
elsewhere, against the kernel's own traces, drgn and gdb (the oracles in ``corpora/``).

After an intended output change, re-record with ``python -m tests.snapshot.record`` and say so in the
commit message. To see what changed: ``python -m tests.snapshot.record --dump OLD`` on the old tree,
then ``python -m tests.snapshot.record --check --diff-against OLD`` on the new one.

One test per input (a dump, a vmcore or, for ``triage``, an arch folder), all sharing one cache folder;
``record.py`` says what is normalised before hashing (temporary paths, triage's timings).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

import pytest

from . import record

EXPECTED = record.load()


def _runs_by_input() -> dict[str, list[record.Run]]:
    runs: dict[str, list[record.Run]] = defaultdict(list)
    for r in record.all_runs():
        runs[r.input].append(r)
    return dict(runs)


RUNS = _runs_by_input()


@pytest.fixture(scope="module")
def cache() -> Iterator[str]:
    """The recorder's environment (repo root, empty cache, no image path) for the whole module."""
    with record.environment() as folder:
        yield folder


def test_snapshot_covers_exactly_the_committed_inputs() -> None:
    assert sorted(RUNS) == sorted(EXPECTED), "inputs added or removed: re-record (python -m tests.snapshot.record)"


@pytest.mark.parametrize("inp", sorted(RUNS))
def test_output_unchanged(inp: str, cache: str) -> None:
    expected: dict[str, dict[str, dict[str, Any]]] = {inp: EXPECTED.get(inp, {})}
    bad = record.mismatches(expected, record.collect(RUNS[inp], cache))
    assert not bad, "output changed:\n" + "\n".join(f"  {i} [{m}]: {what}" for i, m, what in bad)
