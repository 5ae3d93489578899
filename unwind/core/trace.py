"""A printed trace as data: each line the kernel would print, with what it stands for.

A backend's ``format_trace`` returns :class:`TraceLine` objects; the text output
prints their ``text`` and ``--json`` carries their ``kind`` and ``data`` too, so
both forms come from one list and the JSON holds everything the text shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from .frame import Flag, Frame


class LineKind(str, Enum):
    """What a printed line is."""

    HEADER = "header"   # "Call trace:", "Call Trace:", "<user stack trace>"
    FRAME = "frame"     # one frame of the walk
    GUESS = "guess"     # an x86 stack-scan word printed with "? " that is no frame of the walk
    MARKER = "marker"   # a stack boundary ("<IRQ>", "</IRQ>") or a stack switch
    REGS = "regs"       # registers ("RIP: ...", "RAX: ...", "epc : ...")
    CODE = "code"       # the "Code:" bytes around an ip


@dataclass(slots=True)
class TraceLine:
    """One printed line.

    ``data`` holds the line's values (documented per kind in ``docs/json.md``):
    ``pc`` and ``symbol`` for frames and guesses, ``regs`` (name -> value) for
    register lines, ``stack`` and ``edge`` for markers, ``bytes`` and ``at`` for
    ``Code:``. ``frame`` is the walk's frame the line prints, if any.
    """

    text: str
    kind: LineKind
    frame: Frame | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def header(cls, text: str) -> "TraceLine":
        """A header line."""
        return cls(text, LineKind.HEADER)

    @classmethod
    def of_frame(cls, text: str, frame: Frame, pc: int, symbol: str) -> "TraceLine":
        """A frame's line: ``pc`` and ``symbol`` are what it prints (a trampoline where the kernel does not
        recover the caller), not necessarily ``frame.pc``."""
        return cls(text, LineKind.FRAME, frame, {"pc": pc, "symbol": symbol})

    @classmethod
    def guess(cls, text: str, pc: int, symbol: str) -> "TraceLine":
        """An x86 ``? `` line of the stack scan."""
        return cls(text, LineKind.GUESS, None, {"pc": pc, "symbol": symbol})

    @classmethod
    def marker(cls, text: str, stack: str, edge: str) -> "TraceLine":
        """A stack marker: ``edge`` is ``begin``, ``end`` or ``switch``."""
        return cls(text, LineKind.MARKER, None, {"stack": stack, "edge": edge})

    @classmethod
    def regs(cls, text: str, regs: dict[str, int], frame: Frame | None = None, **more: Any) -> "TraceLine":
        """A register line with the values it shows."""
        return cls(text, LineKind.REGS, frame, {"regs": dict(regs), **more})

    def to_json(self, frame_index: dict[int, int]) -> dict[str, Any]:
        """JSON form: integers as hex strings, ``frame`` as an index into the replay's frames."""
        out: dict[str, Any] = {"kind": self.kind.value, "text": self.text,
                               "frame": frame_index.get(id(self.frame)) if self.frame is not None else None}
        for k, v in self.data.items():
            out[k] = _hexed(v)
        return out


#: what :func:`frame_line` puts after a frame only complete mode adds
_COMPLETE_MARK = " [complete"


def frame_line(frame: Frame, symbol: str, text: str, complete_why: Callable[[Frame], str]) -> TraceLine:
    """The line ``text`` printing ``frame`` (``symbol`` is the symbol it shows); on a frame only complete
    mode adds, `` [complete: why]`` follows, ``why`` from the arch's ``complete_why(frame)`` (an empty one
    leaves `` [complete]``)."""
    if frame.flags & Flag.COMPLETE:
        why = complete_why(frame)
        text += f"{_COMPLETE_MARK}: {why}]" if why else f"{_COMPLETE_MARK}]"
    return TraceLine(text, LineKind.FRAME, frame, {"pc": frame.pc, "symbol": symbol})


def kernel_text(line: TraceLine) -> str:
    """The line as the kernel prints it: its text without the `` [complete: why]`` :func:`frame_line` adds."""
    if line.frame is not None and line.frame.flags & Flag.COMPLETE and _COMPLETE_MARK in line.text:
        return line.text[:line.text.rindex(_COMPLETE_MARK)]
    return line.text


def _hexed(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, dict)):
        return v
    if isinstance(v, dict):
        return {k: _hexed(x) for k, x in v.items()}
    return hex(v)
