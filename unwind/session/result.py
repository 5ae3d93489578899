"""What a replay gives: one task's walk (:class:`Replay`).

Its own module so that both ways of replaying build it: :meth:`unwind.session.replay.Session.replay`, task
by task, and the batch replay (:mod:`unwind.session.batch`), which :class:`~unwind.session.replay.Session`
calls for :meth:`~unwind.session.replay.Session.replay_all`.
"""

from __future__ import annotations

from typing import Callable

from unwind.core.frame import Frame
from unwind.core.target import Target, Task
from unwind.core.walk import ReliableResult, Stop


class Replay:
    """The outcome of one task's walk.

    The basis may be given as a function of no arguments (the unwinder's :meth:`Unwinder.basis`): it is
    called the first time :attr:`basis` is read (a replay whose basis no one reads copies no dict).

    A plain slotted class rather than a dataclass: one is made per task, and the compiled build
    (:mod:`unwind.accel`, ``result.pxd``) makes it an extension type."""

    __slots__ = ("target", "frames", "stop", "reliable", "_basis")

    target: Target
    frames: list[Frame]
    stop: Stop
    reliable: ReliableResult | None
    _basis: "dict[str, str] | Callable[[], dict[str, str]]"

    def __init__(self, target: Target, frames: list[Frame], stop: Stop, reliable: ReliableResult | None = None,
                 basis: "dict[str, str] | Callable[[], dict[str, str]] | None" = None) -> None:
        self.target = target
        self.frames = frames
        self.stop = stop
        self.reliable = reliable
        self._basis = {} if basis is None else basis

    def __repr__(self) -> str:
        return (f"Replay(target={self.target!r}, frames={self.frames!r}, stop={self.stop!r}, "
                f"reliable={self.reliable!r}, basis={self.basis!r})")

    @property
    def basis(self) -> dict[str, str]:
        """The generation followed and the layouts read (:meth:`Unwinder.basis`)."""
        basis = self._basis
        if basis.__class__ is not dict:
            basis = self._basis = basis()  # type: ignore[operator]
        return basis  # type: ignore[return-value]

    @basis.setter
    def basis(self, value: dict[str, str]) -> None:
        self._basis = value

    @property
    def task(self) -> Task:
        """The task walked."""
        return self.target.task

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Replay):
            return NotImplemented
        return ((self.target, self.frames, self.stop, self.reliable, self.basis)
                == (other.target, other.frames, other.stop, other.reliable, other.basis))

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was
