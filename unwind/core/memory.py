"""Memory of a captured kernel: reads served only from the dump's segments.

The kernel unwinders read stacks with ``READ_ONCE_NOCHECK``; a replay reads
the same words from the memory captured in a dump. Nothing here ever reads
past a captured segment: a read that is not wholly inside one raises
:class:`MemoryFault` carrying the address and size.
"""

from __future__ import annotations

import itertools
import mmap
import struct
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Iterable

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_U64_PAIR = struct.Struct("<QQ")
#: the last address of the 64-bit address space
_LAST_ADDRESS = (1 << 64) - 1
#: the dumps' words are little-endian: a view of them as the host's 64-bit words is only made on such a host
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


class MemoryFault(Exception):
    """A read that is not wholly inside one captured segment."""

    def __init__(self, addr: int, size: int) -> None:
        super().__init__(f"no captured memory at {addr:#x} (+{size})")
        self.addr = addr
        self.size = size


class NotMapped(MemoryFault):
    """A virtual address the kernel's page tables (or its linear maps) do not map."""

    def __init__(self, addr: int, size: int, reason: str = "") -> None:
        super().__init__(addr, size)
        self.reason = reason
        self.args = (f"{addr:#x} (+{size}) is not mapped by the kernel's page tables"
                     + (f": {reason}" if reason else ""),)


class ExcludedPage(MemoryFault):
    """A page the dump left out on purpose (a filtered makedumpfile dump, ``-d 31``)."""

    def __init__(self, addr: int, size: int) -> None:
        super().__init__(addr, size)
        self.args = (f"{addr:#x} (+{size}) is in a page excluded from the dump",)


class LeftOut(MemoryFault):
    """RAM of the dumped kernel that the dump's headers do not describe: a defect of the dump, not a filter."""

    def __init__(self, addr: int, size: int) -> None:
        super().__init__(addr, size)
        self.args = (f"{addr:#x} (+{size}) is in RAM of the dumped kernel that the dump's headers leave out "
                     "(its page, or the page table that maps it)",)


@dataclass(frozen=True, slots=True)
class Segment:
    """One captured range: ``data`` holds the bytes at ``[start, start + len(data))``; a segment made by a
    :class:`SegmentArena` has them as a read-only view of its chunk and says where they are in it (``chunk``,
    ``at``)."""

    start: int
    data: bytes | memoryview
    #: a read-only view of the arena chunk holding ``data`` (``None``: its own bytes), and where ``data`` begins in it
    chunk: memoryview | None = field(default=None, compare=False, repr=False)
    at: int = field(default=0, compare=False, repr=False)

    @property
    def end(self) -> int:
        """First address past the segment."""
        return self.start + len(self.data)


