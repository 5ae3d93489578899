"""Cache files of flat arrays, read back without numpy.

A decoded symbol table or ORC table is a handful of flat integer arrays. They are
kept in ``$UNWIND_CACHE`` as one file: a magic line, a JSON header (the caller's
``meta`` and each array's name, ``array`` typecode and length), then each array's
bytes, with a CRC-32 of them in the header (a damaged file is refused, never
half-read). Reading is one file read and one ``array.frombytes`` per array, so a warm
start-up needs neither numpy nor a decode; numpy views of the same buffers are
made only by the code that wants them (``numpy.frombuffer``).

Each folder of the cache is bounded: writing a file removes the older layouts of the same
entry (``<key>-v<N>.*`` for a smaller ``N``), then the least recently used files until the
folder holds at most its limit (:data:`FOLDER_LIMITS`, or ``$UNWIND_CACHE_MAX_MB`` for every
folder). A hit marks its file used (:func:`mark_used`: its access time, never its modification time).
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

#: the cache folder's environment variable (default ``~/.cache/unwind``)
CACHE_ENV = "UNWIND_CACHE"
MAGIC = b"unwind-arrays 1\n"
_LEN = struct.Struct("<I")
#: what a header or a length field may not exceed (a damaged file is refused, not read)
_MAX_HEADER = 1 << 20
#: the environment variable bounding every cache folder, in MiB (default: FOLDER_LIMITS)
LIMIT_ENV = "UNWIND_CACHE_MAX_MB"
#: the most each folder may hold, in bytes: a few dozen kernels' worth of each entry
#: (a symbol table ~7 MiB, a BTF index ~1 MiB, an unpacked slim image ~10 MiB); a kernel's source-line
#: index is the largest entry and the slowest to rebuild
FOLDER_LIMITS = {"symbols": 512 << 20, "orc": 256 << 20, "btf": 256 << 20, "images": 2 << 30, "lines": 1 << 30}
_DEFAULT_LIMIT = 256 << 20
_VERSIONED = re.compile(r"(?P<key>.+)-v(?P<version>\d+)\.[^.]+")


class CacheFileError(ValueError):
    """The cache file is damaged or was written by another layout: rebuild it."""


def _padded(n: int) -> int:
    return (n + 7) & ~7


def write_arrays(f: BinaryIO, meta: Mapping[str, Any], arrays: Mapping[str, array]) -> None:
    """Write ``meta`` (JSON-able) and ``arrays`` to ``f``."""
    body = b"".join(a.tobytes() + b"\0" * (_padded(len(a) * a.itemsize) - len(a) * a.itemsize)
                    for a in arrays.values())
    header = json.dumps({"meta": dict(meta), "byteorder": sys.byteorder, "crc32": zlib.crc32(body),
                         "arrays": [[name, a.typecode, a.itemsize, len(a)] for name, a in arrays.items()]},
                        separators=(",", ":")).encode()
    head = MAGIC + _LEN.pack(len(header)) + header
    f.write(head + b"\0" * (_padded(len(head)) - len(head)) + body)


def read_arrays(path: Path) -> tuple[dict[str, Any], dict[str, array]]:
    """``(meta, arrays)`` of a file :func:`write_arrays` wrote, the file marked used (:func:`mark_used`);
    :class:`CacheFileError` when damaged.

    Each array's bytes are read straight into the array (no copy of the whole file first), the CRC-32
    taken over them, the padding and any tail in file order: the bytes the writer's CRC covers."""
    with open(path, "rb", buffering=0) as f:
        total = os.fstat(f.fileno()).st_size
        pos = len(MAGIC) + _LEN.size
        head = f.read(pos)
        if head[:len(MAGIC)] != MAGIC or len(head) < pos:
            raise CacheFileError(f"{path}: not a cache file of this version")
        (hlen,) = _LEN.unpack_from(head, len(MAGIC))
        if hlen > _MAX_HEADER or pos + hlen > total:
            raise CacheFileError(f"{path}: damaged header")
        try:
            header = json.loads(f.read(hlen))
            specs = [(str(n), str(tc), int(size), int(count)) for n, tc, size, count in header["arrays"]]
            meta = dict(header["meta"])
            crc = int(header["crc32"])
        except (ValueError, KeyError, TypeError) as e:
            raise CacheFileError(f"{path}: damaged header ({e})") from None
        if header.get("byteorder") != sys.byteorder:
            raise CacheFileError(f"{path}: written on a machine of another byte order")
        pos = _padded(pos + hlen)
        f.seek(pos)
        arrays: dict[str, array] = {}
        sum32 = 0
        for name, typecode, size, count in specs:
            try:
                a = array(typecode, [0])  # a number array (the writer writes no others)
            except (ValueError, TypeError):
                raise CacheFileError(f"{path}: unknown array type {typecode!r}") from None
            end = pos + size * count
            if a.itemsize != size or count < 0 or end > total:
                raise CacheFileError(f"{path}: array {name} does not fit")
            a *= count
            if count:
                if f.readinto(memoryview(a).cast("B")) != end - pos:
                    raise CacheFileError(f"{path}: array {name} does not fit")
                sum32 = zlib.crc32(a, sum32)
            gap = f.read(_padded(end) - end)
            sum32 = zlib.crc32(gap, sum32)
            arrays[name] = a
            pos = end + len(gap)
        while tail := f.read(1 << 20):  # bytes after the last array: the CRC covers them too
            sum32 = zlib.crc32(tail, sum32)
    if sum32 != crc:
        raise CacheFileError(f"{path}: damaged contents (CRC-32 mismatch)")
    mark_used(path)
    return meta, arrays


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a cache file via a temporary name; a cache that cannot be written is skipped."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return
    prune(path)


