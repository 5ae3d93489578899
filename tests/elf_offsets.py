"""Where an address of an ELF core's memory lies in its file, for tests that change one word of a real dump."""

from __future__ import annotations

from pathlib import Path

from elftools.elf.elffile import ELFFile


def file_offset(path: Path, addr: int, field: str = "p_vaddr") -> int:
    """The file offset of ``addr``: a virtual address (``p_vaddr``), or a physical one with ``field="p_paddr"``."""
    with open(path, "rb") as f:
        for seg in ELFFile(f).iter_segments("PT_LOAD"):
            if seg[field] <= addr < seg[field] + seg["p_filesz"]:
                return seg["p_offset"] + addr - seg[field]
    raise AssertionError(f"{field[2:]} {addr:#x} is in no segment")
