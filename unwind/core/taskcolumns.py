"""A list of tasks as columns: what a batch walk (:mod:`unwind.session.batch`) picks its lanes from.

A dump makes the columns of its tasks once, where it makes the tasks (:meth:`unwind.formats.dump.Dump.task_columns`),
so a batch reads arrays rather than each task's objects; the tasks of any other source get theirs from the
same constructor when a batch asks. Standard-library arrays only: a dump's open does not import numpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from operator import attrgetter

from .target import Task

#: the array typecode of a 64-bit unsigned word: ``L`` where it is 64 bits (CPython converts a large int to an
#: unsigned long in half the time it takes for an unsigned long long), else ``Q``
WORD = "L" if array("L").itemsize == 8 else "Q"
#: what the columns read of a task
_READ = attrgetter("stacks", "context", "regs", "extra")
#: what a task's context holds under a key (:meth:`TaskColumns.context`): a u64, or another value
U64, OTHER = 1, 2


class TaskColumns:
    """Tasks as columns, one entry per task, in the order given: whether each is a blocked task with a saved context
    and one stack, a task stack (``blocked``: what every arch's plain batch step starts from), that stack's
    bounds (``low``, ``high``; 0 where not ``blocked``), whether the dump says its ``on_cpu`` is set, and its saved
    context's words by key (:meth:`context`, made when first asked).

    A value that is no u64 (the note allows none; a caller's task may hold one) makes its task not ``blocked``
    (a stack bound) or that key unknown (a context word): such a task is left to the scalar walk.
    """

    __slots__ = ("contexts", "blocked", "low", "high", "on_cpu", "_words", "_read")

    def __init__(self, tasks: Sequence[Task], keys: Iterable[str] = ()) -> None:
        """``keys``: the context words to make now (the others are made when asked)."""
        # each task's objects the columns were read from (:meth:`same`)
        self._read = list(map(_READ, tasks))
        #: each task's saved context
        self.contexts = [ctx for _, ctx, _, _ in self._read]
        blocked, low, high = array("B"), array(WORD), array(WORD)
        for stacks, ctx, regs, _ in self._read:
            stack = stacks[0] if len(stacks) == 1 else None
            if regs is None and ctx is not None and stack is not None and stack.kind == "task":
                try:
                    low.append(stack.low)
                    high.append(stack.high)
                except (OverflowError, TypeError):
                    del low[len(high):]
                else:
                    blocked.append(1)
                    continue
            blocked.append(0)
            low.append(0)
            high.append(0)
        self.blocked, self.low, self.high = blocked, low, high
        self.on_cpu = array("B", [bool(extra.get("on_cpu")) for _, _, _, extra in self._read])
        self._words = {key: _context_words(self.contexts, key) for key in keys}

    def __len__(self) -> int:
        return len(self.blocked)

    def context(self, key: str) -> tuple[array, array]:
        """The saved context's word ``key`` of each task (0 where it is no u64) and what it holds: 0 no such key,
        no context or ``None``, :data:`U64` a u64, :data:`OTHER` something else; made once per key."""
        hit = self._words.get(key)
        if hit is None:
            hit = self._words[key] = _context_words(self.contexts, key)
        return hit

    def same(self, tasks: Sequence[Task]) -> bool:
        """Are ``tasks`` these columns' tasks, in order: the same registers, context, stacks and dump facts (the
        copies :meth:`Dump.tasks() <unwind.formats.dump.Dump.tasks>` hands out share these objects, so the
        comparison meets each one itself)?"""
        return len(tasks) == len(self.blocked) and list(map(_READ, tasks)) == self._read


def _context_words(contexts: list[dict[str, int] | None], key: str) -> tuple[array, array]:
    """:meth:`TaskColumns.context` of ``contexts``."""
    values = [None if ctx is None else ctx.get(key) for ctx in contexts]
    try:
        if None not in values:
            return array(WORD, values), array("B", bytes([U64]) * len(values))
        return (array(WORD, [0 if v is None else v for v in values]),
                array("B", [0 if v is None else U64 for v in values]))
    except (OverflowError, TypeError):  # some value is no u64: that task's word is unknown
        held = array("B", [0 if v is None else U64 if _is_u64(v) else OTHER for v in values])
        return array(WORD, [v if k == U64 else 0 for v, k in zip(values, held)]), held


def _is_u64(value: object) -> bool:
    """Is ``value`` a u64 (an ``int``, ``bool`` included, in ``[0, 2**64)``)?"""
    return isinstance(value, int) and 0 <= value < 1 << 64
