"""The cache's flat-array files and each cache folder's bound."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import pytest

from unwind.formats.cachefile import (CacheFileError, folder_limit, mark_used, read_arrays, write_arrays,
                              write_atomically)


def _write(path: Path, nbytes: int, mtime: float | None = None) -> Path:
    """A cache file of ``nbytes`` payload, its use time set to ``mtime``."""
    write_atomically(path, lambda f: write_arrays(f, {"k": path.name}, {"a": array("B", bytes(nbytes))}))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_a_written_file_reads_back_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x-v1.arrays"
    write_atomically(path, lambda f: write_arrays(f, {"build_id": "ab"}, {"n": array("Q", [1, 2, 3])}))
    meta, arrays = read_arrays(path)
    assert meta == {"build_id": "ab"} and list(arrays["n"]) == [1, 2, 3]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFileError, match="CRC-32"):
        read_arrays(path)


def test_writing_a_new_layout_removes_the_older_layouts_of_that_entry_only(tmp_path: Path) -> None:
    folder = tmp_path / "symbols"
    folder.mkdir()
    old = [folder / "abc-v1.arrays", folder / "abc-v2.npz"]
    others = [folder / "abd-v1.arrays", folder / "abc-v4.arrays", folder / "xabc-v1.arrays"]
    for p in old + others:
        p.write_bytes(b"written by an earlier version")
    new = _write(folder / "abc-v3.arrays", 10)
    assert new.exists() and not any(p.exists() for p in old)
    assert all(p.exists() for p in others)  # other entries, and a newer layout, are not this one's past


def test_a_folder_over_its_limit_loses_its_least_recently_used_files_first(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE_MAX_MB", "1")
    folder = tmp_path / "btf"
    folder.mkdir()
    third = 400 << 10
    a = _write(folder / "a-v2.arrays", third, mtime=1_000)
    b = _write(folder / "b-v2.arrays", third, mtime=2_000)
    mark_used(a)  # a hit: a is now the most recently used
    c = _write(folder / "c-v2.arrays", third)
    assert a.exists() and c.exists() and not b.exists()
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 1 << 20


def test_the_file_just_written_is_kept_even_when_alone_over_the_limit(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE_MAX_MB", "1")
    folder = tmp_path / "images"
    folder.mkdir()
    old = _write(folder / "old.elf", 10, mtime=1_000)
    big = _write(folder / "big.elf", 2 << 20)
    assert big.exists() and not old.exists()


def test_each_folder_has_its_own_default_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNWIND_CACHE_MAX_MB", raising=False)
    assert folder_limit(tmp_path / "images") > folder_limit(tmp_path / "btf") > 0
    monkeypatch.setenv("UNWIND_CACHE_MAX_MB", "7")
    assert folder_limit(tmp_path / "images") == folder_limit(tmp_path / "orc") == 7 << 20


def test_arrays_of_every_size_read_back_and_a_damaged_header_or_tail_is_refused(tmp_path: Path) -> None:
    """Each array is read into place: odd lengths (padding between arrays), empty arrays; a header that
    claims more than the file holds, an unknown type, or bytes added after the arrays are refused."""
    path = tmp_path / "y-v1.arrays"
    want = {"b": array("B", b"\x01\x02\x03"), "e": array("Q"), "i": array("I", [7] * 5), "q": array("Q", [2**64 - 1])}
    write_atomically(path, lambda f: write_arrays(f, {}, want))
    assert read_arrays(path)[1] == want
    good = path.read_bytes()
    for bad, why in ((good.replace(b'["i","I",4,5]', b'["i","I",4,9]'), "does not fit"),
                     (good.replace(b'["b","B",1,3]', b'["b","u",1,3]'), "unknown array type|does not fit"),
                     (good + b"\0", "CRC-32"), (good[:-3], "does not fit|CRC-32")):
        path.write_bytes(bad)
        with pytest.raises(CacheFileError, match=why):
            read_arrays(path)


def test_reading_a_file_back_marks_it_used_and_keeps_its_modification_time(tmp_path: Path) -> None:
    """A hit sets the access time only: a cache file's mtime may key another entry (an unpacked image's keys
    its headers), and a hit must not turn that entry into a miss."""
    path = _write(tmp_path / "x-v1.arrays", 8, mtime=1_000)
    read_arrays(path)
    st = path.stat()
    assert st.st_atime > 1_000 and st.st_mtime == 1_000
