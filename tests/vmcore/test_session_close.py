"""A session releases the file it reads when closed (``with Session.load(...)``)."""

from __future__ import annotations

import lzma
import os
from pathlib import Path

import pytest

from unwind import Session

HERE = Path(__file__).resolve().parents[2] / "corpora" / "x86_64" / "6.12.117+deb13-amd64"
VMCORE = HERE / "vmcore" / "switch-000.elf.xz"
IMAGE = next(HERE.glob("vmlinux-*.slim.xz"))
FDS = Path("/proc/self/fd")


def _open_on(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    n = 0
    for fd in os.listdir(FDS):
        try:
            n += os.readlink(FDS / fd) == str(path)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return n


@pytest.mark.skipif(not FDS.is_dir(), reason="needs /proc/self/fd (Linux)")
def test_a_closed_session_holds_no_descriptor_on_its_vmcore(tmp_path) -> None:
    elf = tmp_path / "switch-000.elf"
    elf.write_bytes(lzma.decompress(VMCORE.read_bytes()))
    with Session.load(elf, vmlinux=IMAGE) as s:
        assert s.replay(s.select(every=True)[0]).frames
        assert _open_on(elf) == 1
    assert _open_on(elf) == 0
