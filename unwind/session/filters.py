"""Task filters: the tasks of a dump in a state, of a command, with a function on their stack, or by pid.

A :class:`TaskFilter` selects exactly the tasks a full replay shows with every property it names
(``--state``, ``--comm``, ``--function``, ``--task``): within one property any value matches (``--state
S,D`` is S or D), across properties all must. ``--function`` needs the walk: the tasks the other
properties keep are replayed, and a task is kept when some frame's function has that name.
:func:`select` also says which of the filter's values matched no task of the dump at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection, Iterable, Sequence

from unwind.core.target import Options, Task
from unwind.core.trace import LineKind
from unwind.kernel.model import TASK_STATE_CHARS

if TYPE_CHECKING:
    from .replay import Session
    from .result import Replay

#: the state letters ``ps`` prints: ``task_index_to_char()``'s, and ``?`` for a state it cannot name or the
#: dump does not give
STATE_LETTERS = TASK_STATE_CHARS + "?"


class FilterError(ValueError):
    """A filter value that cannot be used (a letter that is no state, a bad regex, a pid that is no number)."""


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """What a task must have to be selected; an empty filter selects every task."""

    #: ``ps`` state letters, any of which the task's state is
    states: tuple[str, ...] = ()
    #: a regular expression searched for in the task's ``comm``
    comm: re.Pattern[str] | None = None
    #: a function name some frame of the task's replay is in
    function: str | None = None
    #: pids, any of which is the task's
    pids: tuple[int, ...] = ()

    @classmethod
    def of(cls, state: str | Iterable[str] | None = None, comm: str | re.Pattern[str] | None = None,
           function: str | None = None, task: int | str | Iterable[int | str] | None = None) -> "TaskFilter":
        """A filter from values as a user gives them: ``state="S,D"`` or ``["S", "D"]``, ``comm`` a regular
        expression, ``task=7``, ``"1,103"`` or ``[1, 103]``; :class:`FilterError` for a value that is none."""
        return cls(states=_states(state), comm=_comm(comm), function=_function(function), pids=_pids(task))

    def __bool__(self) -> bool:
        return bool(self.states or self.comm is not None or self.function is not None or self.pids)

    @property
    def needs_walk(self) -> bool:
        """Whether a task's frames decide (``function``)."""
        return self.function is not None

    def values(self) -> list[str]:
        """Each value of the filter as its option reads (``--state D``, ``--task 7``), in order."""
        return ([f"--state {s}" for s in self.states] + ([f"--comm {self.comm.pattern}"] if self.comm else [])
                + ([f"--function {self.function}"] if self.function else []) + [f"--task {p}" for p in self.pids])

    def __str__(self) -> str:
        return " ".join(self.values())

    def task_values(self, task: Task) -> set[str]:
        """The values (:meth:`values`) ``task`` has without its walk."""
        state = _state(task)
        out = {f"--state {state}"} if state in self.states else set()
        if self.comm is not None and self.comm.search(task.comm):
            out.add(f"--comm {self.comm.pattern}")
        if task.pid in self.pids:
            out.add(f"--task {task.pid}")
        return out

    def matches_task(self, task: Task) -> bool:
        """Whether ``task`` has every property but ``function`` (which needs its frames)."""
        return ((not self.states or _state(task) in self.states)
                and (self.comm is None or self.comm.search(task.comm) is not None)
                and (not self.pids or task.pid in self.pids))

    def matches_functions(self, names: Collection[str]) -> bool:
        """Whether :attr:`function` is among ``names`` (:func:`functions` of a replay); always when it is ``None``."""
        return self.function is None or self.function in names


@dataclass(slots=True)
class Selection:
    """The tasks a filter selected, and the values of it that matched no task of the dump."""

    tasks: list[Task]
    #: each value (``--state D``) no task of the dump has
    unmatched: list[str] = field(default_factory=list)

    def notes(self, f: TaskFilter) -> list[str]:
        """One line per value that matched nothing; one more when each matched but none together."""
        out = [f"{v} matched no task" for v in self.unmatched]
        if not self.tasks and not self.unmatched:
            out.append(f"no task has all of {f}")
        return out


