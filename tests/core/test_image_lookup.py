"""Finding a dump's kernel image by build-id where drgn/crash users keep them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from unwind.formats import image as image_mod
from unwind.cli.main import main
from unwind.formats.image import find_image

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "corpora/x86_64/6.12.117+deb13-amd64"
ARM64 = ROOT / "corpora/arm64/6.12.117+deb13-arm64"
X86_BID = "b1d7a9114053a488ef493f85f85e9fc75ba9f632"
X86_RELEASE = "6.12.117+deb13-amd64"


@pytest.fixture
def away(tmp_path, monkeypatch):
    """An x86 dump copied away from corpora/, with no image on any searched path."""
    monkeypatch.setattr(image_mod, "DEBUG_ROOT", tmp_path / "debug")
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("UNWIND_IMAGE_PATH", raising=False)
    (tmp_path / "d" / "e" / "f").mkdir(parents=True)
    dump = tmp_path / "d" / "e" / "f" / "stop-004-random.bin.xz"
    shutil.copy(X86 / "stop-004-random.bin.xz", dump)
    return dump


def _slim(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.symlink_to(X86 / f"vmlinux-{X86_BID}.slim.xz")
    return dest


def test_x86_without_an_image_is_refused_up_front(away, capsys):
    assert main(["replay", str(away)]) == 2
    err = capsys.readouterr().err
    assert f"no image with build-id {X86_BID} found" in err and "ORC tables" in err and "--vmlinux" in err
    assert f"/vmlinux-{X86_RELEASE}" in err and ".build-id/" in err and err.count("\n") == 1


def test_arm64_without_an_image_prints_raw_addresses(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(image_mod, "DEBUG_ROOT", tmp_path / "debug")
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))
    dump = tmp_path / "x" / "y" / "z" / "w" / "stop-002.bin.xz"
    dump.parent.mkdir(parents=True)
    shutil.copy(ARM64 / "stop-002-irq-arch_timer_handler_virt.bin.xz", dump)
    assert main(["replay", "--cpu", "0", str(dump)]) == 0
    out = capsys.readouterr()
    assert "printing raw addresses" in out.err and out.out.splitlines()[2].startswith(" 0xffff")


@pytest.mark.parametrize("where", [
    "image-path/a/b/vmlinux-{bid}.slim.xz",          # $UNWIND_IMAGE_PATH, in a subfolder
    "d/vmlinux.slim.xz",                              # a parent of the dump's folder, named without the id
    "debug/.build-id/{b2}/{rest}.debug",              # the debuginfo store by build-id
    "debug/boot/vmlinux-{release}",                   # the debuginfo package's path by release
    "cache/kernels/{release}/vmlinux",                # what `unwind kernels fetch` put in the cache
])
def test_found_where_users_keep_it(away, where, monkeypatch, capsys):
    tmp = away.parents[3]
    path = _slim(tmp / where.format(bid=X86_BID, b2=X86_BID[:2], rest=X86_BID[2:], release=X86_RELEASE))
    if where.startswith("image-path"):
        monkeypatch.setenv("UNWIND_IMAGE_PATH", str(tmp / "image-path"))
    if where.startswith("cache"):
        (path.parent / "kernel.json").write_text(json.dumps({"release": X86_RELEASE, "build_id": X86_BID}))
    img = find_image(X86_BID, away, None, X86_RELEASE)
    assert img is not None and img.build_id == X86_BID
    assert main(["replay", "--cpu", "0", str(away)]) == 0
    assert "hrtimer_interrupt+" in capsys.readouterr().out


def test_a_candidate_of_another_build_is_skipped(away, capsys):
    tmp = away.parents[3]
    arm = ARM64 / "vmlinux-2d43e9b8e72f9c2314fe7f0c97abee29e857ce37.slim.xz"
    (tmp / "debug" / "boot").mkdir(parents=True)
    (tmp / "debug" / "boot" / f"vmlinux-{X86_RELEASE}").symlink_to(arm)   # right name, wrong build
    assert find_image(X86_BID, away, None, X86_RELEASE) is None
    assert main(["replay", "--vmlinux", str(arm), str(away)]) == 2
    assert "does not match the dump's" in capsys.readouterr().err


def test_vmlinux_pointing_at_a_core_says_so(away, capsys):
    assert main(["replay", "--vmlinux", str(away), str(away)]) == 2
    assert "is a core file (a dump), not a kernel image" in capsys.readouterr().err


def test_help_documents_the_environment(capsys):
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    out = capsys.readouterr().out
    assert "UNWIND_IMAGE_PATH" in out and "UNWIND_CACHE" in out and "subfolders" in out
