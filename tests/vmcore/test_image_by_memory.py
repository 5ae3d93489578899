"""A vmcore with no VMCOREINFO note (QEMU writes none for riscv) finds its image among those near it: the one
whose kernel's own VMCOREINFO, found in memory through that image's symbols, names its build-id."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from unwind.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
RV612 = ROOT / "corpora/riscv/6.12.117+deb13-riscv64"
VMCORE = RV612 / "vmcore/stop-001-random.elf.xz"
IMAGE = next(RV612.glob("vmlinux-*.slim.xz"))
OTHER_RISCV = next((ROOT / "corpora/riscv/7.2.13+deb14-riscv64").glob("vmlinux-*.slim.xz"))
X86 = next((ROOT / "corpora/x86_64/6.12.117+deb13-amd64").glob("vmlinux-*.slim.xz"))


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """An image cache of this module's own: no fetched kernel to fall back on; images unpacked once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def alone(tmp_path: Path, cache: Path, monkeypatch) -> Path:
    """The vmcore in a folder of its own, with no image cache to fall back on."""
    monkeypatch.setenv("UNWIND_CACHE", str(cache))
    monkeypatch.delenv("UNWIND_IMAGE_PATH", raising=False)
    folder = tmp_path / "a" / "b" / "c" / "d"
    folder.mkdir(parents=True)
    shutil.copy(VMCORE, folder / VMCORE.name)
    return folder / VMCORE.name


def test_the_note_is_absent_from_the_committed_vmcore(capsys):
    """The premise: without --vmlinux, the build-id cannot come from the file itself."""
    from unwind.formats.vmdump import VmcoreFile

    assert VmcoreFile.open(str(VMCORE)).build_id is None


def test_the_image_beside_it_is_found_and_walks_as_vmlinux_does(alone: Path, capsys):
    shutil.copy(OTHER_RISCV, alone.parent / OTHER_RISCV.name)  # another riscv build, tried and passed over
    shutil.copy(X86, alone.parent / X86.name)  # another machine: never tried
    shutil.copy(IMAGE, alone.parent.parent / IMAGE.name)
    rc, found, err = _run(capsys, "replay", str(alone), "--all")
    assert rc == 0, err
    assert f"{IMAGE.name} is the image, as the kernel's own VMCOREINFO in memory names its build-id" in err
    rc, given, _ = _run(capsys, "replay", str(alone), "--all", "--vmlinux", str(IMAGE))
    assert rc == 0 and found == given and "Call Trace" in found


def test_no_image_whose_vmcoreinfo_is_in_memory_is_one_line(alone: Path, capsys):
    shutil.copy(OTHER_RISCV, alone.parent / OTHER_RISCV.name)
    shutil.copy(X86, alone.parent / X86.name)
    rc, out, err = _run(capsys, "replay", str(alone), "--all")
    assert rc == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert "no VMCOREINFO note" in last and "give it with --vmlinux" in last and "Traceback" not in err
