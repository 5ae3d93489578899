"""The compiled build (``unwind accel``): the same output as the interpreted modules, used only when made
from the source that runs, and a clear line where it cannot be made.

The byte-for-byte check is the snapshot (``tests/snapshot``) run on the compiled build: every committed
dump and vmcore in every output mode prints what the interpreted modules printed when it was recorded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from unwind import accel

REPO = Path(__file__).resolve().parents[2]


def _run(env: dict[str, str], *args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=timeout)


def _needs_compiler() -> None:
    pytest.importorskip("Cython", reason="needs Cython (pip install '.[accel]')")
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None and shutil.which("cc") is None:
        pytest.skip(f"needs a C compiler ({cc})")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled build of this checkout's sources, in a folder of its own."""
    _needs_compiler()
    root = tmp_path_factory.mktemp("accel")
    r = _run({"UNWIND_ACCEL": str(root)}, "-m", "unwind", "accel", "build", "-j", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    return root


def test_every_module_runs_compiled_from_a_build(built: Path) -> None:
    r = _run({"UNWIND_ACCEL": str(built), "UNWIND_PURE": ""}, "-m", "unwind", "accel", "status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(accel.MODULES)
    assert all(line.startswith("compiled ") and str(built) in line for line in lines), r.stdout


def test_compiled_build_prints_what_the_snapshot_recorded(built: Path) -> None:
    r = _run({"UNWIND_ACCEL": str(built), "UNWIND_PURE": ""}, "-m", "tests.snapshot.record", "--check",
             timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_the_batch_runs_on_the_compiled_build(built: Path) -> None:
    # the lockstep batch keeps objects of the compiled modules as weak keys (a checker without an image)
    code = ("import glob\nfrom unwind import accel\nfrom unwind.session.replay import load_session\n"
            "assert accel.compiled()\n"
            "s = load_session(sorted(glob.glob('corpora/arm64/7.2.13+deb14-arm64/stop-*.bin.xz'))[0])\n"
            "batch = s.replay_all(symbolize=False, lockstep=True)\n"
            "one = [s.replay(t, symbolize=False) for t in s.select(every=True)]\n"
            "assert [[f.pc for f in r.frames] for r in batch] == [[f.pc for f in r.frames] for r in one]\n"
            "assert [str(r.stop) for r in batch] == [str(r.stop) for r in one]\n"
            "print(len(one))\n")
    r = _run({"UNWIND_ACCEL": str(built), "UNWIND_PURE": ""}, "-c", code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout) > 1


#: walks every task of one dump per arch in each mode that records more (provenance, complete, the reliable
#: walk), twice over, and prints how many frames it walked and how many objects the cyclic collector tracks
#: after each pass; a pass whose replays are all dropped must leave nothing behind
_DROPPED_REPLAYS = """
import gc, glob, sys
from unwind.core.frame import Frame
from unwind.core.target import Options
from unwind.session.replay import load_session
print(gc.is_tracked(Frame(0)))
sessions = [load_session(sorted(glob.glob(f"corpora/{arch}/*/stop-*.bin.xz"))[-1]) for arch in sys.argv[1:]]
def walk():
    n = 0
    for s in sessions:
        for t in s.select(every=True):
            for options in (Options(), Options(record=True), Options(complete=True, record=True)):
                r = s.replay(t, options, reliable=True)
                r.basis
                for f in r.frames:
                    if f.provenance is not None:
                        f.provenance.notes
                n += len(r.frames)
    gc.collect()
    return n, len(gc.get_objects())
walk()
print(*walk(), walk()[1])
"""


def test_compiled_frames_are_left_to_reference_counting_and_dropped_replays_leave_nothing(built: Path) -> None:
    # Frame is untracked by the cyclic collector when compiled (@cython.no_gc): were a reference cycle to
    # run through a frame (its provenance's notes, its extra), every replay dropped would leak that cycle
    r = _run({"UNWIND_ACCEL": str(built), "UNWIND_PURE": ""}, "-c", _DROPPED_REPLAYS, "arm64", "x86_64", "riscv")
    assert r.returncode == 0, r.stderr[-2000:]
    tracked, counts = r.stdout.splitlines()
    frames, first, second = map(int, counts.split())
    assert tracked == "False" and frames > 1000
    assert abs(second - first) < 50, (first, second)


def test_frames_are_made_without_cython_when_interpreted() -> None:
    # no Cython installed: the class decorators are the stand-ins of unwind.core.nocython
    code = ("import sys; sys.modules['cython'] = None\n"
            "import gc\n"
            "from unwind.core import frame\n"
            "assert frame.cython.__name__ == 'unwind.core.nocython' and gc.is_tracked(frame.Frame(0))\n")
    r = _run({"UNWIND_PURE": "1"}, "-c", code)
    assert r.returncode == 0, r.stderr[-2000:]


def test_pure_runs_the_sources_even_with_a_build(built: Path) -> None:
    r = _run({"UNWIND_ACCEL": str(built), "UNWIND_PURE": "1"}, "-m", "unwind", "accel", "status")
    assert r.returncode == 0, r.stderr
    assert all(line.startswith("pure ") for line in r.stdout.splitlines()), r.stdout


def test_a_build_of_other_sources_is_not_used(tmp_path: Path) -> None:
    # a build folder whose digest is not this source's: a module file there must not be loaded
    stale = tmp_path / f"{sys.implementation.cache_tag}-0000000000000000" / "unwind" / "core"
    stale.mkdir(parents=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    (stale / f"frame{suffix}").write_bytes(b"not a module")
    r = _run({"UNWIND_ACCEL": str(tmp_path), "UNWIND_PURE": ""}, "-m", "unwind", "accel", "status")
    assert r.returncode == 0, r.stderr
    assert all(line.startswith("pure ") for line in r.stdout.splitlines()), r.stdout


def test_build_without_cython_is_one_line(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['Cython'] = None; sys.modules['Cython.Build'] = None\n"
            "from unwind.__main__ import console; sys.argv = ['unwind', 'accel', 'build']; console()")
    r = _run({"UNWIND_ACCEL": str(tmp_path)}, "-c", code)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "needs Cython" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())
