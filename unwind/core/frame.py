"""What a walk reports: one :class:`Frame` per return address, with its provenance."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntFlag
from typing import Any, Callable

try:
    import cython  # the compiled build's class decorators (Cython's own stand-ins when interpreted)
except ImportError:  # interpreted, without Cython
    from unwind.core import nocython as cython


class Source(str, Enum):
    """Where a frame's pc came from (``enum kunwind_source`` and its kin)."""

    UNKNOWN = "unknown"
    FRAME = "frame record"
    CALLER = "caller"
    TASK = "blocked-task context"
    REGS_PC = "exception registers"
    ORC_CALL = "orc call"
    ORC_REGS = "orc regs"
    ORC_REGS_PARTIAL = "orc partial regs"
    FP_GUESS = "frame-pointer guess"
    EXCEPTION_FRAME = "exception frame"
    LIVE_LR = "live link register"
    STACK_SWITCH = "stack-switch record"


class Flag(IntFlag):
    """Per-frame facts; several may hold at once."""

    NONE = 0
    PAC_STRIPPED = 1 << 0   # a pointer-authentication code was removed from the pc
    FGRAPH = 1 << 1         # return_to_handler resolved through the fgraph return stack
    KRETPROBE = 1 << 2      # a kretprobe/rethook trampoline resolved through its instances
    UNRELIABLE = 1 << 3     # the unwinder guessed (no metadata) or had an error
    BOUNDARY = 1 << 4       # pc taken from exception registers: the LR there is unknown
    COMPLETE = 1 << 5       # the kernel would not print this frame; complete mode added it
    CALLSITE_OK = 1 << 6    # the instruction before the return address is a call
    CALLSITE_BAD = 1 << 7   # ... is not a call (evidence only: faithful output is unchanged)

    def names(self) -> list[str]:
        """The flag names (``pac-stripped``, ``fgraph``, ...), as ``--json`` and ``--explain`` show them."""
        return [name for bit, (name, _) in _FLAG_TEXT.items() if self & bit]

    def letters(self) -> str:
        """One letter per flag, for a compact column: ``P`` pac-stripped, ``F`` fgraph, ``K`` kretprobe,
        ``?`` unreliable, ``B`` boundary, ``C`` complete, ``c`` call-ok, ``!`` call-bad."""
        return "".join(letter for bit, (_, letter) in _FLAG_TEXT.items() if self & bit)


#: every :class:`Flag` combination by its value: ``FLAGS[v]`` is ``Flag(v)`` without the enum's
#: Python-level lookup (hot paths work on ``.value`` ints and take the frame's Flag from here)
FLAGS: tuple[Flag, ...] = tuple(Flag(v) for v in range(max(f.value for f in Flag) << 1))

_FLAG_TEXT = {
    Flag.PAC_STRIPPED: ("pac-stripped", "P"),
    Flag.FGRAPH: ("fgraph", "F"),
    Flag.KRETPROBE: ("kretprobe", "K"),
    Flag.UNRELIABLE: ("unreliable", "?"),
    Flag.BOUNDARY: ("boundary", "B"),
    Flag.COMPLETE: ("complete", "C"),
    Flag.CALLSITE_OK: ("call-ok", "c"),
    Flag.CALLSITE_BAD: ("call-bad", "!"),
}


class LazyText:
    """A text attribute that may be given as a function of no arguments: the function is called, and the
    text it makes kept, the first time the attribute is read (a walk formats nothing no one reads).

    The value lives in the attribute named ``private`` (a slot of the owner's)."""

    def __init__(self, private: str, doc: str) -> None:
        self.private = private
        self.__doc__ = doc

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        text = getattr(obj, self.private)
        if not isinstance(text, str):
            text = text()
            setattr(obj, self.private, text)
        return text

    def __set__(self, obj: object, value: "str | Callable[[], str]") -> None:
        setattr(obj, self.private, value)


def _hex(v: int | None) -> str | None:
    return None if v is None else hex(v)


@dataclass(slots=True)
class Read:
    """One memory read the unwinder made, and what it stood for."""

    addr: int
    size: int
    value: int
    what: str

    def to_json(self) -> dict[str, Any]:
        """JSON form: addresses and values as hex strings."""
        return {"addr": hex(self.addr), "size": self.size, "value": hex(self.value), "what": self.what}


class Provenance:
    """Why a frame is believed: the rule applied, the words read, free-form notes.

    A walk stores numbers and formats nothing until it is read: the rule and each note may be given
    as a function of no arguments (called the first time it is read), each read is kept as a tuple
    and becomes a :class:`Read` when :attr:`reads` is read.
    """

    __slots__ = ("_rule", "_reads", "_notes")

    def __init__(self, rule: "str | Callable[[], str]", reads: list[Read] | None = None,
                 notes: "list[str] | None" = None) -> None:
        self._rule = rule
        self._reads: list[Read | tuple[int, int, int, str]] = list(reads) if reads else []
        self._notes: list[str | Callable[[], str]] = list(notes) if notes else []

    rule = LazyText("_rule", "The rule applied.")

    @property
    def reads(self) -> list[Read]:
        """The memory reads, in order."""
        reads = self._reads
        for i, r in enumerate(reads):
            if type(r) is tuple:
                reads[i] = Read(*r)
        return reads  # type: ignore[return-value]

    @property
    def notes(self) -> list[str]:
        """The notes, in order."""
        notes = self._notes
        for i, n in enumerate(notes):
            if not isinstance(n, str):
                notes[i] = n()
        return notes  # type: ignore[return-value]

    def read(self, addr: int, size: int, value: int, what: str) -> None:
        """Record a read."""
        self._reads.append((addr, size, value, what))

    def note(self, text: "str | Callable[[], str]") -> None:
        """Record a note (a function of no arguments is called when the notes are read)."""
        self._notes.append(text)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"rule": self.rule, "reads": [r.to_json() for r in self.reads], "notes": list(self.notes)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Provenance):
            return NotImplemented
        return (self.rule, self.reads, self.notes) == (other.rule, other.reads, other.notes)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return f"Provenance(rule={self.rule!r}, reads={self.reads!r}, notes={self.notes!r})"


