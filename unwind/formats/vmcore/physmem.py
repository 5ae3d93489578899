"""Physical memory of a vmcore, read in chunks and cached.

Each format says which chunk holds a physical address (a page of a
kdump-compressed file, a piece of an ELF ``PT_LOAD``) and how to get its
bytes; reads that span chunks are put together here, and decoded chunks are
kept in a bounded LRU cache.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable

from unwind.core.memory import LeftOut, MemoryFault
from .errors import TruncatedFault, VmcoreError
from .notes import Note, PrStatus
from .source import Source, SourceTruncated
from .vmcoreinfo import VmcoreInfo

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")

#: decoded bytes kept in the cache, per open vmcore
DEFAULT_CACHE_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class PhysRange:
    """Physical addresses ``[start, end)`` of RAM the dump describes."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class VirtualLoad:
    """An ELF ``PT_LOAD`` that maps ``[vaddr, vaddr + size)`` to physical ``paddr``."""

    vaddr: int
    paddr: int
    size: int


@dataclass(frozen=True, slots=True)
class Damage:
    """What a damaged file lacks, said once when it is opened.

    ``expected`` is the size the file's own structure gives it (``None`` when the
    cut hides it), ``present`` the bytes there; ``absent`` the physical ranges the
    dump describes but no longer holds; ``what`` names the damage
    (``"truncated"``, ``"incomplete"``), ``detail`` where it shows.
    """

    what: str
    present: int
    expected: int | None
    absent: list[PhysRange]
    detail: str = ""

    def __str__(self) -> str:
        head = f"{self.what}{f' ({self.detail})' if self.detail else ''}"
        if self.expected is not None and self.expected > self.present:
            size = f"{_mb(self.expected - self.present)} of {_mb(self.expected)} missing"
        else:
            size = f"{_mb(self.present)} there"
        return f"{head}: {size} ({_absent_text(self.absent)})"


def _mb(n: int) -> str:
    """Bytes as people read them: ``268 MB``, ``0.7 MB``, ``7.5 kB``."""
    if n < 100_000:
        return f"{n / 1e3:.1f} kB"
    return f"{n / 1e6:.1f} MB" if n < 10_000_000 else f"{n / 1e6:.0f} MB"


def _absent_text(absent: list[PhysRange]) -> str:
    """``physical 0x..-0x.. absent``, or the span and count when there are many ranges."""
    if not absent:
        return "no memory absent"
    if len(absent) <= 3:
        return "physical " + ", ".join(f"{r.start:#x}-{r.end:#x}" for r in absent) + " absent"
    total = sum(r.end - r.start for r in absent)
    return (f"physical {absent[0].start:#x}-{absent[-1].end:#x} absent in {len(absent)} ranges, "
            f"{_mb(total)}")


def merge_ranges(ranges: list[tuple[int, int]]) -> list[PhysRange]:
    """``[start, end)`` pairs sorted and merged where they touch."""
    out: list[PhysRange] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1].end:
            out[-1] = PhysRange(out[-1].start, max(out[-1].end, end))
        else:
            out.append(PhysRange(start, end))
    return out


@dataclass(slots=True)
class Chunk:
    """Decoded bytes at physical address ``start``."""

    start: int
    data: bytes = field(repr=False)


