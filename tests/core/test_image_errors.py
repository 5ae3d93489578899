"""A malformed image (--vmlinux, a slim image) is one ImageError line, never a pyelftools error:
the escapes the fuzzer's image family found, on the committed x86 slim image."""

from __future__ import annotations

import lzma
import struct
from pathlib import Path

import pytest

from unwind.dev.fuzz.mutators import _sections
from unwind.formats.cachefile import CACHE_ENV
from unwind.formats.image import Image, ImageError

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


def _compressed(raw: bytes, name: str, size: int) -> bytes:
    """Section ``name`` marked SHF_COMPRESSED, its first bytes an Elf64_Chdr (ELFCOMPRESS_ZLIB) of ``size``."""
    head = _head(raw, name)
    flags, offset = struct.unpack_from("<QxxxxxxxxQ", raw, head + 8)
    data = _patch(raw, head + 8, "<Q", flags | 0x800)
    return _patch(_patch(data, offset, "<I", 1), offset + 8, "<Q", size)


@pytest.mark.parametrize("what, edit, why", [
    ("e_shentsize 0", lambda r: _patch(r, 58, "<H", 0), "Too small e_shentsize"),
    ("a section header past the end", lambda r: _patch(r, 40, "<Q", 2**63), "past EOF"),
    (".symtab entries of size 0", lambda r: _patch(r, _head(r, ".symtab") + 56, "<Q", 0), "entry size"),
    (".symtab linked to no string table", lambda r: _patch(r, _head(r, ".symtab") + 40, "<I", 0), "expected SHT_STRTAB"),
    (".symtab of a size no multiple of its entries", lambda r: _patch(r, _head(r, ".symtab") + 32, "<Q", 25), ""),
    # found by the long campaign (seed 2026, case 836546): pyelftools reads sh_size bytes at once,
    # and 2**63 is past what a read takes (an OverflowError then)
    (".strtab of 2**63 bytes", lambda r: _patch(r, _head(r, ".strtab") + 32, "<Q", 2**63), "runs past the end"),
])
def test_a_malformed_image_is_one_line(tmp_path, monkeypatch, raw, what, edit, why):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # symbols decoded from the image, not a cache
    text = _open(tmp_path, edit(raw))
    assert why in text and "malformed ELF image" in text


@pytest.fixture(scope="module")
def raw_btf() -> bytes:
    """A committed slim image that keeps its .BTF bytes (some keep the header only, as SHT_NOBITS)."""
    for path in sorted((SLIM.parents[2]).glob("*/*/vmlinux-*.slim.xz")):
        raw = lzma.decompress(path.read_bytes())
        if struct.unpack_from("<I", raw, _head(raw, ".BTF") + 4)[0] == 1:  # SHT_PROGBITS
            return raw
    pytest.fail("no committed slim image keeps its .BTF")


@pytest.mark.parametrize("what, edit, why", [
    # found by the long campaign (seed 2032, case 209792): pyelftools was asked for 2**40 bytes (MemoryError)
    (".BTF of 2**40 bytes", lambda r: _patch(r, _head(r, ".BTF") + 32, "<Q", 2**40), "runs past the end"),
    (".BTF compressed, claiming 2**40 bytes", lambda r: _compressed(r, ".BTF", 2**40), "more than"),
    (".BTF compressed, not zlib data", lambda r: _compressed(r, ".BTF", 4096), "decompressing"),
])
def test_a_malformed_btf_section_is_one_line(tmp_path, monkeypatch, raw_btf, what, edit, why):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    text = _open(tmp_path, edit(raw_btf))
    assert why in text and "malformed ELF image" in text
