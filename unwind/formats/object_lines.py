"""Source lines of a symbol's code in one ELF file with DWARF (a ``-dbg`` vmlinux, a module's ``.ko``),
and the ``.ko`` files of a folder found by module name, as ``scripts/decode_stacktrace.sh`` finds them.

A ``.ko`` is a relocatable object whose sections all start at 0; its sections are placed one after the
other (:func:`~unwind.formats.dwarf_lines.section_addresses`, as ``addr2line`` places them), and a symbol's
address is its section's place plus its value, so ``name+offset`` is looked up in the section that holds
``name``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .dwarf_lines import DwarfLinesError, LineIndex, SourceLine, has_dwarf, section_addresses
from .image import Image, ImageError

#: ``st_info.type`` of the symbols a trace names (the code kallsyms lists)
_CODE_TYPES = frozenset({"STT_FUNC", "STT_NOTYPE"})


class ObjectLines:
    """An ELF file's symbols and source lines. :class:`~unwind.formats.image.ImageError` when it has no
    DWARF or its DWARF is unreadable."""

    def __init__(self, path: Path) -> None:
        self.image = Image(path)
        if not has_dwarf(self.image.sections_with_contents):
            raise ImageError(f"{path} has no DWARF (.debug_info, .debug_line): give a -dbg vmlinux or "
                             "a module built with debug info")
        try:
            index = LineIndex.of_image(self.image)
        except DwarfLinesError as e:
            raise ImageError(f"{path}: {e}") from None
        assert index is not None
        self.index = index
        self._placed: dict[str, int] | None = None

    def address(self, name: str) -> int | None:
        """The address of the symbol ``name`` where the line index has it (in a ``.ko``, its placed section's
        address plus its value), or ``None``."""
        if self._placed is None:
            self._placed = _placed_symbols(self.image) if self.image.elf["e_type"] == "ET_REL" else {}
        if self._placed:
            return self._placed.get(name)
        try:
            return self.image.symbols.address(name)
        except ImageError:
            return None

    def lookup(self, name: str, offset: int) -> list[SourceLine]:
        """The source position of ``name+offset``, innermost inlined function first; empty when unknown."""
        base = self.address(name)
        return self.index.lookup(base + offset) if base is not None else []

    def locations(self, name: str, offset: int) -> list[str]:
        """``file:line`` per level of ``name+offset``'s inline chain (files under the build folder relative
        to it), innermost first."""
        return [s.location(self.index.comp_dir) for s in self.lookup(name, offset)]


def _placed_symbols(image: Image) -> dict[str, int]:
    """A relocatable object's defined code symbols: name to placed address (the first of a name, a
    global one before a local one)."""
    elf = image.elf
    places = section_addresses(elf)
    found: dict[str, tuple[bool, int]] = {}
    symtab = elf.get_section_by_name(".symtab")
    for sym in symtab.iter_symbols() if symtab is not None else ():
        shndx = sym["st_shndx"]
        if not sym.name or not isinstance(shndx, int) or shndx not in places \
                or sym["st_info"]["type"] not in _CODE_TYPES:
            continue
        local = sym["st_info"]["bind"] == "STB_LOCAL"
        if sym.name not in found or (found[sym.name][0] and not local):
            found[sym.name] = (local, places[shndx] + sym["st_value"])
    return {name: addr for name, (_, addr) in found.items()}


class ModuleFiles:
    """The modules' ``.ko`` files with DWARF under a folder, found by module name (``_`` and ``-`` alike,
    compressed or not: ``find -name "${module//_/[-_]}.ko*"``), each opened once."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._found: dict[str, ObjectLines | None] = {}
        #: why a module asked for has no lines: no ``.ko`` of its name, or what was wrong with each found
        self.problems: dict[str, str] = {}

    def find(self, name: str) -> ObjectLines | None:
        """The module's ``.ko`` with DWARF, or ``None`` (:attr:`problems` then says why)."""
        if name not in self._found:
            self._found[name] = self._open(name)
        return self._found[name]

    def _open(self, name: str) -> ObjectLines | None:
        errors = []
        for path in module_files(self.folder, name):
            try:
                return ObjectLines(path)
            except ImageError as e:
                errors.append(str(e))
        self.problems[name] = "; ".join(errors) or f"no .ko of that name under {self.folder}"
        return None


def module_files(folder: Path, name: str) -> list[Path]:
    """``name.ko*`` under ``folder``, ``_`` and ``-`` taken alike."""
    want = re.compile(re.escape(name).replace("_", "[-_]").replace(r"\-", "[-_]") + r"\.ko(\.xz)?")
    out = []
    for root, dirs, files in os.walk(folder, onerror=lambda e: None):
        dirs.sort()
        out.extend(Path(root) / f for f in sorted(files) if want.fullmatch(f))
    return out
