"""Byte sources a vmcore is read from: a plain file, or a flattened file's records.

Every read is bounded by the source's size: a read that would go past it
raises :class:`SourceTruncated`, so no reader ever reads outside the file.
"""

from __future__ import annotations

import io
import os


class SourceTruncated(Exception):
    """A read of the source went past its end."""

    def __init__(self, offset: int, size: int, total: int) -> None:
        super().__init__(f"read of {size} bytes at offset {offset:#x} ends past the file ({total:#x} bytes)")
        self.offset = offset
        self.size = size


class Source:
    """Random access to the bytes of a dump file."""

    #: bytes in the (reassembled) file
    size: int
    #: bytes actually stored on disk (bounds any single region a header may ask for)
    stored: int

    def pread(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset``, or :class:`SourceTruncated`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the file."""

    def stream(self) -> io.RawIOBase:
        """A read-only seekable file object over the source (for pyelftools)."""
        return _SourceStream(self)

    def _check(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise SourceTruncated(offset, size, self.size)


class FileSource(Source):
    """A regular file read with ``pread``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(self._fd)
        self.size = self.stored = st.st_size
        self.mtime_ns = st.st_mtime_ns

    def pread(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        data = os.pread(self._fd, size, offset)
        if len(data) != size:  # the file shrank under us
            raise SourceTruncated(offset, size, offset + len(data))
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


class _SourceStream(io.RawIOBase):
    """A seekable, read-only view of a :class:`Source`; reads stop at its end."""

    def __init__(self, source: Source) -> None:
        self._src = source
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._src.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        n = max(0, min(len(buf), self._src.size - self._pos))
        if n:
            buf[:n] = self._src.pread(self._pos, n)
            self._pos += n
        return n