@dataclass(frozen=True, slots=True)
class SourceLine:
    """One level of an address's source position: the function and where in the source the address
    stands (the innermost level), or where the level inside it was inlined (every outer level).
    ``function`` is ``None`` where no subprogram holds the address (``addr2line`` prints ``??``)."""

    function: str | None
    file: str
    line: int

    def short_file(self, base: str | None) -> str:
        """The file relative to ``base`` (the build folder) when under it, as ``decode_stacktrace.sh``
        strips its base path."""
        if base and self.file.startswith(base.rstrip("/") + "/"):
            return self.file[len(base.rstrip("/")) + 1:]
        return self.file

    def location(self, base: str | None = None) -> str:
        """``file:line``."""
        return f"{self.short_file(base)}:{self.line}"

    def to_json(self, base: str | None = None) -> dict[str, Any]:
        """``{"function", "file", "line"}``, the file relative to ``base`` when under it."""
        return {"function": self.function, "file": self.short_file(base), "line": self.line}


# A frame is never part of a reference cycle (no field leads back to it), so the compiled build leaves it to
# reference counting: the cyclic collector does not visit the frames a caller keeps, nor count them.
@cython.no_gc
@cython.cclass
class Frame:
    """One reported frame.

    ``sp`` and ``fp`` are ``None`` where the unwinder does not know them
    (arm64 kunwind tracks no sp; x86 ORC tracks no frame pointer chain).
    ``pt_regs`` is the address of the ``struct pt_regs`` the walk read this frame's pc from (an exception
    boundary crossed on the stack), ``None`` elsewhere (the CPU's own registers are in no memory).

    ``line`` is the frame's own source position, asked for with ``Session.replay(..., lines=True)``: where in
    the function its symbol names (the outermost level of the inline chain) the frame stands, or was inlined
    into by ``inlined``; ``None`` when not asked for, or when the image has no DWARF for the pc.
    ``inlined`` is the functions inlined at the frame's pc, innermost first, each where it stands or where
    the next one in was inlined (``addr2line -i``'s levels before the last); empty when none, or ``line`` is
    ``None``.
    """

    __slots__ = ("pc", "sp", "fp", "source", "stack", "flags", "provenance", "symbol", "extra", "pt_regs",
                 "line", "inlined")

    def __init__(self, pc: int, sp: int | None = None, fp: int | None = None, source: Source = Source.UNKNOWN,
                 stack: str | None = None, flags: Flag = Flag.NONE, provenance: Provenance | None = None,
                 symbol: str | None = None, extra: dict[str, Any] | None = None, pt_regs: int | None = None,
                 line: SourceLine | None = None, inlined: tuple[SourceLine, ...] = ()) -> None:
        self.pc = pc
        self.sp = sp
        self.fp = fp
        self.source = source
        self.stack = stack
        self.flags = flags
        self.provenance = provenance
        self.symbol = symbol
        self.extra = extra
        self.pt_regs = pt_regs
        self.line = line
        self.inlined = inlined

    def _fields(self) -> tuple[Any, ...]:
        return (self.pc, self.sp, self.fp, self.source, self.stack, self.flags, self.provenance, self.symbol,
                self.extra, self.pt_regs, self.line, self.inlined)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable

    @property
    def reliable(self) -> bool:
        """False for guessed frames and frames the kernel would not have printed."""
        return not (self.flags & (Flag.UNRELIABLE | Flag.COMPLETE))

    @property
    def name(self) -> str | None:
        """The function's name (drgn ``StackFrame.name``): the symbol without its offset, ``None`` if unknown."""
        if not self.symbol or self.symbol.startswith("0x"):
            return None
        return self.symbol.split("+", 1)[0]

    @property
    def interrupted(self) -> bool:
        """The pc came from exception registers (drgn ``StackFrame.interrupted``): not a return address."""
        return bool(self.flags & Flag.BOUNDARY)

    def to_json(self, explain: bool = False) -> dict[str, Any]:
        """The frame as ``docs/json.md`` describes ``frames[]`` (without the printed-line fields)."""
        out: dict[str, Any] = {
            "pc": hex(self.pc), "sp": _hex(self.sp), "fp": _hex(self.fp), "symbol": self.symbol,
            "source": self.source.value, "stack": self.stack, "flags": self.flags.names(),
            "reliable": self.reliable,
        }
        if explain and self.provenance is not None:
            out["provenance"] = self.provenance.to_json()
        return out

    def __str__(self) -> str:
        """drgn's ``StackFrame`` style without the index: ``0xffff... (sym+0x1c/0x80) [source] flags``."""
        sym = f" ({self.symbol})" if self.symbol and self.symbol != hex(self.pc) else ""
        flags = f" {','.join(self.flags.names())}" if self.flags else ""
        return f"{self.pc:#x}{sym} [{self.source.value}]{flags}"

    def __repr__(self) -> str:
        sym = f" {self.symbol}" if self.symbol else ""
        return f"<Frame {self.pc:#x}{sym} [{self.source.name}] {self.stack or '-'} {self.flags.letters()}>"
