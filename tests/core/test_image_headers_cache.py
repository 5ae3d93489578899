"""The cache of what pyelftools reads of an image file's headers (``unwind.formats.image._headers``): an image opened
from the cache is the image pyelftools reads, section for section; a damaged entry is read again; a file
changed since (another size, inode or mtime) is another entry; without a cache folder nothing changes."""

from __future__ import annotations

import lzma
import os
from pathlib import Path

import pytest

from unwind.formats import image as image_mod
from unwind.formats.image import Image, image_build_id

ROOT = Path(__file__).resolve().parents[2]
SLIM = sorted((ROOT / "corpora" / "x86_64").glob("6.12*/vmlinux-*.slim.xz"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "images"


@pytest.fixture(scope="module")
def slim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SLIM:
        pytest.skip("no committed x86-64 slim image")
    out = tmp_path_factory.mktemp("slim") / SLIM[0].name.removesuffix(".xz")
    out.write_bytes(lzma.decompress(SLIM[0].read_bytes()))
    return out


def _seen(img: Image) -> tuple[object, ...]:
    """What a replay reads of an image."""
    return (img.machine, img.build_id, img._headers, img._text, img.has_text, img.section(".orc_header"),
            img.section(".orc_unwind_ip"), img.section(".no such section"), img.release,
            img.symbols.address("_stext"))


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.headers-v*.json"))


def test_an_image_opened_from_the_cache_is_the_image_pyelftools_reads(cache, slim, monkeypatch):
    fresh = Image(slim)  # reads the headers with pyelftools and writes the entry
    assert len(_entries(cache)) == 1 and "elf" in fresh.__dict__
    cached = Image(slim)
    assert "elf" not in cached.__dict__  # pyelftools not asked
    assert _seen(cached) == _seen(fresh)
    assert cached.elf.get_section_by_name(".text")["sh_addr"] == fresh.elf.get_section_by_name(".text")["sh_addr"]
    assert [s.name for s in cached._sections] == [h.name for h in fresh._headers.sections]
    monkeypatch.setenv("UNWIND_CACHE", "/dev/null/no-cache")  # as the fuzzer runs: no entry read or written
    assert _seen(Image(slim)) == _seen(fresh)


def test_an_xz_image_unpacked_into_the_cache_hits_its_headers_entry_when_opened_again(cache):
    """The unpacked copy's cache hit (``mark_used``) must not change what keys its headers entry."""
    if not SLIM:
        pytest.skip("no committed x86-64 slim image")
    first = Image(SLIM[0])  # unpacks the image and reads its headers with pyelftools
    assert "elf" in first.__dict__
    for _ in range(2):
        again = Image(SLIM[0])
        assert "elf" not in again.__dict__ and _seen(again) == _seen(first)
    assert len(_entries(cache)) == 1 and len(list(cache.glob("*.elf"))) == 1


def test_a_damaged_entry_is_read_again(cache, slim):
    want = _seen(Image(slim))
    (entry,) = _entries(cache)
    good = entry.read_text()
    for damaged in ("", good[:len(good) // 2], good.replace('"version": 1', '"version": 0'),
                    good.replace('"sections": [[0,', '"sections": [[7,'), '{"version": 1}', "[]"):
        entry.write_text(damaged)
        img = Image(slim)
        assert "elf" in img.__dict__, damaged[:40]  # read by pyelftools again
        assert _seen(img) == want
        assert entry.read_text() == good


def test_a_changed_file_is_another_entry(cache, slim, tmp_path):
    copy = tmp_path / slim.name
    copy.write_bytes(slim.read_bytes())
    want = _seen(Image(copy))
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    img = Image(copy)
    assert "elf" in img.__dict__ and len(_entries(cache)) == 2
    assert _seen(img) == want


def test_a_core_file_is_refused_from_the_cache_too(cache, tmp_path):
    from .test_dump import sample

    core = tmp_path / "vmlinux-core.elf"
    core.write_bytes(sample().to_bytes())
    for _ in range(2):
        with pytest.raises(image_mod.ImageError, match="is a core file"):
            Image(core)
        assert image_build_id(core) is None
    assert len(_entries(cache)) == 1
