"""``unwind decode``: source lines for every trace line of console or dmesg text.

It does what the kernel's ``scripts/decode_stacktrace.sh`` does, without binutils: each line holding a
``name+0xoff/0xsize`` (a ``Call Trace:`` frame, a sysrq-t frame, a ``RIP:``, ``pc :``, ``lr :``,
``epc :`` or `` ra :`` register line, an x86 ``? `` guess, a ``[module]`` frame) has the symbol replaced by
``name (file:line ...)``, the locations of the inline chain innermost first, and any ``[<address>]``
word dropped; every other line passes through unchanged. The address is the symbol's in the image (or,
for a ``[module]`` frame, its offset in the module's ``.ko``, found by name under ``--modules``) plus the
offset. A return address is decoded at its call (``address - 1``, as ``%pB`` and gdb do); an exception
pc where it stands: a register line's ``pc``/``RIP``/``epc``, the trace's frame that repeats it (the first
frame of a trace from registers, before 6.13 unmarked), an arm64 frame marked ``(P)``; a function's entry
(``+0x0``) too. Timestamps, log levels, caller ids and the arm64 source markers
(``(P)``, ``(C)``, ``(F)``, ``(CF)``, ...) are kept as they are.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from unwind.formats.console import SYMBOL_RE
from unwind.formats.dwarf_lines import DwarfLinesError, LineIndex, has_dwarf
from unwind.formats.image import Image, ImageError

#: a register line's label whose value is an exception pc: x86 ``RIP:``, arm64 ``pc :``, riscv ``epc :``
_PC_LABEL = re.compile(r"(?:\bRIP: |\bpc : |\bepc : )$")
#: ``[<ffffffff8001af18>]``, the raw address riscv (and older kernels) print before a frame
_RAW_ADDRESS = re.compile(r"\s*\[<[0-9a-fA-F]+>\]")


@dataclass(frozen=True, slots=True)
class TraceSymbol:
    """One ``name+0xoff`` found in a line: where it is and how its address is decoded."""

    start: int
    end: int
    segment: str
    name: str
    offset: int
    module: str | None
    module_text: str
    info: str
    #: the value of a register line that holds an exception pc (``RIP:``, ``pc :``, ``epc :``)
    pc_register: bool
    #: decoded where it stands (an exception pc, a function entry), not at the call before it
    in_place: bool

    @property
    def key(self) -> tuple[str | None, str, int]:
        """What names the address: module, symbol, offset."""
        return self.module, self.name, self.offset


def find_symbol(line: str) -> TraceSymbol | None:
    """The last ``name+0xoff/0xsize`` of ``line`` (the one ``decode_stacktrace.sh`` decodes), or ``None``."""
    found = None
    for found in SYMBOL_RE.finditer(line):
        pass
    if found is None:
        return None
    offset = int(found["off"], 16)
    info = found["info"] or ""
    pc_register = bool(_PC_LABEL.search(line[:found.start()]))
    return TraceSymbol(found.start(), found.end(), found["segment"] or "", found["name"], offset,
                       found["modname"], found["module"] or "", info, pc_register,
                       pc_register or "P" in info or offset == 0)


class ObjectLines:
    """An ELF file's symbols and source lines (the vmlinux, or a module's ``.ko``)."""

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

    def locations(self, sym: TraceSymbol) -> list[str] | None:
        """``file:line`` per level of the inline chain, innermost first, or ``None`` when unknown."""
        try:
            base = self.image.symbols.address(sym.name)
        except ImageError:
            return None
        if base is None:
            return None
        addr = base + sym.offset - (0 if sym.in_place else 1)
        levels = self.index.lookup(addr)
        return [s.location(self.index.comp_dir) for s in levels] or None


class Decoder:
    """Decodes console lines against a vmlinux (any ELF with symbols and DWARF) and its modules."""

    def __init__(self, vmlinux: str | os.PathLike[str], modules: str | os.PathLike[str] | None = None,
                 warn: TextIO | None = None) -> None:
        self.vmlinux = ObjectLines(Path(vmlinux))
        self.modules_dir = Path(modules) if modules is not None else None
        self._modules: dict[str, ObjectLines | None] = {}
        self._warn = warn
        #: the last exception pc a register line showed: a trace frame repeating it is that pc
        self._exception_pc: tuple[str | None, str, int] | None = None

    def module(self, name: str) -> ObjectLines | None:
        """The module's ``.ko`` (``_`` and ``-`` alike, compressed or not) with DWARF under ``--modules``."""
        if name in self._modules:
            return self._modules[name]
        found = None
        if self.modules_dir is not None:
            for path in _module_files(self.modules_dir, name):
                try:
                    found = ObjectLines(path)
                    break
                except ImageError:
                    continue
        if found is None and self._warn is not None:
            where = f"under {self.modules_dir}" if self.modules_dir else "(no --modules DIR given)"
            print(f"unwind: warning: no {name}.ko with DWARF {where}: its frames are left as they are",
                  file=self._warn)
        self._modules[name] = found
        return found

    def decode_line(self, line: str) -> str:
        """``line`` with its frame decoded, or unchanged."""
        sym = find_symbol(line)
        if sym is None:
            return line
        if sym.pc_register:
            self._exception_pc = sym.key
        elif sym.key == self._exception_pc:
            sym = replace(sym, in_place=True)
        obj = self.vmlinux if sym.module is None else self.module(sym.module)
        code = obj.locations(sym) if obj is not None else None
        if code is None:
            return line
        prefix = _RAW_ADDRESS.sub("", line[:sym.start])
        return f"{prefix}{sym.segment}{sym.name} ({' '.join(code)}){sym.module_text}{sym.info}{line[sym.end:]}"

    def decode(self, lines: Iterable[str]) -> Iterator[str]:
        """Each line decoded (without its line end)."""
        for line in lines:
            yield self.decode_line(line.rstrip("\r\n"))


def _module_files(folder: Path, name: str) -> list[Path]:
    """``name.ko*`` under ``folder``, ``_`` and ``-`` taken alike (``find -name "${module//_/[-_]}.ko*"``)."""
    want = re.compile(re.escape(name).replace("_", "[-_]").replace(r"\-", "[-_]") + r"\.ko(\.xz)?")
    out = []
    for root, dirs, files in os.walk(folder, onerror=lambda e: None):
        dirs.sort()
        out.extend(Path(root) / f for f in sorted(files) if want.fullmatch(f))
    return out


def cmd_decode(args: argparse.Namespace) -> int:
    """``unwind decode``: print the log with its trace lines decoded."""
    decoder = Decoder(args.vmlinux, args.modules, warn=sys.stderr)
    if args.log in (None, "-"):
        source: TextIO = sys.stdin
        for out in decoder.decode(source):
            print(out)
        return 0
    with open(args.log, encoding="utf-8", errors="replace") as f:
        for out in decoder.decode(f):
            print(out)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``decode`` to the top-level parser."""
    p = sub.add_parser("decode", help="add source lines to the kernel traces of console or dmesg text",
                       description="Read console or dmesg text and print it with every trace line's symbol "
                       "replaced by its source file:line and inline chain, as the kernel's "
                       "scripts/decode_stacktrace.sh does; other lines pass through unchanged.")
    p.add_argument("log", nargs="?", metavar="LOG", help="the text to decode (default or '-': standard input)")
    p.add_argument("--vmlinux", metavar="IMAGE", required=True,
                   help="the kernel image with DWARF (a -dbg vmlinux; any ELF with symbols and DWARF)")
    p.add_argument("--modules", metavar="DIR", help="folder searched for the modules' .ko files, by name")
    p.set_defaults(func=cmd_decode)
