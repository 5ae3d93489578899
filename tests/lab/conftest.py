"""Fixtures of the lab tests."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def initramfs_members() -> Callable[[Path], dict[str, tuple[bytes, int]]]:
    """Read a gzip'ed newc cpio archive with libarchive: each member's name, bytes and mode."""
    libarchive = pytest.importorskip("libarchive", reason="libarchive-c (Debian: libarchive13) reads the cpio")

    def read(path: Path) -> dict[str, tuple[bytes, int]]:
        with gzip.open(path) as f:
            assert f.read(6) == b"070701", "not a newc cpio (the format the kernel unpacks)"
        with libarchive.file_reader(str(path)) as archive:
            return {e.pathname: (b"".join(e.get_blocks()), e.mode) for e in archive}
    return read