class PhysicalMemory:
    """A vmcore's physical memory, notes and identity; formats subclass it.

    Attributes set by every format:

    - ``path``, ``format`` (``"elf"``, ``"kdump"``, ``"flattened-kdump"``, ``"flattened-elf"``);
    - ``notes``: every note in file order; ``prstatus``: the ``NT_PRSTATUS`` ones;
    - ``vmcoreinfo`` (text or ``None``) and ``vmcoreinfo_dict``;
    - ``machine``: the ELF machine as pyelftools names it (``"EM_X86_64"``) or ``None`` when the file does not say;
      ``machine_source`` says where it came from;
    - ``block_size``: the format's storage unit (a diskdump block, 4096 for ELF);
    - ``page_size``: the dumped kernel's ``PAGESIZE`` from VMCOREINFO, else ``block_size``;
    - ``virtual_loads``: ELF ``PT_LOAD`` virtual mappings (empty for diskdump);
    - ``damage``: what a truncated or incomplete file lacks (:class:`Damage`), else ``None``;
    - ``left_out``: RAM of the dumped kernel that :attr:`described` leaves out, once the kernel's own map of
      its RAM is read (a read there raises :class:`~unwind.core.memory.LeftOut`).
    """

    format: str
    machine: str | None
    machine_source: str
    block_size: int
    virtual_loads: list[VirtualLoad]
    damage: Damage | None = None
    left_out: tuple[PhysRange, ...] = ()

    def __init__(self, path: str, source: Source, notes: list[Note], prstatus: list[PrStatus],
                 vmcoreinfo: str | None, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.path = path
        self._src = source
        self.notes = notes
        self.prstatus = prstatus
        self.vmcoreinfo = vmcoreinfo
        self.vmcoreinfo_dict = VmcoreInfo.parse(vmcoreinfo or "")
        self._cache: OrderedDict[Hashable, Chunk] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._last: Chunk | None = None

    @property
    def page_size(self) -> int:
        """The dumped kernel's page size (VMCOREINFO ``PAGESIZE``), else the format's block size."""
        return self.vmcoreinfo_dict.bounded("PAGESIZE") or self.block_size

    @property
    def ranges(self) -> list[PhysRange]:
        """The physical RAM ranges the dump describes, sorted and merged."""
        raise NotImplementedError

    @property
    def described(self) -> list[PhysRange]:
        """The physical ranges the dump's headers describe, whether or not the file holds their bytes."""
        return self.ranges

    def _locate(self, paddr: int, addr: int, size: int) -> tuple[Hashable, int]:
        """The cache key and start address of the chunk holding ``paddr``; faults name ``addr``/``size``."""
        raise NotImplementedError

    def _load(self, key: Hashable, start: int, addr: int, size: int) -> bytes:
        """The decoded bytes of chunk ``key``; faults name ``addr``/``size``."""
        raise NotImplementedError

    def _chunk(self, paddr: int, addr: int, size: int) -> Chunk:
        try:
            key, start = self._locate(paddr, addr, size)
        except MemoryFault as e:
            if type(e) is MemoryFault and any(r.start <= paddr < r.end for r in self.left_out):
                raise LeftOut(addr, size) from None
            raise
        chunk = self._cache.get(key)
        if chunk is not None:
            self._cache.move_to_end(key)
            return chunk
        try:
            data = self._load(key, start, addr, size)
        except SourceTruncated:  # every read is bounded by the file: the structure points past its end
            raise TruncatedFault(addr, size) from None
        except OSError as e:
            raise VmcoreError(f"{self.path}: read error: {e.strerror or e}") from None
        chunk = Chunk(start, data)
        self._cache[key] = chunk
        self._cache_bytes += len(data)
        while self._cache_bytes > self._cache_limit and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old.data)
        return chunk

    def read_phys(self, paddr: int, size: int) -> bytes:
        """``size`` bytes at physical address ``paddr``.

        Raises :class:`~unwind.core.memory.MemoryFault` when any byte is not in the
        dump; :class:`~unwind.formats.vmcore.ExcludedPageFault` (a subclass) when the
        page is RAM that the dump filtered out.
        """
        if size < 0 or paddr < 0:
            raise MemoryFault(paddr, size)
        last = self._last
        if last is not None and last.start <= paddr and paddr + size <= last.start + len(last.data):
            off = paddr - last.start
            return last.data[off:off + size]
        parts: list[bytes] = []
        pos, end = paddr, paddr + size
        while pos < end:
            chunk = self._chunk(pos, paddr, size)
            off = pos - chunk.start
            take = min(end - pos, len(chunk.data) - off)
            parts.append(chunk.data[off:off + take])
            pos += take
            self._last = chunk
        return b"".join(parts)

    def read_phys_u64(self, paddr: int) -> int:
        """The little-endian 64-bit word at physical ``paddr``."""
        return _U64.unpack(self.read_phys(paddr, 8))[0]

    def read_phys_u32(self, paddr: int) -> int:
        """The little-endian 32-bit word at physical ``paddr``."""
        return _U32.unpack(self.read_phys(paddr, 4))[0]

    def contains_phys(self, paddr: int, size: int = 1) -> bool:
        """True when every byte of ``[paddr, paddr + size)`` can be read."""
        try:
            self.read_phys(paddr, size)
        except MemoryFault:
            return False
        return True

    def close(self) -> None:
        """Close the file; the object is unusable afterwards."""
        self._cache.clear()
        self._last = None
        self._src.close()

    def __enter__(self) -> "PhysicalMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.format} {self.path!r} machine={self.machine}>"
