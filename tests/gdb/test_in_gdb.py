"""``unwind gdb`` in a real gdb-multiarch over the committed dumps: ``bt`` of thread N gives the pcs of
``unwind replay DUMP --cpu N-1``, ``unwind-bt`` the trace ``unwind replay --task PID`` prints (skipped,
naming it, where gdb-multiarch is not installed; the whole corpus with --slow)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unwind.session.replay import Session

from .ingdb import _MARK, GDB, REPO, bt_pcs, compare, decompressed, frames_registers, image_of, run_gdb
from .test_glue import BOUNDARIES, pt_regs_checked

needs_gdb = pytest.mark.skipif(shutil.which(GDB) is None, reason=f"{GDB} not installed (Debian package {GDB})")
#: one dump per arch, the default suite's share
SAMPLE = ["corpora/x86_64/6.12.117+deb13-amd64/stop-004-random.bin.xz",
          "corpora/arm64/6.12.117+deb13-arm64/stop-011-hijack-read_zero.bin.xz",
          "corpora/riscv/6.12.117+deb13-riscv64/stop-000-random.bin.xz"]
ALL = sorted(str(p.relative_to(REPO)) for p in REPO.glob("corpora/*/*/stop-*.bin.xz"))


def _check(dump: str, tmp_path: Path) -> None:
    got = compare(REPO / dump, tmp_path)
    assert got.cpus, "no running CPU compared"
    assert not got.cpu_mismatch, got.cpu_mismatch
    assert got.tasks and not got.task_mismatch, got.task_mismatch


@needs_gdb
@pytest.mark.parametrize("dump", SAMPLE, ids=lambda d: d.split("/")[1])
def test_gdb_walks_as_replay(dump: str, tmp_path: Path) -> None:
    _check(dump, tmp_path)


@needs_gdb
@pytest.mark.slow
@pytest.mark.parametrize("dump", ALL, ids=lambda d: "/".join(d.split("/")[1:]))
def test_gdb_walks_as_replay_whole_corpus(dump: str, tmp_path: Path) -> None:
    _check(dump, tmp_path)


def test_gdb_of_another_python_is_refused_saying_which(tmp_path: Path) -> None:
    fake = tmp_path / "gdb"
    fake.write_text("#!/bin/sh\necho python=3.99\n")
    fake.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "unwind", "gdb", "--gdb", str(fake), "-batch"], capture_output=True,
                       text=True, timeout=120)
    ours = "%d.%d" % sys.version_info[:2]
    assert r.returncode == 2
    assert r.stderr == (f"unwind: error: {fake} embeds Python 3.99, unwind runs on Python {ours}: install unwind "
                        "for Python 3.99 (its compiled dependencies load in one version only)\n")


@needs_gdb
@pytest.mark.parametrize("dump", BOUNDARIES, ids=lambda d: "/".join(d.split("/")[1:3]))
def test_info_registers_after_exception_is_the_saved_pt_regs(dump: str, tmp_path: Path) -> None:
    """``frame N`` + ``info registers`` in gdb-multiarch, for a frame past an exception boundary: the words
    of the ``pt_regs`` the kernel saved there, read from the dump file."""
    path = REPO / dump
    session = Session.load(path)
    core, image = decompressed(path, tmp_path), decompressed(image_of(path), tmp_path)

    def frames_of(task):
        return frames_registers(image, core, task.cpu, len(session.replay(task).frames))

    assert pt_regs_checked(session, frames_of) >= 1


@needs_gdb
def test_thread_apply_all_bt_ends_each_walk_without_an_error(tmp_path: Path) -> None:
    """``thread apply all bt`` prints each CPU's whole walk: its last frame ends gdb's backtrace without the
    error "PC not saved", which made ``thread apply`` print that line alone instead of the thread's frames."""
    dump = REPO / SAMPLE[0]
    session = Session.load(dump)
    core, image = decompressed(dump, tmp_path), decompressed(image_of(dump), tmp_path)
    out = run_gdb(image, core, ["thread apply all bt"])
    assert "PC not saved" not in out
    threads = re.split(r"^Thread (\d+) \(.*\):$", out.split(_MARK)[-1], flags=re.M)
    got = {int(num) - 1: bt_pcs(body, 0) for num, body in zip(threads[1::2], threads[2::2])}
    running = [t for t in session.dump.tasks() if t.running]
    assert sorted(got) == sorted(t.cpu for t in running)
    for t in running:
        assert got[t.cpu] == [f.pc for f in session.replay(t).frames], t.describe()
