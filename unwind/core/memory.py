"""Memory of a captured kernel: reads served only from the dump's segments.

The kernel unwinders read stacks with ``READ_ONCE_NOCHECK``; a replay reads
the same words from the memory captured in a dump. Nothing here ever reads
past a captured segment: a read that is not wholly inside one raises
:class:`MemoryFault` carrying the address and size.
"""

from __future__ import annotations

import itertools
import struct
import sys
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Iterable

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_U64_PAIR = struct.Struct("<QQ")
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
    """One captured range: ``data`` holds the bytes at ``[start, start + len(data))``."""

    start: int
    data: bytes

    @property
    def end(self) -> int:
        """First address past the segment."""
        return self.start + len(self.data)


#: the words of no segment (a :class:`WordCursor` before its first read)
_NO_WORDS = memoryview(b"").cast("Q")


class Memory:
    """Little-endian reads from a set of non-overlapping captured segments."""

    # one per dump, per task snapshot: the compiled build (memory.pxd) makes it an extension type
    __slots__ = ("holes", "segments", "_starts", "_ends", "_sizes", "_hit", "_lo", "_hi", "_words", "__weakref__")

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

    @property
    def bounds(self) -> tuple[list[int], list[int]]:
        """Each segment's start and end (the first address past it), in address order (not to be changed)."""
        return self._starts, self._ends

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
        return seg.data[off:off + size]

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
