"""Source lines of a replay's frames (``unwind replay --lines``).

Each frame's pc is decoded where the kernel's ``%pB`` and gdb decode it: a return address at its call
(``pc - 1``, the call instruction, not the one after it), a pc taken from exception registers where it
stands. The lines come from the DWARF of the session's image, or, when that image has none (a slim or
stripped vmlinux), of another image of the same build-id found the usual way (``-dbg`` vmlinux in
``/usr/lib/debug`` or fetched into the cache); a vmcore's KASLR slide is taken off first. A frame in a
module is named by the module's kallsyms (``name+offset``, as the trace prints it) and looked up at that
symbol in the module's ``.ko`` found by name under a folder (``--modules DIR``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

from unwind.core.frame import Frame, Source, SourceLine
from unwind.formats.dwarf_lines import DwarfLinesError, LineIndex, has_dwarf
from unwind.formats.image import Image, ImageError, find_image
from unwind.formats.object_lines import ModuleFiles, ObjectLines
from unwind.kernel.kaslr import RelocatedImage
from unwind.kernel.symbols import KernelSymbols, Symbol

if TYPE_CHECKING:
    from .replay import Session

#: the indent of a frame's source lines under its trace line (that of ``--explain``)
_PAD = "      "


def decode_address(frame: Frame) -> int:
    """The address a frame's source line is looked up at: an exception pc (``Flag.BOUNDARY``) where it
    stands, a return address at its call (``pc - 1``), as ``sprint_backtrace()`` (``%pB``) looks it up.
    A live link register is a return address even where it was read from exception registers."""
    if frame.interrupted and frame.source is not Source.LIVE_LR:
        return frame.pc
    return frame.pc - 1


def frame_levels(frame: Frame) -> list[SourceLine]:
    """The frame's :attr:`~Frame.inlined` levels then its :attr:`~Frame.line`: innermost first, as
    ``addr2line -i`` prints them; empty when the frame has no line."""
    return [*frame.inlined, frame.line] if frame.line is not None else []


def inline_text(levels: list[SourceLine], base: str | None) -> list[str]:
    """``func at file:line``, then `` (inlined by) caller at file:line`` per outer level, as
    ``scripts/faddr2line`` prints an inline chain."""
    out = []
    for i, s in enumerate(levels):
        lead = "" if i == 0 else " (inlined by) "
        out.append(f"{lead}{s.function or '??'} at {s.location(base)}")
    return out


@dataclass
class FrameLines:
    """The line index a session's frames are decoded with, or why there is none (:attr:`note`)."""

    index: LineIndex | None
    #: the KASLR slide taken off a runtime pc to find it in the image
    slide: int = 0
    #: the image the lines come from
    image: Image | None = None
    #: a one-line note for the user when no lines can be shown
    note: str | None = None
    #: the modules' ``.ko`` files, and the runtime symbols that say which module holds a pc
    modules: ModuleFiles | None = None
    symbols: KernelSymbols | None = None

    @classmethod
    def of_session(cls, session: Session, modules: str | os.PathLike[str] | None = None) -> "FrameLines":
        """The lines of ``session``'s image, or of an image of the same build-id that has DWARF; a
        module's frames from its ``.ko`` under the folder ``modules``."""
        lines = cls._of_image(session)
        if modules is not None:
            lines.modules = ModuleFiles(modules)
            lines.symbols = session.symbols if isinstance(session.symbols, KernelSymbols) else None
        return lines

    @classmethod
    def _of_image(cls, session: Session) -> "FrameLines":
        image = session.image
        slide = 0
        if isinstance(image, RelocatedImage):
            image, slide = image.image, image.slide
        if image is None:
            return cls(None, note="--lines: no kernel image, so no source lines")
        if not has_dwarf(image.sections_with_contents):
            try:
                found = find_image(image.build_id, session.dump.path, None, session.dump.release,
                                   accept=lambda img: has_dwarf(img.sections_with_contents))
            except ImageError:
                found = None
            if found is None:
                return cls(None, note=f"--lines: {image.path} has no DWARF (.debug_info, .debug_line) and no image "
                           f"of build-id {image.build_id} with DWARF was found (a -dbg vmlinux: `unwind kernels "
                           "fetch`, /usr/lib/debug): no source lines")
            image = found
        try:
            return cls(LineIndex.of_image(image), slide, image)
        except DwarfLinesError as e:
            return cls(None, note=f"--lines: {image.path}: {e}: no source lines")

    def of_frame(self, frame: Frame) -> list[SourceLine]:
        """The frame's source position, innermost inlined function first; empty when unknown. Code
        without a DWARF subprogram (assembly) is named by the image's symbol, as ``addr2line`` names it."""
        module = self._in_module(frame)
        if module is not None:
            sym, obj = module
            return obj.lookup(sym.name, sym.offset) if sym is not None and obj is not None else []
        if self.index is None:
            return []
        addr = (decode_address(frame) - self.slide) % 2**64
        levels = self.index.lookup(addr)
        if len(levels) == 1 and levels[0].function is None and self.image is not None:
            sym = self.image.symbols.lookup(addr)
            if sym is not None:
                levels = [replace(levels[0], function=sym.name)]
        return levels

    def fill(self, frames: Sequence[Frame]) -> None:
        """Set each frame's :attr:`~Frame.line` (the outermost level of :meth:`of_frame`) and
        :attr:`~Frame.inlined` (the levels inside it)."""
        for f in frames:
            levels = self.of_frame(f)
            f.line, f.inlined = (levels[-1], tuple(levels[:-1])) if levels else (None, ())

    def _in_module(self, frame: Frame) -> tuple[Symbol | None, ObjectLines | None] | None:
        """For a frame in a module (``__module_address()``, with ``--modules``): its kallsyms symbol
        (``module_address_lookup()``) and the module's ``.ko``, each ``None`` when unknown; ``None`` for
        a frame in no module."""
        if self.symbols is None or self.modules is None:
            return None
        addr = decode_address(frame)
        if self.symbols.module_at(addr) is None:
            return None
        sym = self.symbols.lookup(addr)
        return sym, self.modules.find(sym.module) if sym is not None and sym.module else None

    def base(self, frame: Frame) -> str | None:
        """The build folder stripped from the frame's file names: its module's or the image's."""
        module = self._in_module(frame)
        if module is not None:
            return module[1].index.comp_dir if module[1] is not None else None
        return self.index.comp_dir if self.index is not None else None

    def text(self, frame: Frame) -> list[str]:
        """The lines printed under the frame's trace line, from its fields :meth:`fill` set."""
        return [_PAD + t for t in inline_text(frame_levels(frame), self.base(frame))]

    def to_json(self, frame: Frame) -> list[dict[str, Any]]:
        """``frames[].lines``: ``{"function", "file", "line"}`` per level, innermost first, from the frame's
        fields :meth:`fill` set."""
        base = self.base(frame)
        return [s.to_json(base) for s in frame_levels(frame)]