class SegmentArena:
    """Chunks of memory holding the captured bytes of many dumps side by side, so that a batch over many dumps
    reads all their segments as one array of words without copying them (:class:`unwind.session.batch.FlatMemory`).

    Each segment's bytes are copied in once, when the dump is read, at a chunk offset congruent to its start
    address modulo 8 (so an 8-aligned address is a whole word of the chunk), and the segment's ``data`` is a
    read-only view of them. A chunk is an anonymous mapping, whose pages are taken only as segments fill it.
    A full chunk is kept (up to :attr:`SPARE_CHUNKS` of them) and filled again once nothing refers to its bytes
    any more, so a process reading dump after dump reuses its pages (as the heap reused a freed dump's bytes);
    a chunk not kept is freed once no segment in it is left. A segment larger than a quarter of a chunk keeps
    its own bytes.
    """

    #: the bytes of one chunk (a multiple of 8)
    CHUNK_BYTES = 32 << 20
    #: the most full chunks kept to be filled again
    SPARE_CHUNKS = 1

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: mmap.mmap | None = None
        self._view: memoryview | None = None  # the chunk, read-only: what its segments' data are views of
        self._used = 0
        self._spare: list[mmap.mmap] = []
        self._lock = threading.Lock()  # dumps read in threads take their places one at a time

    def segment(self, start: int, data: bytes | bytearray | memoryview) -> Segment:
        """A segment of ``data`` at ``start``, its bytes copied into the arena."""
        n = len(data)
        if not n or n > self.chunk_bytes // 4:
            return Segment(start, bytes(data))
        chunk, view, at = self._place(start, n)
        chunk[at:at + n] = data
        return Segment(start, view[at:at + n], view, at)

    def segments(self, data: memoryview, loads: list[tuple[int, int, int]]) -> list[Segment]:
        """The segments of one file: ``data[offset:end]`` at ``start`` for each ``(start, offset, end)`` of ``loads``.
        Where every segment's offset is congruent to its start modulo 8, the file's bytes from the first
        segment's to the last one's end are copied in at once; otherwise segment by segment."""
        if not loads:
            return []
        lo, hi = min(off for _, off, _ in loads), max(end for _, _, end in loads)
        if not 0 < hi - lo <= self.chunk_bytes // 4 or any((start - off) & 7 for start, off, _ in loads):
            return [self.segment(start, data[off:end]) for start, off, end in loads]
        chunk, view, at = self._place(lo, hi - lo)
        chunk[at:at + hi - lo] = data[lo:hi]
        shift = at - lo
        return [Segment(start, view[off + shift:end + shift], view, off + shift) for start, off, end in loads]

    def _place(self, start: int, n: int) -> tuple[mmap.mmap, memoryview, int]:
        """Room for ``n`` bytes at a chunk offset congruent to ``start`` modulo 8 (``n`` at most a quarter of a
        chunk): the chunk, its read-only view and the offset."""
        with self._lock:
            at = self._used + ((start - self._used) & 7)
            if self._chunk is None or self._view is None or at + n > self.chunk_bytes:
                if self._chunk is not None:
                    self._spare = [self._chunk] + self._spare[:self.SPARE_CHUNKS - 1]
                self._view = None  # its segments keep it: once they are gone nothing refers to the chunk's bytes
                self._chunk = self._unused_chunk()
                self._view = memoryview(self._chunk).toreadonly()
                at = start & 7
            self._used = at + n
            return self._chunk, self._view, at

    def _unused_chunk(self) -> mmap.mmap:
        """A kept chunk whose bytes nothing refers to any more (no view of it is left: a resize to its own size, a
        no-op, is refused while one is), else a new one."""
        for k, chunk in enumerate(self._spare):
            try:
                chunk.resize(len(chunk))
            except (BufferError, OSError, ValueError):
                continue
            del self._spare[k]
            return chunk
        # private: a process forked later fills its own copy of the chunk, never its parent's
        return mmap.mmap(-1, self.chunk_bytes, flags=mmap.MAP_PRIVATE)


#: the arena every dump's and vmcore's segments are read into
ARENA = SegmentArena()


#: the words of no segment (a :class:`WordCursor` before its first read)
_NO_WORDS = memoryview(b"").cast("Q")