def select(session: "Session", tasks: Sequence[Task], f: TaskFilter, options: Options | None = None) -> Selection:
    """The tasks of ``tasks`` (a dump's, in its order) ``f`` selects; ``function`` is decided on the walks with
    ``options``, as :meth:`Session.replay_all` gives them."""
    seen: set[str] = set()
    for t in tasks:
        seen |= f.task_values(t)
    kept = [t for t in tasks if f.matches_task(t)]
    if f.function is not None:
        walked = _with_function(session, kept, f, options)
        chosen = [t for t, hit in zip(kept, walked) if hit]
        if chosen or _any_with_function(session, [t for t in tasks if not f.matches_task(t)], f, options):
            seen.add(f"--function {f.function}")
        kept = chosen
    return Selection(kept, [v for v in f.values() if v not in seen])


def functions(session: "Session", r: Replay) -> set[str]:
    """The functions of a replay's frames: each frame's (a return address a hijack hid, recovered), and each
    printed frame line's (the trampoline, where the kernel prints it)."""
    names = {f.name for f in r.frames}
    if r.frames:  # the lines the kernel prints for them (a walk without frames prints none)
        names.update(_function_of(line.data.get("symbol"))
                     for line in session.backend.format_trace(r.frames, r.stop, r.target) if line.kind is LineKind.FRAME)
    names.discard(None)
    return names  # type: ignore[return-value]


def _function_of(symbol: object) -> str | None:
    """``foo`` of a printed ``foo+0x1c/0x40 [mod]``; ``None`` for a raw address."""
    if not isinstance(symbol, str) or not symbol or symbol.startswith("0x"):
        return None
    return symbol.split("+", 1)[0]


def _with_function(session: "Session", tasks: Sequence[Task], f: TaskFilter, options: Options | None) -> list[bool]:
    """For each task, whether its replay has a frame in ``f.function``."""
    if not tasks:
        return []
    return [f.matches_functions(functions(session, r)) for r in session.replay_all(options, tasks)]


def _any_with_function(session: "Session", tasks: Sequence[Task], f: TaskFilter, options: Options | None) -> bool:
    """Whether any of ``tasks`` has a frame in ``f.function`` (the filter's other values left them out)."""
    return any(_with_function(session, tasks, f, options))


def _state(task: Task) -> str:
    """The letter ``ps`` shows for the task's state."""
    return task.state or "?"


def _split(values: str | Iterable[object]) -> list[str]:
    """``"a,b"`` or ``["a", "b,c"]`` as ``["a", "b", "c"]``, blanks left out."""
    items = [values] if isinstance(values, str) else [str(v) for v in values]
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def _states(state: str | Iterable[str] | None) -> tuple[str, ...]:
    if state is None:
        return ()
    letters = _split(state)
    if not letters:
        raise FilterError("--state: no state letter given")
    for s in letters:
        if len(s) != 1 or s not in STATE_LETTERS:
            raise FilterError(f"--state {s}: not a state letter ({' '.join(STATE_LETTERS)}, as ps prints them)")
    return tuple(dict.fromkeys(letters))


def _comm(comm: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    if comm is None or isinstance(comm, re.Pattern):
        return comm
    try:
        return re.compile(comm)
    except re.error as e:
        raise FilterError(f"--comm {comm}: not a regular expression: {e}") from None


def _function(function: str | None) -> str | None:
    if function is not None and (not function.strip() or any(c in function for c in "+ /")):
        raise FilterError(f"--function {function!r}: a function name, without offset (schedule, not schedule+0x27)")
    return function


def _pids(task: int | str | Iterable[int | str] | None) -> tuple[int, ...]:
    if task is None:
        return ()
    parts = [str(task)] if isinstance(task, int) else _split(task)
    if not parts:
        raise FilterError("--task: no pid given")
    out = []
    for p in parts:
        try:
            pid = int(p)
        except ValueError:
            raise FilterError(f"--task {p}: not a pid") from None
        if pid < 0:
            raise FilterError(f"--task {p}: not a pid")
        out.append(pid)
    return tuple(dict.fromkeys(out))
