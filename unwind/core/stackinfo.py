"""Typed stack ranges and the one-way consume rule.

Follows ``arch/arm64/include/asm/stacktrace/common.h``: an unwind state keeps
the stack it is on plus a list of the other stacks it may move to. Every
record consumed raises the current stack's low bound past it, and moving to
another stack destroys the entry of the stack moved to in the list, so the
walk can never come back to a stack it left and always terminates.

Backends pick which kinds exist (task, irq, overflow, sdei_normal, ...) and
which are usable for a given task; this module knows no architecture.
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable


class StackInfo:
    """A stack range ``[low, high)``; ``low == 0`` means unknown, as in the kernel."""

    __slots__ = ("low", "high", "kind", "cpu")

    def __init__(self, low: int, high: int, kind: str, cpu: int | None = None) -> None:
        self.low = low
        self.high = high
        self.kind = kind
        self.cpu = cpu

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        o: StackInfo = other  # type: ignore[assignment]
        return (self.low, self.high, self.kind, self.cpu) == (o.low, o.high, o.kind, o.cpu)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"StackInfo(low={self.low!r}, high={self.high!r}, kind={self.kind!r}, cpu={self.cpu!r})"

    def on_stack(self, sp: int, size: int) -> bool:
        """``stackinfo_on_stack()``: does ``[sp, sp + size)`` lie in this stack?"""
        if not self.low:
            return False
        end = sp + size
        return self.low <= sp and end <= self.high and end >= sp

    def label(self) -> str:
        """``kind`` with the CPU, e.g. ``irq@cpu1``."""
        return self.kind if self.cpu is None else f"{self.kind}@cpu{self.cpu}"


#: ``stackinfo_get_unknown()``: the stack a walk is on before it finds one (``low == 0``: nothing is on it)
UNKNOWN = StackInfo(0, 0, "unknown")


class Refusal(Enum):
    """Why a stack address was not accepted by :meth:`StackSet.find`."""

    OUTSIDE = "outside every stack"
    BELOW_CONSUMED = "below the part of the current stack already consumed"
    LEFT_BEHIND = "on a stack the walk already left (transitions are one-way)"


class StackSet:
    """The ``stack`` / ``stacks[]`` pair of ``struct unwind_state``."""

    __slots__ = ("stack", "stacks", "_known")

    def __init__(self, stacks: Iterable[StackInfo]) -> None:
        # the caller's ranges are never changed: the walk consumes a copy of the one it moves to, and a
        # stack left is dropped from ``stacks`` (the ranges are copied when moved to, not up front)
        self._known: tuple[StackInfo, ...] = tuple(stacks)
        self.stacks: list[StackInfo] = list(self._known)
        # unwind_init_common(): the walk starts on no stack at all (one shared range: nothing is on it, so
        # nothing is consumed of it; consume() moves to a copy of the stack found)
        self.stack: StackInfo = UNKNOWN

    # unwind_find_stack()
    def find(self, sp: int, size: int) -> StackInfo | None:
        """Return the stack holding ``[sp, sp + size)``: the current one first."""
        if self.stack.on_stack(sp, size):
            return self.stack
        for info in self.stacks:
            if info.on_stack(sp, size):
                return info
        return None

    # unwind_consume_stack()
    def consume(self, info: StackInfo, sp: int, size: int) -> str | None:
        """Consume ``[sp, sp + size)`` on ``info``; return the kind left on a transition."""
        left = None
        if info is not self.stack:
            left = self.stack.label() if self.stack.low else None
            self.stack = StackInfo(info.low, info.high, info.kind, info.cpu)
            self._forget(info)
        self.stack.low = sp + size
        return left

    # *info = stackinfo_get_unknown()
    def _forget(self, info: StackInfo) -> None:
        """The entry of the stack moved to is never found again (the caller's range stays as it was)."""
        stacks = self.stacks
        for i, s in enumerate(stacks):
            if s is info:
                del stacks[i]
                return

    def why_not(self, sp: int, size: int) -> Refusal:
        """Explain a failed :meth:`find` for a stop reason."""
        for info in self._known:
            if info.on_stack(sp, size):
                same = info.kind == self.stack.kind and info.cpu == self.stack.cpu
                return Refusal.BELOW_CONSUMED if same else Refusal.LEFT_BEHIND
        return Refusal.OUTSIDE

    def kind_of(self, addr: int) -> StackInfo | None:
        """The known stack that ``addr`` lies in, whatever the walk has consumed."""
        for info in self._known:
            if info.low <= addr < info.high:
                return info
        for info in self._known:  # an empty stack: sp at its very top
            if addr == info.high:
                return info
        return None

    @property
    def known(self) -> tuple[StackInfo, ...]:
        """All stacks the walk started with."""
        return self._known
