"""The flattened format (``makedumpfile -F``, QEMU ≤ 8.1 ``dump-guest-memory -z/-l/-s``), read in place.

makedumpfile ``makedumpfile.h`` (struct makedumpfile_header,
makedumpfile_data_header) and write_buffer: a 4096-byte start header, then
records of ``{int64 offset, int64 buf_size}`` (big-endian) followed by
``buf_size`` bytes meant for that offset of the reassembled file, up to a
record of ``-1, -1``. ``makedumpfile -R`` writes each record at its offset;
:class:`FlatSource` instead indexes the records once and serves reads of the
reassembled file from them (gaps read as zeros, a later record wins where two
overlap). The index is cached by path, size and mtime.

A stream cut short (no end marker) keeps every record up to the cut, the cut
record's bytes that are there included. Its gaps are then no longer known to
be zeros (the records that would fill them may be the ones lost), so a read
that touches one raises :class:`SourceTruncated`.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from construct import Bytes, Int64sb, Padding, Struct

from unwind.formats.packed import packed
from .source import FileSource, Source, SourceTruncated

if TYPE_CHECKING:
    import numpy as np

MDF_SIGNATURE = b"makedumpfile"
MDF_TYPE_FLAT_HEADER = 1
MDF_VERSION_FLAT_HEADER = 1
MDF_HEADER_SIZE = 4096
END_FLAG_FLAT_HEADER = -1

#: ``struct makedumpfile_header``, padded to its 4096-byte block
Makedumpfile_header = Struct(
    "signature" / Bytes(16),
    "type" / Int64sb,
    "version" / Int64sb,
    Padding(MDF_HEADER_SIZE - 32),
)

#: ``struct makedumpfile_data_header``: where the following bytes go
Makedumpfile_data_header = Struct(
    "offset" / Int64sb,
    "buf_size" / Int64sb,
)

#: the record header for the one pass over them
_DATA_HEADER = packed(Makedumpfile_data_header)

#: records whose index is worth caching on disk
CACHE_MIN_RECORDS = 20000
INDEX_VERSION = 1


class FlatError(ValueError):
    """The flattened stream is malformed."""


def is_flattened(head: bytes) -> bool:
    """Does this start of a file carry the flattened-format signature?"""
    return head[:16] == MDF_SIGNATURE + bytes(4)


def _index_records(src: FileSource) -> tuple[np.ndarray, str | None]:
    """One pass over the record headers: rows of (offset in the reassembled file, size, offset in this file),
    and where the stream is cut (``None`` when it reaches its end marker)."""
    import numpy as np  # here: a replay of the project's own dumps never opens a flattened file

    if src.size < MDF_HEADER_SIZE:
        raise FlatError(f"truncated: {src.size} bytes, shorter than the {MDF_HEADER_SIZE}-byte flattened header")
    hdr = Makedumpfile_header.parse(src.pread(0, MDF_HEADER_SIZE))
    if not is_flattened(hdr.signature) or hdr.type != MDF_TYPE_FLAT_HEADER:
        raise FlatError(f"bad flattened header (type {hdr.type}, version {hdr.version})")
    rows: list[tuple[int, int, int]] = []
    pos, hsize = MDF_HEADER_SIZE, _DATA_HEADER.size
    cut = None
    while True:
        if pos + hsize > src.size:
            cut = f"the flattened stream stops at {pos:#x}, with no end marker"
            break
        offset, buf_size = _DATA_HEADER.unpack(src.pread(pos, hsize))
        if offset == END_FLAG_FLAT_HEADER:
            break
        if offset < 0 or buf_size < 0:
            raise FlatError(f"bad record at {pos:#x}: offset {offset}, size {buf_size}")
        if pos + hsize + buf_size > src.size:  # the bytes of the record that are there still hold
            cut = f"the flattened stream stops inside the record at {pos:#x}"
            buf_size = src.size - pos - hsize
        if buf_size:
            rows.append((offset, buf_size, pos + hsize))
        if cut:
            break
        pos += hsize + buf_size
    return _resolve_overlaps(np.array(rows, dtype=np.int64).reshape(-1, 3)), cut


def _resolve_overlaps(rows: np.ndarray) -> np.ndarray:
    """Sort by destination; where records overlap, keep the later one's bytes (as ``-R`` would)."""
    import numpy as np

    order = np.lexsort((np.arange(len(rows)), rows[:, 0]))
    srt = rows[order]
    ends = srt[:, 0] + srt[:, 1]
    if len(srt) < 2 or bool(np.all(srt[1:, 0] >= ends[:-1])):
        return srt
    pieces: list[list[int]] = []  # sorted, disjoint [dst, size, src]
    starts: list[int] = []
    for dst, size, at in rows.tolist():  # file order: a later record overwrites
        end = dst + size
        i = bisect.bisect_right(starts, dst) - 1
        i = max(i, 0)
        new: list[list[int]] = []
        j = i
        while j < len(pieces) and pieces[j][0] < end:
            p0, ps, pa = pieces[j]
            p1 = p0 + ps
            if p1 <= dst:
                new.append(pieces[j])
            else:
                if p0 < dst:
                    new.append([p0, dst - p0, pa])
                if p1 > end:
                    new.append([end, p1 - end, pa + (end - p0)])
            j += 1
        new.append([dst, size, at])
        new.sort()
        pieces[i:j] = new
        starts[i:j] = [p[0] for p in new]
    return np.array(pieces, dtype=np.int64).reshape(-1, 3)


def _cache_path(src: FileSource) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "unwind" / "flat-index"
    key = f"{INDEX_VERSION}:{os.path.realpath(src.path)}:{src.size}:{src.mtime_ns}".encode()
    return base / (hashlib.sha256(key).hexdigest()[:32] + ".npy")


def load_index(src: FileSource) -> tuple[np.ndarray, str | None]:
    """The record index and where the stream is cut, from the on-disk cache when the file has not changed
    (only whole streams are cached)."""
    import numpy as np

    path = _cache_path(src)
    try:
        rows = np.load(path, allow_pickle=False)
        if rows.ndim == 2 and rows.shape[1] == 3 and rows.dtype == np.int64:
            return rows, None
    except (OSError, ValueError):
        pass
    rows, cut = _index_records(src)
    if cut is None and len(rows) >= CACHE_MIN_RECORDS:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(tmp, rows, allow_pickle=False)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache only costs the next open another pass
    return rows, cut


class FlatSource(Source):
    """The reassembled file of a flattened dump, read through its record index."""

    def __init__(self, src: FileSource) -> None:
        self._file = src
        self.path = src.path
        rows, self.cut = load_index(src)
        self._dst = rows[:, 0].tolist()
        self._len = rows[:, 1].tolist()
        self._at = rows[:, 2].tolist()
        self.records = len(rows)
        self.stored = src.size
        self.size = max((d + n for d, n in zip(self._dst, self._len)), default=0)

    def pread(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        out = bytearray(size)  # gaps between records read as zeros, as after makedumpfile -R
        end = offset + size
        covered = 0
        i = max(bisect.bisect_right(self._dst, offset) - 1, 0)
        while i < len(self._dst) and self._dst[i] < end:
            d, n = self._dst[i], self._len[i]
            lo, hi = max(d, offset), min(d + n, end)
            if lo < hi:
                out[lo - offset:hi - offset] = self._file.pread(self._at[i] + (lo - d), hi - lo)
                covered += hi - lo
            i += 1
        if self.cut and covered < size:  # the records resolved to disjoint pieces: a shortfall is a gap
            raise SourceTruncated(offset, size, self.size)
        return bytes(out)

    def close(self) -> None:
        self._file.close()

