"""Real-data acceptance: every arm64 dump under ``corpora/arm64/`` against its stored oracles.

- blocked tasks: the faithful replay equals the kernel's own ``sysrq-t`` trace, pc for pc;
- running CPUs: equal to ``dump_backtrace``/``sysrq-l`` printouts, and every difference from gdb or drgn
  falls in a documented category (``Arm64Backend.CATEGORIES``); complete mode equals gdb wherever the
  image has the text to prove the x30 callers.

The dumps and slim images are written by the real-kernel lab; the tests skip until they exist. Images
are found by build-id beside the dumps, on ``$UNWIND_IMAGE_PATH``, or (local runs) in the lab's cache.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from unwind.arch.arm64.backend import CATEGORIES
from unwind.formats.image import IMAGE_PATH_ENV
from unwind.session.replay import load_session
from unwind.core.target import Options
from tests.corpus_checks import assert_blocked_tasks_equal_sysrq_t, running_cpu_results
from unwind.cli.corpus import paths_under

CORPUS = Path(__file__).resolve().parents[3] / "corpora" / "arm64"
LAB_CACHE = Path.home() / ".cache" / "unwind" / "kernels"
DUMPS = paths_under(CORPUS) if CORPUS.is_dir() else []

pytestmark = pytest.mark.skipif(not DUMPS, reason=f"no arm64 dumps under {CORPUS} yet (written by the real-kernel lab)")

#: per oracle source, category counts over the whole corpus (printed at the end of the module)
COUNTS: dict[str, Counter[str]] = {}


@pytest.fixture(scope="module", autouse=True)
def image_path():
    """Let replay find a full vmlinux in the lab's cache when no slim image sits beside the dumps."""
    old = os.environ.get(IMAGE_PATH_ENV)
    extra = [str(p) for p in sorted(LAB_CACHE.glob("*arm64*")) if p.is_dir()]
    os.environ[IMAGE_PATH_ENV] = os.pathsep.join(([old] if old else []) + extra)
    yield
    if old is None:
        os.environ.pop(IMAGE_PATH_ENV, None)
    else:
        os.environ[IMAGE_PATH_ENV] = old
    for source, c in sorted(COUNTS.items()):
        print(f"\narm64 corpus {source}: {sum(c.values())} traces: {dict(sorted(c.items()))}")


def _name(path: str) -> str:
    return str(Path(path).relative_to(CORPUS))


@pytest.mark.parametrize("dump", DUMPS, ids=_name)
def test_blocked_tasks_equal_sysrq_t(dump):
    assert_blocked_tasks_equal_sysrq_t(dump, COUNTS)


@pytest.mark.parametrize("dump", DUMPS, ids=_name)
def test_running_cpus_within_documented_categories(dump):
    session = load_session(dump)
    has_text = session.image is not None and session.image.has_text
    for res, detail in running_cpu_results(session, COUNTS):
        assert res.category == "exact" or res.category in CATEGORIES, detail
        if res.source in ("gdb", "drgn") and has_text:
            assert res.category != "entry-or-leaf", f"complete mode should have proven it: {detail}"


@pytest.mark.parametrize("dump", DUMPS[:3], ids=_name)
def test_complete_mode_keeps_every_faithful_frame_on_real_data(dump):
    from unwind.core.frame import Flag

    session = load_session(dump)
    for task in session.dump.tasks():
        faithful = session.replay(task, Options(), symbolize=False)
        complete = session.replay(task, Options(complete=True, record=True), symbolize=False)
        kept = [f.pc for f in complete.frames if not f.flags & Flag.COMPLETE]
        assert kept == [f.pc for f in faithful.frames], task.describe()
        assert complete.stop.reason is faithful.stop.reason


def test_cli_explain_on_a_real_dump(capsys):
    from unwind.cli.main import main

    # a 6.12 dump: QEMU ran it with 52-bit VA (the 6.1 sample's kernel is built for 48)
    dump = next(d for d in DUMPS if "/6.12." in d)
    assert main(["replay", dump, "--all", "--explain", "--complete"]) == 0
    out = capsys.readouterr().out
    assert "Call trace:" in out and "record.lr (raw)" in out and "PAC mask 0xfff0000000000000" in out
