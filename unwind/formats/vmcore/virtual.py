"""Kernel virtual memory over a dump's physical memory, translated page by page.

A vmcore holds physical memory; the unwinders read kernel virtual addresses.
:class:`VirtualMemory` has the read API of :class:`unwind.core.memory.Memory`
(``read``, ``read_u64``, ``read_u32``, ``contains``), translating each page
through the arch's :class:`Translator` and remembering the translation of the
pages it has seen. Nothing here is arch-specific: the page-table walks live in
``arch/<arch>/mm.py``, behind ``ArchBackend.translator()``.

No read leaves the dump: a virtual address the kernel does not map raises
:class:`~unwind.core.memory.NotMapped`; a physical page the dump does not hold
raises the physical reader's :class:`~unwind.core.memory.MemoryFault` (or
:class:`~unwind.core.memory.ExcludedPage`, or :class:`~.errors.TruncatedFault` for a
page, or a page table, past the end of a cut file), re-raised at the virtual address.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Protocol

from unwind.core.memory import ARENA, ExcludedPage, LeftOut, Memory, MemoryFault, NotMapped, Segment
from .errors import TruncatedFault

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_ADDR_LIMIT = 1 << 64
_U64_MASK = _ADDR_LIMIT - 1
#: the largest single read: bigger ones are a corrupt length, not a stack
MAX_READ = 1 << 26
#: translated pages (and :class:`TableWords`' page-table entries) remembered before each cache starts over
CACHE_PAGES = 1 << 16
#: bytes of snapshot spans remembered before that cache starts over
CACHE_SPAN_BYTES = 1 << 26


class PhysReader(Protocol):
    """Physical memory of a dump (the vmcore readers implement it)."""

    def read_phys(self, paddr: int, size: int) -> bytes:
        """``size`` bytes at ``paddr``; :class:`MemoryFault` when the dump does not hold them all."""
        ...


class Translator(Protocol):
    """One arch's kernel address translation, built from a dump."""

    #: log2 of the base page size: translations are cached per such page
    page_shift: int

    def translate(self, vaddr: int) -> int:
        """The physical address of ``vaddr``; :class:`NotMapped` when the kernel does not map it."""
        ...


@dataclass(frozen=True, slots=True)
class LinearMap:
    """A range the kernel maps at a constant offset: ``pa = va - offset`` for ``start <= va < end``."""

    start: int
    end: int
    offset: int

    def __contains__(self, vaddr: int) -> bool:
        return self.start <= vaddr < self.end

    def pa(self, vaddr: int) -> int:
        """``vaddr - offset`` in 64-bit arithmetic, as the kernel computes it (offsets may wrap)."""
        return (vaddr - self.offset) & _U64_MASK


class TableWords:
    """A :class:`PhysReader` for the page-table walks: the 8-byte reads (the tables' entries) remembered, so the
    upper tables' entries, which most translations share, and a page table's other entries are read from the
    dump once, not once per translated page. Any other read goes to ``phys``; a read that faults is not
    remembered (it faults again)."""

    def __init__(self, phys: PhysReader) -> None:
        self.phys = phys
        self._words: dict[int, bytes] = {}

    def read_phys(self, paddr: int, size: int) -> bytes:
        """``size`` bytes at ``paddr``, an 8-byte read remembered."""
        if size != 8:
            return self.phys.read_phys(paddr, size)
        word = self._words.get(paddr)
        if word is None:
            word = self.phys.read_phys(paddr, 8)
            if len(self._words) >= CACHE_PAGES:
                self._words.clear()
            self._words[paddr] = word
        return word


def read_entry(phys: PhysReader, paddr: int, vaddr: int, what: str) -> int:
    """The little-endian u64 page-table entry at ``paddr``, read while translating ``vaddr``."""
    try:
        return _U64.unpack(phys.read_phys(paddr, 8))[0]
    except TruncatedFault:  # the table is past the end of a cut file: whether it maps vaddr is unknown
        raise TruncatedFault(vaddr, 1) from None
    except LeftOut:  # the table is in RAM the dump's headers leave out: likewise
        raise LeftOut(vaddr, 1) from None
    except MemoryFault:
        raise NotMapped(vaddr, 1, f"the {what} entry at physical {paddr:#x} is not in the dump") from None