class Memory:
    """Little-endian reads from a set of non-overlapping captured segments."""

    # one per dump, per task snapshot: the compiled build (memory.pxd) makes it an extension type
    __slots__ = ("holes", "segments", "_starts", "_ends", "_sizes", "_hit", "_lo", "_hi", "_words", "chunk", "table",
                 "__weakref__")

    def __init__(self, segments: Iterable[Segment],
                 holes: Iterable[tuple[int, int, type[MemoryFault]]] = ()) -> None:
        """``holes`` are ranges known to be missing, each with the fault a read there raises
        (``ExcludedPage``, ``NotMapped``), so a walk's stop says why; elsewhere a miss is a plain
        :class:`MemoryFault`."""
        self.holes = sorted(holes, key=lambda h: h[0])
        segs = sorted((s for s in segments if s.data), key=lambda s: s.start)
        for a, b in zip(segs, segs[1:]):
            if b.start < a.end:
                raise ValueError(f"overlapping segments at {a.start:#x} and {b.start:#x}")
        self.segments: list[Segment] = segs
        self._starts = [s.start for s in segs]
        #: ``_ends[i]``: the first address past segment ``i``
        self._ends = [s.start + len(s.data) for s in segs]
        #: ``_sizes[k]``: the bytes of the first ``k`` segments (for :meth:`captured_size`)
        self._sizes = list(itertools.accumulate((len(s.data) for s in segs), initial=0))
        #: the arena chunk holding every segment (:class:`SegmentArena`; ``None``: not all in one)
        first = segs[0].chunk if segs else None
        self.chunk = first if all(s.chunk is first for s in segs) else None
        #: each segment's start, end and place in its chunk (:attr:`Segment.at`), three 64-bit words a segment, for
        #: readers of many memories at once (:class:`unwind.session.batch.FlatMemory`): packed now, while the
        #: segments' numbers are at hand, a batch reads them as one buffer. An end at 2**64 is written one
        #: less: the table leaves out the last byte of the address space.
        self.table = array("Q", [word for s in segs for word in (s.start, min(s.end, _LAST_ADDRESS), s.at)])
        # The index of the last segment hit (-1: none), and its range: stack walks read many words from one stack.
        self._hit = 0 if segs else -1
        self._lo, self._hi = (self._starts[0], self._ends[0]) if segs else (0, 0)
        #: :meth:`words` of each segment asked for, by its index
        self._words: list[tuple[int, memoryview] | None] = [None] * len(segs)

    def _find(self, addr: int, size: int) -> int:
        """The index of the segment holding ``[addr, addr + size)``; raises as :meth:`segment` does."""
        if self._lo <= addr and addr + size <= self._hi and self._hit >= 0:
            return self._hit
        i = bisect_right(self._starts, addr) - 1
        if i >= 0 and addr + size <= self._ends[i] and size >= 0:
            self._hit = i
            self._lo = self._starts[i]
            self._hi = self._ends[i]
            return i
        for lo, hi, fault in self.holes:
            if addr < hi and addr + max(size, 1) > lo:
                raise fault(addr, size)
        raise MemoryFault(addr, size)

    def segment(self, addr: int, size: int) -> Segment:
        """The captured segment holding ``[addr, addr + size)``; :class:`MemoryFault` (or the hole's
        fault) when none does."""
        return self.segments[self._find(addr, size)]

    def words(self, addr: int, size: int) -> tuple[int, memoryview] | None:
        """The segment holding ``[addr, addr + size)`` as 64-bit words: ``(base, view)``, where ``view[i]`` is
        the little-endian word at ``base + 8 * i`` (``base`` the segment's first 8-aligned address); made once
        per segment. ``None`` on a big-endian host (read with :meth:`read_u64` there); a miss raises as
        :meth:`segment` does."""
        i = self._find(addr, size)
        hit = self._words[i]
        if hit is None and _LITTLE_ENDIAN_HOST:
            seg = self.segments[i]
            pad = -seg.start & 7
            end = pad + ((len(seg.data) - pad) & ~7) if len(seg.data) > pad else pad
            view = memoryview(seg.data)[pad:end].cast("Q")
            hit = self._words[i] = (seg.start + pad, view)
        return hit

    def captured(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The captured parts of ``[lo, hi)`` as ``(start, end)`` ranges in address order."""
        out = []
        segs = self.segments
        for i in range(max(bisect_right(self._starts, lo) - 1, 0), len(segs)):
            seg = segs[i]
            start = seg.start
            if start >= hi:
                break
            end = start + len(seg.data)
            if start < lo:
                start = lo
            if end > hi:
                end = hi
            if start < end:
                out.append((start, end))
        return out

    def captured_size(self, lo: int, hi: int) -> int:
        """How many bytes of ``[lo, hi)`` are captured: the sum of :meth:`captured`, without the list."""
        starts, segs = self._starts, self.segments
        i = max(bisect_right(starts, lo) - 1, 0)  # the segment holding lo, or the first one
        j = bisect_left(starts, hi)  # segments [i, j) start below hi
        if i >= j or hi <= lo:
            return 0
        total = self._sizes[j] - self._sizes[i]
        first, last = segs[i], segs[j - 1]
        if first.start < lo:  # its bytes below lo (all of them when it ends there)
            total -= min(lo - first.start, len(first.data))
        end = last.start + len(last.data)
        if end > hi:  # its bytes from hi on (never below lo: then it is the first and ends below lo)
            total -= end - hi
        return total

    def contains(self, addr: int, size: int = 1) -> bool:
        """True when ``[addr, addr + size)`` is captured in one segment."""
        try:
            self._find(addr, size)
        except MemoryFault:
            return False
        return True

    def read(self, addr: int, size: int) -> bytes:
        """Return ``size`` bytes at ``addr``."""
        seg = self.segments[self._find(addr, size)]
        off = addr - seg.start
        return bytes(seg.data[off:off + size])  # an arena segment's data is a view

    def read_u64(self, addr: int) -> int:
        """Return the little-endian 64-bit word at ``addr``."""
        i = self._hit
        if not (self._lo <= addr and addr + 8 <= self._hi and i >= 0):
            i = self._find(addr, 8)
        seg = self.segments[i]
        return _U64.unpack_from(seg.data, addr - seg.start)[0]

    def read_u32(self, addr: int) -> int:
        """Return the little-endian 32-bit word at ``addr``."""
        seg = self.segments[self._find(addr, 4)]
        return _U32.unpack_from(seg.data, addr - seg.start)[0]


class WordCursor:
    """Reads of 64-bit words from ``mem``'s segments as :meth:`Memory.words` gives them, the last segment kept.

    A stack walk reads its words from one stack, mostly: a read in the kept segment is an index into its
    words (``words`` from ``start`` on, the last at offset ``last``; none before the first read: -1). A read
    elsewhere keeps the segment that holds it; one that is unaligned, or on a host with no word view, is read
    through :class:`Memory`. A read not wholly inside one captured segment raises :class:`MemoryFault` (or
    the hole's fault), as :meth:`Memory.segment` does.
    """

    __slots__ = ("mem", "start", "words", "last")

    def __init__(self, mem: Memory) -> None:
        self.mem = mem
        self.start = 0
        self.words = _NO_WORDS
        self.last = -1

    def _load(self, addr: int, size: int) -> None:
        """Keep the words of the segment holding ``[addr, addr + size)``."""
        words = self.mem.words(addr, size)
        if words is not None:
            self.start, self.words = words
            self.last = 8 * len(self.words) - 8

    def word(self, addr: int) -> int:
        """The little-endian 64-bit word at ``addr``."""
        try:
            a = addr  # a C u64 in the compiled build (memory.pxd), and the offset below a C integer
        except OverflowError:  # below 0 or from 2**64 on: a miss, as its offset is in Python; Memory faults
            self._load(addr, 8)
            return self.mem.read_u64(addr)
        off = a - self.start
        if not (0 <= off <= self.last and not off & 7):
            self._load(addr, 8)
            off = a - self.start
            if not (0 <= off <= self.last and not off & 7):  # unaligned, or no words on this host
                return self.mem.read_u64(addr)
        return self.words[off >> 3]

    def pair(self, addr: int) -> tuple[int, int]:
        """The little-endian 64-bit words at ``addr`` and ``addr + 8``, captured in one segment."""
        try:
            a = addr  # as in word()
        except OverflowError:
            self._load(addr, 16)
            return _U64_PAIR.unpack(self.mem.read(addr, 16))
        off = a - self.start
        if not (0 <= off < self.last and not off & 7):
            self._load(addr, 16)
            off = a - self.start
            if not (0 <= off < self.last and not off & 7):  # unaligned, or no words on this host
                return _U64_PAIR.unpack(self.mem.read(addr, 16))
        i = off >> 3
        words = self.words
        return words[i], words[i + 1]
