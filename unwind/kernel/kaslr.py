"""A kernel image as a KASLR kernel ran it: every address the image gives shifted by the slide.

The image's symbols, sections and text are at link addresses; a vmcore of a
kernel booted with KASLR holds runtime ones (``KERNELOFFSET`` in
VMCOREINFO, ``kaslr_offset()``). :class:`RelocatedImage` presents the image
at the runtime addresses, so the walkers, the ORC loader, the call-site
check and the printers need not know about the slide.
"""

from __future__ import annotations

from array import array
from functools import cached_property
from typing import Any, Callable

from unwind.formats.image import Image
from .symbols import SymbolTable


def runtime_symbols(symbols: SymbolTable, slide: int) -> Callable[[str], int | None]:
    """Symbol name -> runtime address: the link address plus the KASLR ``slide``, except zero-based
    per-CPU symbols (x86-64 before 6.15), which are offsets into each CPU's area."""
    pcpu_lo, pcpu_hi = symbols.address("__per_cpu_start"), symbols.address("__per_cpu_end")
    zero_based = pcpu_lo == 0 and pcpu_hi is not None

    def symbol(name: str) -> int | None:
        addr = symbols.address(name)
        if addr is None or not slide or (zero_based and addr < pcpu_hi):  # type: ignore[operator]
            return addr
        return addr + slide

    return symbol


def relocate_symbols(table: SymbolTable, slide: int) -> SymbolTable:
    """``table`` with every address moved by ``slide`` (modulo 2**64)."""
    import numpy as np

    arrays = dict(table.to_arrays())
    shift = np.uint64(slide % 2**64)
    for key in ("addrs", "last_end", "index_addrs"):
        moved = np.frombuffer(arrays[key], dtype=np.uint64) + shift  # uint64: wraps modulo 2**64
        arrays[key] = array("Q", moved.tobytes())
    return SymbolTable.from_arrays(arrays)


class RelocatedImage:
    """``image`` seen at runtime addresses: link address + ``slide``."""

    def __init__(self, image: Image, slide: int) -> None:
        self.image = image
        self.slide = slide

    def __getattr__(self, name: str) -> Any:
        return getattr(self.image, name)

    @cached_property
    def symbols(self) -> SymbolTable:
        """The image's symbols at their runtime addresses."""
        return relocate_symbols(self.image.symbols, self.slide)

    def section(self, name: str) -> tuple[int, bytes] | None:
        """``(runtime sh_addr, data)`` of a section with file contents."""
        sec = self.image.section(name)
        return None if sec is None else ((sec[0] + self.slide) % 2**64, sec[1])

    def text(self, addr: int, size: int) -> bytes | None:
        """Kernel text at a runtime address."""
        return self.image.text((addr - self.slide) % 2**64, size)