class VirtualMemory:
    """Little-endian reads of kernel virtual memory, with the read API of :class:`Memory`."""

    def __init__(self, phys: PhysReader, translator: Translator) -> None:
        self.phys = phys
        self.translator = translator
        self.page_shift = translator.page_shift
        self.page_size = 1 << self.page_shift
        self._pages: dict[int, int] = {}
        #: the segments :meth:`snapshot` read of each span, and their bytes in all
        self._spans: dict[tuple[int, int], list[Segment]] = {}
        self._span_bytes = 0

    def page_phys(self, vaddr: int) -> int:
        """The physical address of the page holding ``vaddr`` (translated once, then cached)."""
        vpage = vaddr >> self.page_shift
        ppage = self._pages.get(vpage)
        if ppage is None:
            paddr = self.translator.translate(vpage << self.page_shift)
            ppage = paddr >> self.page_shift
            if len(self._pages) >= CACHE_PAGES:
                self._pages.clear()
            self._pages[vpage] = ppage
        return (ppage << self.page_shift) | (vaddr & (self.page_size - 1))

    def _check(self, addr: int, size: int) -> None:
        if addr < 0 or size < 0 or size > MAX_READ or addr + size > _ADDR_LIMIT:
            raise MemoryFault(addr, size)

    def _read_chunk(self, addr: int, size: int) -> bytes:
        """Bytes of one page: translate, then read physical memory, faulting at the virtual address."""
        try:
            paddr = self.page_phys(addr)
        except NotMapped as e:
            raise NotMapped(addr, size, e.reason) from None
        except TruncatedFault:
            raise TruncatedFault(addr, size) from None
        except LeftOut:
            raise LeftOut(addr, size) from None
        try:
            return self.phys.read_phys(paddr, size)
        except LeftOut:
            raise LeftOut(addr, size) from None
        except ExcludedPage:
            raise ExcludedPage(addr, size) from None
        except TruncatedFault:
            raise TruncatedFault(addr, size) from None
        except MemoryFault:
            raise MemoryFault(addr, size) from None

    def read(self, addr: int, size: int) -> bytes:
        """Return ``size`` bytes at virtual ``addr``: pages that follow each other in physical memory
        too are read together (the kernel image's BTF is a few MB of them)."""
        self._check(addr, size)
        mask = self.page_size - 1
        if (addr & mask) + size <= self.page_size:
            return self._read_chunk(addr, size)
        out: list[bytes] = []
        end = addr + size
        run_addr = run_phys = run_size = 0
        while addr < end:
            n = min(end, (addr | mask) + 1) - addr
            try:
                paddr = self.page_phys(addr)
            except (NotMapped, TruncatedFault):
                paddr = -1
            if run_size and paddr == run_phys + run_size:
                run_size += n
            else:
                if run_size:
                    out.append(self._read_run(run_addr, run_phys, run_size))
                run_addr, run_phys, run_size = addr, paddr, n
                if paddr < 0:  # not mapped: the page's own read raises its fault
                    out.append(self._read_chunk(addr, n))
                    run_size = 0
            addr += n
        if run_size:
            out.append(self._read_run(run_addr, run_phys, run_size))
        return b"".join(out)

    def _read_run(self, addr: int, paddr: int, size: int) -> bytes:
        """Bytes of pages that are contiguous in physical memory; a fault is found again page by page,
        so that it names the page it is in."""
        try:
            return self.phys.read_phys(paddr, size)
        except MemoryFault:
            pass
        out, end, mask = [], addr + size, self.page_size - 1
        while addr < end:
            n = min(end, (addr | mask) + 1) - addr
            out.append(self._read_chunk(addr, n))
            addr += n
        return b"".join(out)

    def read_u64(self, addr: int) -> int:
        """Return the little-endian 64-bit word at ``addr``."""
        return _U64.unpack(self.read(addr, 8))[0]

    def read_u32(self, addr: int) -> int:
        """Return the little-endian 32-bit word at ``addr``."""
        return _U32.unpack(self.read(addr, 4))[0]

    def contains(self, addr: int, size: int = 1) -> bool:
        """True when all of ``[addr, addr + size)`` is mapped and held by the dump."""
        try:
            self.read(addr, size)
        except MemoryFault:
            return False
        return True

    def snapshot(self, ranges: Iterable[tuple[int, int]]) -> Memory:
        """A plain :class:`Memory` of the virtual ranges ``[start, end)``, as the walkers read stacks.

        Pages that are not mapped or not in the dump are left out, so a range
        may become several segments; overlapping ranges are merged.
        """
        spans = sorted((max(0, s), min(e, _ADDR_LIMIT)) for s, e in ranges if e > s)
        merged: list[list[int]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        segments: list[Segment] = []
        for s, e in merged:
            segments += self._span(s, e)
        return Memory(segments)

    def _span(self, start: int, end: int) -> list[Segment]:
        """The captured segments of ``[start, end)``, read once and kept: the per-CPU stacks and the modules'
        ORC tables are in the snapshot of every task (the dump does not change, nor what a read of it
        gives)."""
        segments = self._spans.get((start, end))
        if segments is not None:
            return segments
        if end - start > MAX_READ:
            raise MemoryFault(start, end - start)
        segments = []
        run_start, run = start, bytearray()
        addr = start
        while addr < end:
            n = min(end, (addr | (self.page_size - 1)) + 1) - addr
            try:
                run += self._read_chunk(addr, n)
            except MemoryFault:
                if run:
                    segments.append(ARENA.segment(run_start, run))
                run, run_start = bytearray(), addr + n
            addr += n
        if run:
            segments.append(ARENA.segment(run_start, run))
        if self._span_bytes + end - start > CACHE_SPAN_BYTES:
            self._spans.clear()
            self._span_bytes = 0
        self._spans[start, end] = segments
        self._span_bytes += end - start
        return segments