def mark_used(path: Path) -> None:
    """Mark a cache hit, so that :func:`prune` removes the least recently used files first: its access time is
    set to now, its modification time kept (a cache file's mtime may key another entry, as an unpacked image's
    keys its headers: :func:`unwind.formats.image._headers_entry`)."""
    try:
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
    except OSError:
        pass


def last_used(st: os.stat_result) -> float:
    """When a cache file was last written or marked used (:func:`mark_used`)."""
    return max(st.st_atime, st.st_mtime)


def folder_limit(folder: Path) -> int:
    """The most ``folder`` of the cache may hold, in bytes."""
    mb = os.environ.get(LIMIT_ENV, "")
    if mb.isdigit():
        return int(mb) << 20
    return FOLDER_LIMITS.get(folder.name, _DEFAULT_LIMIT)


def prune(written: Path) -> None:
    """Bound the folder ``written`` was just written to: older layouts of the same entry go, then the
    least recently used files until the folder fits its limit. ``written`` itself is always kept;
    a file another process removes first is skipped."""
    folder = written.parent
    entries: list[tuple[float, int, Path]] = []
    mine = _VERSIONED.fullmatch(written.name)
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name == written.name or not e.is_file(follow_symlinks=False):
                    continue
                old = _VERSIONED.fullmatch(e.name)
                try:
                    if (mine and old and old["key"] == mine["key"]
                            and int(old["version"]) < int(mine["version"])):
                        os.unlink(e.path)
                        continue
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append((last_used(st), st.st_size, Path(e.path)))
        total = written.stat().st_size + sum(size for _, size, _ in entries)
    except OSError:
        return
    limit = folder_limit(folder)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        try:
            path.unlink(missing_ok=True)
        except OSError:
            continue
        total -= size


def cache_root() -> Path:
    """``$UNWIND_CACHE``, else ``~/.cache/unwind``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "unwind")


def cache_dir(kind: str) -> Path | None:
    """``$UNWIND_CACHE/<kind>`` (default ``~/.cache/unwind``), or ``None`` when it cannot be made."""
    root = cache_root()
    try:
        (root / kind).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return root / kind
