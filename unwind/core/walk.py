"""The arch-free walk: hand frames to a consumer until the unwinder stops.

Mirrors ``do_kunwind()`` in ``arch/arm64/kernel/stacktrace.c`` and the
consumer adapters the kernel builds on it (``arch_stack_walk``,
``arch_stack_walk_reliable``, ``arch_bpf_stack_walk``). A backend supplies an
:class:`Unwinder`: ``start()`` gives the first frame, ``next()`` each further
one; where the kernel's step returns ``-ENOENT`` (a clean end) or an error,
``start()`` raises an :class:`UnwindStop` and ``next()`` raises one or returns
the walk's :class:`Stop` (a walk's natural end is returned, as the kernel's loop
tests the step's return value: a raise costs more than the rest of a short
walk's end, and the returned stop is the one the walk hands back, its frame
count set by the loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Iterator

from .frame import Flag, Frame, LazyText
from .memory import Memory
from .stackinfo import StackInfo

DEFAULT_MAX_FRAMES = 4096
#: frames a walk may report beyond one per min_frame_bytes of captured stack: those that consume no
#: stack (the first frame from registers or a saved context, exception-register and live-LR frames)
FRAME_LIMIT_SLACK = 4


class _Detail:
    """A stop's ``detail`` sentence, kept as given; given as a function of no arguments, it is made
    the first time it is read."""

    __slots__ = ()
    reason: StopReason
    _detail: "str | Callable[[], str]"

    detail = LazyText("_detail", "The sentence: what the walk saw where it stopped.")

    def __str__(self) -> str:
        return f"{self.reason.text}: {self.detail}" if self.detail else self.reason.text


class StopReason(Enum):
    """Why a walk ended. ``clean`` tells a normal end from an error."""

    END_OF_STACK = ("end of stack", True)
    USER_MODE = ("reached user-mode registers", True)
    CONSUMER_STOPPED = ("consumer stopped the walk", True)
    #: clean but truncated: the kernel's own unwinder stops here too (faithful mode prints what it prints)
    KERNEL_LIMIT = ("the kernel's unwinder stops here", True)
    FIRMWARE = ("the CPU is in firmware", True)
    TASK_EXITED = ("task has exited; its stack is freed", True)
    MISALIGNED_FP = ("misaligned frame pointer", False)
    OUTSIDE_STACK = ("record outside every stack", False)
    TRANSITION_REFUSED = ("stack transition refused", False)
    MEMORY_FAULT = ("memory not in the dump", False)
    UNKNOWN_METADATA = ("unknown unwind metadata", False)
    RECOVERY_FAILED = ("return address could not be recovered", False)
    BAD_PC = ("pc is not kernel text", False)
    MISSING_REGISTER = ("register value not available", False)
    FRAME_LIMIT = ("frame limit reached", False)
    UNRELIABLE = ("walk is not reliable", False)

    def __init__(self, text: str, clean: bool) -> None:
        self.text = text
        self.clean = clean


# the ends the walk itself makes, looked up once: an enum member read from its class is a slot call
_FRAME_LIMIT = StopReason.FRAME_LIMIT
_CONSUMER_STOPPED = StopReason.CONSUMER_STOPPED


class Stop(_Detail):
    """The end of a walk: the reason, a sentence of detail, frames consumed.

    ``detail`` may be given as a function of no arguments: it is called the first time the
    detail is read.
    """

    __slots__ = ("reason", "_detail", "frames")

    def __init__(self, reason: StopReason, detail: "str | Callable[[], str]" = "", frames: int = 0) -> None:
        self.reason = reason
        self._detail = detail
        self.frames = frames

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stop):
            return NotImplemented
        return (self.reason, self.detail, self.frames) == (other.reason, other.detail, other.frames)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return f"Stop(reason={self.reason!r}, detail={self.detail!r}, frames={self.frames!r})"

    @property
    def clean(self) -> bool:
        """True for a normal end of the walk."""
        return self.reason.clean

    @property
    def truncated(self) -> bool:
        """A clean stop where the kernel's unwinder gives up before the stack's end (``--complete`` may go on)."""
        return self.reason is StopReason.KERNEL_LIMIT


class UnwindStop(_Detail, Exception):
    """Raised by a backend step to end the walk (``-ENOENT`` or an error); ``detail`` as in :class:`Stop`."""

    def __init__(self, reason: StopReason, detail: "str | Callable[[], str]" = "") -> None:
        # every walk ends in one: the message is made when read, and Exception.__init__ is not called
        # (BaseException.__new__ keeps the arguments as ``args``; a super() call through the mixin costs
        # as much as the rest of the raise)
        self.reason = reason
        self._detail = detail


def stop_on_lost_entries(lacks: str | None, where: str) -> None:
    """At a hijacked return no entry recovers: stop when the dump lacks part of the task's entries
    (``lacks``, e.g. :attr:`unwind.core.target.Task.fgraph_lacks`), since the kernel, holding them all, may
    find one there."""
    if lacks is not None:
        raise UnwindStop(StopReason.MEMORY_FAULT, f"{where}: {lacks}")


class Unwinder:
    """One walk of one task, as an arch backend implements it (a backend overrides :meth:`start` and
    :meth:`next`)."""

    #: arm64 and the proposed RISC-V port refuse any frame taken from exception
    #: registers in the reliable walk; x86 ORC accepts kernel pt_regs.
    reliable_refuses_boundary: bool = True

    def start(self) -> Frame:
        """Initialise from the task's registers or saved context; return the first frame."""
        raise NotImplementedError

    def next(self) -> "Frame | Stop | UnwindStop":
        """Step to the caller's frame; at the end, return the :class:`Stop` (its ``frames`` are set by the
        walk) or raise an :class:`UnwindStop`."""
        raise NotImplementedError

    def bpf_args(self, frame: Frame) -> tuple[int, int, int]:
        """What ``arch_bpf_stack_walk`` hands its consumer: ``(ip, sp, fp)``."""
        return frame.pc, 0, frame.fp or 0

    def basis(self) -> dict[str, str]:
        """What the walk followed: ``generation`` and ``generation_why``, and per struct the layout read
        and where it came from (BTF, the dump, derived from the stacks, or the table)."""
        return self.basis_maker()()

    def basis_maker(self) -> Callable[[], dict[str, str]]:
        """A function of no arguments that makes :meth:`basis`, holding what it is made of but not this
        walk (a :class:`~unwind.session.result.Replay` keeps it until its basis is read). A backend
        overrides this; here the basis is empty."""
        return dict


