"""What a replay gives: one task's walk (:class:`Replay`).

Its own module so that both ways of replaying build it: :meth:`unwind.session.replay.Session.replay`, task
by task, and the batch replay (:mod:`unwind.session.batch`), which :class:`~unwind.session.replay.Session`
calls for :meth:`~unwind.session.replay.Session.replay_all`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unwind.core.frame import Frame
from unwind.core.target import Target, Task
from unwind.core.walk import ReliableResult, Stop


@dataclass(slots=True)
class Replay:
    """The outcome of one task's walk."""

    target: Target
    frames: list[Frame]
    stop: Stop
    reliable: ReliableResult | None = None
    #: the generation followed and the layouts read (:meth:`Unwinder.basis`)
    basis: dict[str, str] = field(default_factory=dict)

    @property
    def task(self) -> Task:
        """The task walked."""
        return self.target.task
