"""Command-line edges: pipes, --version, --debug placement, --arch aliases, --max-frames,
options that cannot apply, a forced ORC version the image contradicts."""

from __future__ import annotations

import io
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.session.replay import ReplayError

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "corpora/x86_64/6.12.117+deb13-amd64"
ARM64 = ROOT / "corpora/arm64/6.12.117+deb13-arm64"
RISCV = ROOT / "corpora/riscv/6.12.117+deb13-riscv64"


@pytest.mark.parametrize("argv", [["replay", "--all", "--explain", str(X86 / "stop-000-random.bin.xz")],
                                  ["replay", "--all", "--json", str(X86 / "stop-000-random.bin.xz")]],
                         ids=["text", "json"])
def test_a_closed_pipe_ends_quietly(argv):
    """Both outputs are larger than a pipe's buffer, so the writer must meet the closed pipe."""
    p = subprocess.Popen([sys.executable, "-m", "unwind", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT)
    assert p.stdout is not None and p.stdout.readline()   # like `| head -1`
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0 and err.decode().strip() == ""


class _ClosedAfterOneLine(io.TextIOBase):
    """A stdout whose reader goes away after the first line."""

    def __init__(self) -> None:
        self.lines = 0

    def write(self, text: str) -> int:
        if self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines += text.count("\n")
        return len(text)


def test_diff_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedAfterOneLine())
    assert main(["diff", "-v", str(X86 / "stop-014-hijack-urandom_read_iter.bin.xz")]) == 0
    assert capsys.readouterr().err == ""


def test_version_is_the_distributions(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"unwind (kernel-unwind) {metadata.version('kernel-unwind')}"


def test_debug_after_the_subcommand_shows_the_traceback(capsys):
    argv = ["replay", str(X86 / "stop-004-random.bin.xz"), "--task", "999999"]
    assert main(argv) == 2 and "--task 999999 matched no task" in capsys.readouterr().err
    with pytest.raises(ReplayError):
        main([*argv, "--debug"])
    with pytest.raises(ReplayError):
        main(["--debug", *argv])


@pytest.mark.parametrize("alias", ["x86_64", "x86", "amd64", "X86-64"])
def test_arch_aliases(alias, capsys):
    assert main(["replay", "--arch", alias, "--cpu", "1", str(X86 / "stop-004-random.bin.xz")]) == 0


def test_arch_alias_of_another_arch_is_refused(capsys):
    assert main(["replay", "--arch", "aarch64", str(X86 / "stop-004-random.bin.xz")]) == 2
    assert "disagrees with the dump, which is x86_64" in capsys.readouterr().err


def test_max_frames_floor_and_limit(capsys):
    with pytest.raises(SystemExit) as e:
        main(["replay", "--max-frames", "0", str(ARM64 / "stop-002-irq-arch_timer_handler_virt.bin.xz")])
    assert e.value.code == 2 and "at least 1" in capsys.readouterr().err
    assert main(["replay", "--max-frames", "1", "--cpu", "0",
                 str(ARM64 / "stop-002-irq-arch_timer_handler_virt.bin.xz")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "Call trace:" and len(out) == 4 and "frame limit reached: 1 frames (ERROR)" in out[-1]


@pytest.mark.parametrize("dump,argv,why", [
    (ARM64 / "stop-004-random.bin.xz", ["--orc-version", "3"], "--orc-version does not apply to arm64"),
    (RISCV / "stop-004-random.bin.xz", ["--orc-version", "3"], "--orc-version does not apply to riscv"),
    (X86 / "stop-004-random.bin.xz", ["--user"], "--user does not apply to x86_64 dumps (only riscv)"),
    (ARM64 / "stop-004-random.bin.xz", ["--user"], "--user does not apply to arm64"),
])
def test_options_that_cannot_apply_are_refused(dump, argv, why, capsys):
    assert main(["replay", str(dump), *argv]) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1


def test_forced_orc_version_against_the_orc_header(capsys):
    """The image's .orc_header hash is v3 (fe5d32bf..., scripts/orc_hash.sh of 6.4..7.0): forcing
    another generation is refused, forcing v3 walks as without the option."""
    dump = str(X86 / "stop-004-random.bin.xz")
    assert main(["replay", "--orc-version", "2", "--cpu", "0", dump]) == 2
    assert "--orc-version 2 disagrees with the image" in capsys.readouterr().err
    assert main(["replay", "--cpu", "0", dump]) == 0
    plain = capsys.readouterr().out
    assert main(["replay", "--orc-version", "v3", "--cpu", "0", dump]) == 0
    assert capsys.readouterr().out == plain


def test_messages_name_what_they_are_about(tmp_path, capsys, monkeypatch):
    """A System.map with no symbols, an output folder that does not exist, a vmcore whose image is nowhere:
    one line each, naming the file (and where the image was looked for)."""
    dump = str(X86 / "stop-001-random.bin.xz")
    bad = tmp_path / "bad.txt"
    bad.write_text("garbage\n")
    capsys.readouterr()
    assert main(["replay", dump, "--system-map", str(bad)]) == 2
    assert capsys.readouterr().err == f"unwind: error: {bad}: no symbols (a System.map has lines 'hexaddr type name')\n"
    out = tmp_path / "no" / "such" / "x.bin"
    assert main(["convert", dump, "-o", str(out), "--task", "1"]) == 2
    assert capsys.readouterr().err == f"unwind: error: cannot write {out}: No such file or directory\n"
    import lzma

    import unwind.session.replay as replay

    vmcore = tmp_path / "x86.elf"
    vmcore.write_bytes(lzma.decompress((X86 / "vmcore/stop-001-random.elf.xz").read_bytes()))
    monkeypatch.setattr(replay, "find_image", lambda *a, **k: None)
    assert main(["ps", str(vmcore)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"unwind: error: {vmcore}: no image with build-id ") and "looked in " in err
    assert f"{tmp_path} and 3 parents" in err and err.count("\n") == 1
