"""Test physical memory and page tables built by construction.

The tables are written entry by entry from the bit layouts each test states
(from the arch manuals and kernel headers), not with the code under test, so
every translation's answer is known before the translator runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from unwind.core.memory import ExcludedPage, MemoryFault


class SparsePhys:
    """Physical memory made of pages; reads of a page nobody wrote fault, as a dump's would."""

    def __init__(self, page_size: int = 4096, alloc_base: int = 0x100000) -> None:
        self.page_size = page_size
        self.pages: dict[int, bytearray] = {}
        self.excluded: set[int] = set()
        self.next_free = alloc_base

    def page(self, paddr: int) -> bytearray:
        """The page holding ``paddr``, created zeroed."""
        return self.pages.setdefault(paddr // self.page_size, bytearray(self.page_size))

    def alloc(self, size: int | None = None) -> int:
        """A fresh zeroed, ``size``-aligned range (a page by default)."""
        size = size or self.page_size
        self.next_free = -(-self.next_free // size) * size
        pa = self.next_free
        self.next_free += size
        for off in range(0, size, self.page_size):
            self.page(pa + off)
        return pa

    def write(self, paddr: int, data: bytes) -> None:
        while data:
            off = paddr % self.page_size
            n = min(len(data), self.page_size - off)
            self.page(paddr)[off:off + n] = data[:n]
            paddr, data = paddr + n, data[n:]

    def write_u64(self, paddr: int, value: int) -> None:
        self.write(paddr, value.to_bytes(8, "little"))

    def read_phys(self, paddr: int, size: int) -> bytes:
        out = bytearray()
        addr, end = paddr, paddr + size
        while addr < end:
            pfn, off = divmod(addr, self.page_size)
            if pfn in self.excluded:
                raise ExcludedPage(paddr, size)
            page = self.pages.get(pfn)
            if page is None:
                raise MemoryFault(paddr, size)
            n = min(end - addr, self.page_size - off)
            out += page[off:off + n]
            addr += n
        return bytes(out)


@dataclass
class RadixTables:
    """A page-table tree: ``levels`` lists (shift, index bits) from the root down.

    ``table_entry(pa)`` and ``leaf_entry(pa, level)`` encode descriptors the
    way the test's arch defines them; ``map()`` writes the path for one page.
    """

    phys: SparsePhys
    levels: list[tuple[int, int]]
    table_entry: Callable[[int], int]
    leaf_entry: Callable[[int, int], int]
    table_size: int = 4096
    root: int = field(init=False)
    _tables: dict[tuple[int, int], int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.root = self.phys.alloc(self.table_size)

    def map(self, va: int, pa: int, level: int) -> None:
        """Map the page of ``va`` to ``pa`` with a leaf at ``level`` (0 = root)."""
        table = self.root
        for lvl, (shift, bits) in enumerate(self.levels):
            slot = table + 8 * ((va >> shift) & ((1 << bits) - 1))
            if lvl == level:
                self.phys.write_u64(slot, self.leaf_entry(pa, lvl))
                return
            key = (lvl, va >> shift)
            nxt = self._tables.get(key)
            if nxt is None:
                nxt = self._tables[key] = self.phys.alloc(self.table_size)
                self.phys.write_u64(slot, self.table_entry(nxt))
            table = nxt
