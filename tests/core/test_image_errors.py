"""A malformed image (--vmlinux, a slim image) is one ImageError line, never a pyelftools error:
the escapes the fuzzer's image family found, on the committed x86 slim image."""

from __future__ import annotations

import lzma
import struct
from pathlib import Path

import pytest

from unwind.fuzz import _sections
from unwind.image import CACHE_ENV, Image, ImageError

SLIM = next((Path(__file__).resolve().parents[2] / "corpora" / "x86_64").glob("*/vmlinux-*.slim.xz"))


@pytest.fixture(scope="module")
def raw() -> bytes:
    return lzma.decompress(SLIM.read_bytes())


def _open(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "vmlinux"
    path.write_bytes(data)
    with pytest.raises(ImageError) as e:
        image = Image(path)
        image.symbols, image.build_id, image.btf  # noqa: B018
        image.section(".orc_unwind")
    assert "\n" not in str(e.value)
    return str(e.value)


def _patch(raw: bytes, off: int, fmt: str, value: int) -> bytes:
    data = bytearray(raw)
    struct.pack_into(fmt, data, off, value)
    return bytes(data)


def _head(raw: bytes, name: str) -> int:
    return next(h for n, h, _, _ in _sections(raw) if n == name)


@pytest.mark.parametrize("what, edit, why", [
    ("e_shentsize 0", lambda r: _patch(r, 58, "<H", 0), "Too small e_shentsize"),
    ("a section header past the end", lambda r: _patch(r, 40, "<Q", 2**63), "past EOF"),
    (".symtab entries of size 0", lambda r: _patch(r, _head(r, ".symtab") + 56, "<Q", 0), "entry size"),
    (".symtab linked to no string table", lambda r: _patch(r, _head(r, ".symtab") + 40, "<I", 0), "expected SHT_STRTAB"),
    (".symtab of a size no multiple of its entries", lambda r: _patch(r, _head(r, ".symtab") + 32, "<Q", 25), ""),
    # found by the long campaign (seed 2026, case 836546): pyelftools reads sh_size bytes at once,
    # and 2**63 is past what a read takes (OverflowError)
    (".strtab of 2**63 bytes", lambda r: _patch(r, _head(r, ".strtab") + 32, "<Q", 2**63), "index-sized"),
])
def test_a_malformed_image_is_one_line(tmp_path, monkeypatch, raw, what, edit, why):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # symbols decoded from the image, not a cache
    text = _open(tmp_path, edit(raw))
    assert why in text and "malformed ELF image" in text
