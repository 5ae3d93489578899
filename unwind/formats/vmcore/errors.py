"""What goes wrong reading a vmcore: bad files, and pages a dump does not hold.

A file that cannot be read as a vmcore raises :class:`VmcoreError` (a
:class:`~unwind.core.errors.DumpError`, so the command line prints its one line and
exits 2). A page the file does not hold raises a
:class:`~unwind.core.memory.MemoryFault` (:class:`~unwind.core.memory.ExcludedPage`
for a filtered one), so a walk stops on it cleanly with the reason in the
message. A read of memory a truncated file no longer holds raises
:class:`TruncatedFault`.
"""

from __future__ import annotations

from unwind.core.errors import DumpError
from unwind.core.memory import ExcludedPage, MemoryFault


class VmcoreError(DumpError):
    """The file is not a readable vmcore; the message is one line."""


class ExcludedPageFault(ExcludedPage):
    """The page is RAM of the dumped machine but was filtered out of the dump."""

    def __init__(self, addr: int, size: int, page: int) -> None:
        super().__init__(addr, size)
        self.page = page
        self.args = (f"page {page:#x} excluded from the dump (read at {addr:#x} +{size})",)


class CorruptPageFault(MemoryFault):
    """The dump lists the page but its stored bytes cannot be decoded."""

    def __init__(self, addr: int, size: int, page: int, why: str) -> None:
        super().__init__(addr, size)
        self.page = page
        self.args = (f"page {page:#x} is corrupt in the dump: {why} (read at {addr:#x} +{size})",)


class TruncatedFault(MemoryFault):
    """The dump describes the memory, but the file ends before its bytes: it was cut short."""

    def __init__(self, addr: int, size: int) -> None:
        super().__init__(addr, size)
        self.args = (f"{addr:#x} (+{size}) is beyond the end of the file (the dump is truncated)",)
