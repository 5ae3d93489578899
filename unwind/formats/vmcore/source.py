"""Byte sources a vmcore is read from: a plain file, or a flattened file's records.

Every read is bounded by the source's size: a read that would go past it
raises :class:`SourceTruncated`, so no reader ever reads outside the file.
"""

from __future__ import annotations

import io
import lzma
import os
import tempfile
import weakref


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
    #: why the source itself ends early (an xz stream without its end, a flattened stream without its
    #: end marker), else ``None``; a format reader also finds a plain file cut by its own structure
    cut: str | None = None

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


#: the xz magic (``.xz`` files: committed corpus slices, compressed vmcores)
XZ_MAGIC = b"\xfd7zXZ\x00"
#: a decompressed xz vmcore stays in memory up to this size, then spills to an unnamed temporary file
XZ_SPOOL_BYTES = 64 << 20
#: and is refused past this size (a bomb, or a file better decompressed by hand)
XZ_MAX_BYTES = 64 << 30
_CHUNK = 1 << 20


class XzError(Exception):
    """An xz file that does not decompress, or decompresses past :data:`XZ_MAX_BYTES`."""


class XzSource(Source):
    """An xz-compressed file, decompressed once at open for random access.

    xz has no cheap random access in the standard library (``lzma`` streams only), so the whole
    file is decompressed into a :class:`tempfile.SpooledTemporaryFile`: memory up to
    :data:`XZ_SPOOL_BYTES`, an unnamed file in ``$TMPDIR`` past it (gone when closed), at most
    :data:`XZ_MAX_BYTES`. A stream cut short gives what decompresses (a prefix of the file inside:
    LZMA decodes in order) and says so in :attr:`cut`; corrupt data is refused.
    """

    def __init__(self, path: str, limit: int | None = None) -> None:
        self.path = path
        self.mtime_ns = os.stat(path).st_mtime_ns  # the flattened index cache keys on the compressed file
        self._file = tempfile.SpooledTemporaryFile(max_size=XZ_SPOOL_BYTES)
        #: closes the spool when this source is collected unclosed: a weakref callback, which the collector runs
        #: before any finalizer, so the spool is never collected open (its ResourceWarning, raised in whatever
        #: frame the collection interrupts, adds ``__warningregistry__`` to that module's globals)
        self._close = weakref.finalize(self, self._file.close)
        try:
            self.size = self.stored = self._decompress(path, XZ_MAX_BYTES if limit is None else limit)
        except BaseException:
            self._close()
            raise

    def _decompress(self, path: str, limit: int) -> int:
        """Decompress every stream of the file into the spool; a stream cut short keeps what it gave."""
        total = 0
        dec = lzma.LZMADecompressor(lzma.FORMAT_XZ)
        try:
            with open(path, "rb") as f:
                raw = b""
                while True:
                    if dec.eof:  # xz files may hold several streams, one after the other
                        raw = (dec.unused_data or f.read(_CHUNK)).lstrip(b"\0")  # stream padding
                        if not raw:
                            break
                        dec = lzma.LZMADecompressor(lzma.FORMAT_XZ)
                    elif dec.needs_input and not raw:
                        raw = f.read(_CHUNK)
                        if not raw:
                            self.cut = "the xz stream ends early"
                            break
                    chunk = dec.decompress(raw, max_length=_CHUNK)
                    raw = b""
                    total += len(chunk)
                    if total > limit:
                        raise XzError(f"decompresses to more than {limit >> 20} MiB: decompress it by hand "
                                      "(xz -dk) and give the result")
                    self._file.write(chunk)
        except lzma.LZMAError as e:
            raise XzError(f"corrupt xz data: {e}") from None
        return total

    def pread(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        self._file.seek(offset)
        return self._file.read(size)

    def close(self) -> None:
        self._close()


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