Consumer = Callable[[Frame], bool]


def frame_limit(stacks: Iterable[StackInfo], mem: Memory, min_frame_bytes: int = 16) -> int:
    """The default frame limit of a walk: one frame per ``min_frame_bytes`` captured bytes of its
    stacks, plus :data:`FRAME_LIMIT_SLACK`. Each frame a walk reports from the stack consumes at
    least ``min_frame_bytes`` of it (:attr:`unwind.core.registry.ArchBackend.min_frame_bytes`) and the
    stacks are consumed one way, so no honest walk reports more."""
    total = 0
    for s in stacks:
        total += mem.captured_size(s.low, s.high)
    return total // min_frame_bytes + FRAME_LIMIT_SLACK


# do_kunwind()
def kunwind_stack_walk(unwinder: Unwinder, consume: Consumer | None,
                       max_frames: int = DEFAULT_MAX_FRAMES, frames: list[Frame] | None = None) -> Stop:
    """Run the walk: consume each frame, then step, until a stop. With ``consume`` ``None`` each frame
    is appended to ``frames`` (the plain recorder, which never stops the walk: no call per frame)."""
    count = 0
    try:
        frame = unwinder.start()
        while True:
            if consume is None:
                frames.append(frame)  # type: ignore[union-attr]
            elif not consume(frame):
                return Stop(_CONSUMER_STOPPED, frames=count + 1)
            count += 1
            if count >= max_frames:
                return Stop(_FRAME_LIMIT, f"{max_frames} frames", count)
            frame = unwinder.next()
            if type(frame) is not Frame:  # the step's stop, returned (kunwind_next()'s ret)
                if type(frame) is Stop:  # made by the step for this walk: handed back with its count
                    frame.frames = count  # type: ignore[union-attr]
                    return frame  # type: ignore[return-value]
                return Stop(frame.reason, frame._detail, count)  # type: ignore[union-attr]
    except UnwindStop as stop:
        return Stop(stop.reason, stop._detail, count)


