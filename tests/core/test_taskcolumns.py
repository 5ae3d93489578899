"""Tasks as columns (:class:`unwind.core.taskcolumns.TaskColumns`): each entry is what the task itself says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from unwind.core.stackinfo import StackInfo
from unwind.core.target import Task
from unwind.core.taskcolumns import OTHER, U64, TaskColumns
from unwind.formats.dump import Dump

CORPORA = Path(__file__).resolve().parents[2] / "corpora"

TASK = StackInfo(0xFFFF800000010000, 0xFFFF800000014000, "task")
IRQ = StackInfo(0xFFFF800000020000, 0xFFFF800000024000, "irq", 0)
TASKS = [
    Task(1, "blocked", context={"fp": 0xFFFF800000013F00, "pc": 0xFFFF800008001234, "sp": 0xFFFF800000013E00},
         stacks=[TASK]),
    Task(2, "running", cpu=0, regs={"pc": 1, "sp": 2}, stacks=[TASK]),
    Task(3, "two stacks", context={"fp": 1}, stacks=[TASK, IRQ]),
    Task(4, "irq stack", context={"fp": 1}, stacks=[IRQ]),
    Task(5, "no context", stacks=[TASK]),
    Task(6, "odd values", context={"fp": -1, "pc": None, "sp": "x", "caller": 1 << 64}, stacks=[TASK],
         extra={"on_cpu": 1}),
    Task(7, "bound no u64", context={"fp": 8}, stacks=[StackInfo(-16, 0x1000, "task")]),
    Task(8, "no stack", context={"fp": 8}),
]


def test_each_entry_is_what_its_task_says() -> None:
    cols = TaskColumns(TASKS, ("fp",))
    assert len(cols) == len(TASKS)
    assert list(cols.blocked) == [1, 0, 0, 0, 0, 1, 0, 0]
    assert list(cols.low) == [TASK.low, 0, 0, 0, 0, TASK.low, 0, 0]
    assert list(cols.high) == [TASK.high, 0, 0, 0, 0, TASK.high, 0, 0]
    assert list(cols.on_cpu) == [0, 0, 0, 0, 0, 1, 0, 0]
    words, held = cols.context("fp")
    assert list(words) == [0xFFFF800000013F00, 0, 1, 1, 0, 0, 8, 8]
    assert list(held) == [U64, 0, U64, U64, 0, OTHER, U64, U64]
    assert [tuple(cols.context(k)[1])[5] for k in ("pc", "sp", "caller")] == [0, OTHER, OTHER]
    assert tuple(cols.context("x19")[1]) == (0,) * len(TASKS)
    assert cols.context("fp") is cols.context("fp")  # made once


def test_a_dumps_columns_are_those_of_the_tasks_it_hands_out() -> None:
    dump = Dump.open(next(iter(sorted(CORPORA.glob("arm64/*/stop-*.bin.xz")))))
    tasks = dump.tasks()
    made = dump.task_columns()
    assert made.same(tasks) and made.same(dump.tasks())
    fresh = TaskColumns(tasks, ("fp", "pc"))
    for name in ("blocked", "low", "high", "on_cpu"):
        assert getattr(made, name) == getattr(fresh, name), name
    for key in ("fp", "pc", "sp", "caller"):
        assert made.context(key) == fresh.context(key), key
    assert not made.same(tasks[1:])
    changed = list(tasks)
    changed[-1] = replace(tasks[-1], context={**(tasks[-1].context or {}), "fp": 0})
    assert not made.same(changed)