# arch_stack_walk()
def stack_walk(unwinder: Unwinder, consume_pc: Callable[[int], bool],
               max_frames: int = DEFAULT_MAX_FRAMES) -> Stop:
    """The plain walk: the consumer sees each pc."""
    return kunwind_stack_walk(unwinder, lambda f: consume_pc(f.pc), max_frames)


@dataclass(slots=True)
class ReliableResult:
    """Outcome of :func:`stack_walk_reliable`: ``ok`` or the reason it is not."""

    ok: bool
    stop: Stop
    reason: str = ""


# arch_stack_walk_reliable() and arch_reliable_kunwind_consume_entry()
def stack_walk_reliable(unwinder: Unwinder, consume_pc: Callable[[int], bool],
                        max_frames: int = DEFAULT_MAX_FRAMES) -> ReliableResult:
    """The reliable walk: any exception boundary, guess or error fails it all."""
    refusal: list[str] = []

    def consume(frame: Frame) -> bool:
        if frame.flags & Flag.UNRELIABLE:
            what = "complete-mode frame" if frame.flags & Flag.COMPLETE else "guessed frame"
            refusal.append(f"{what} at {frame.pc:#x}")
            return False
        if unwinder.reliable_refuses_boundary and frame.flags & Flag.BOUNDARY:
            refusal.append(f"exception boundary at {frame.pc:#x}: the LR there may be live")
            return False
        return consume_pc(frame.pc)

    stop = kunwind_stack_walk(unwinder, consume, max_frames)
    if refusal:
        return ReliableResult(False, stop, refusal[0])
    # a walk the kernel's unwinder ends early (truncated) is one whose reliable walk fails too
    if stop.reason is StopReason.CONSUMER_STOPPED or not stop.clean or stop.truncated:
        return ReliableResult(False, stop, str(stop))
    return ReliableResult(True, stop)


# arch_bpf_stack_walk()
def bpf_stack_walk(unwinder: Unwinder, consume: Callable[[int, int, int], bool],
                   max_frames: int = DEFAULT_MAX_FRAMES) -> Stop:
    """The BPF walk: the consumer sees ``(ip, sp, fp)``; arm64 passes sp as 0."""
    return kunwind_stack_walk(unwinder, lambda f: consume(*unwinder.bpf_args(f)), max_frames)


def iter_frames(unwinder: Unwinder, max_frames: int = DEFAULT_MAX_FRAMES) -> Iterator[Frame]:
    """A convenience iterator over the frames; the :class:`Stop` is its return value."""
    count = 0
    try:
        frame = unwinder.start()
        while True:
            yield frame
            count += 1
            if count >= max_frames:
                return Stop(_FRAME_LIMIT, f"{max_frames} frames", count)
            frame = unwinder.next()  # type: ignore[assignment]
            if type(frame) is not Frame:  # the step's stop, returned
                if type(frame) is Stop:
                    frame.frames = count  # type: ignore[attr-defined]
                    return frame  # type: ignore[return-value]
                return Stop(frame.reason, frame._detail, count)  # type: ignore[attr-defined]
    except UnwindStop as stop:
        return Stop(stop.reason, stop._detail, count)


def collect(unwinder: Unwinder, max_frames: int = DEFAULT_MAX_FRAMES) -> tuple[list[Frame], Stop]:
    """Run a walk and return all frames with the stop."""
    frames: list[Frame] = []
    stop = kunwind_stack_walk(unwinder, None, max_frames, frames)
    return frames, stop
