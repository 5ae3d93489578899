"""The RISC-V walk of many blocked tasks in numpy lockstep (:mod:`unwind.batch`).

One step, the plain one, of ``walk_stackframe()`` for every lane at once:
``fp_is_valid(fp, sp)``, then the ``{fp, ra}`` record at ``fp - 16`` becomes
the next ``(fp, pc)`` with ``sp = fp`` when ``ra`` is kernel text that is
neither ``return_to_handler`` nor in the exception-frame range. The walk's
natural ends are taken here too: a zero fp, and the task's first frame (the
record's fp is ``task_pt_regs(tsk)``).

A lane goes back to the scalar unwinder (:mod:`.stacktrace`) for anything
else: a task with registers, an fgraph return to recover, an exception frame,
a pc outside kernel text, any other ``fp_is_valid()`` failure, a record off
the task stack or outside the lane's captured segment. The per-dump
constants are the scalar unwinder's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

from unwind.batch import Job, Recorder, Walked, gather_lanes, lane_jobs, locate_lanes, narrowed, u64_columns
from unwind.frame import Source
from unwind.target import Task
from unwind.walk import StopReason

from .stacktrace import FP_ZERO_DETAIL, MASK64, RiscvUnwinder, align, first_frame_detail
from .structs import STACK_ALIGN, STACKFRAME_FP, STACKFRAME_RA, STACKFRAME_SIZE

if TYPE_CHECKING:
    from unwind.replay import Session

_U64 = np.uint64
#: the frame sources a batch walk reports, by index
SOURCES = (Source.FRAME, Source.TASK)
_FRAME, _TASK = range(2)
#: kernel text ranges a lane carries (core, init, modules)
_TEXT_RANGES = 3


class DumpConstants:
    """What every walk of one dump shares, read from a scalar unwinder of its first task; ``None``
    from :meth:`of` when the batch cannot take the dump (no kernel text bounds)."""

    __slots__ = ("text", "exc_frame", "return_to_handler", "pt", "basis")

    @classmethod
    def of(cls, job: Job) -> "DumpConstants | None":
        """The constants of ``job``'s dump under its options (kept with the session)."""
        known = _CONSTANTS.setdefault(job.session, {})
        key = job.options.generation
        if key not in known:
            known[key] = cls._read(job)
        return known[key]

    @classmethod
    def _read(cls, job: Job) -> "DumpConstants | None":
        target = job.session.target(job.tasks[0], job.options)
        unwinder = job.session.backend.unwinder(target)
        assert isinstance(unwinder, RiscvUnwinder)
        if not unwinder.k.text or len(unwinder.k.text) > _TEXT_RANGES:
            return None  # without _stext/_etext every upper-half address is text: the scalar walk
        c = cls()
        c.text = list(unwinder.k.text) + [(0, 0)] * (_TEXT_RANGES - len(unwinder.k.text))
        lo, hi = unwinder.exc_frame  # -1: no such symbol (an empty range, or one from 0)
        if hi > MASK64:
            return None  # ret_from_exception at the last address: a range no u64 column holds
        c.exc_frame = (max(lo, 0), max(hi, 0))
        # no symbol (-1): 0, which is never kernel text, so such a pc goes to the scalar walk anyway
        c.return_to_handler = max(unwinder.return_to_handler, 0)
        c.pt = unwinder.pt
        c.basis = unwinder.basis()
        return c


_CONSTANTS: "WeakKeyDictionary[Session, dict[str | None, DumpConstants | None]]" = WeakKeyDictionary()

#: the stops a batch walk reports, by index
STOPS = ((StopReason.END_OF_STACK, lambda target, constants, *_: FP_ZERO_DETAIL),
         (StopReason.END_OF_STACK, lambda target, constants, fp, sp, pc: first_frame_detail(
             target, constants.pt, fp, sp, pc)))
_FP_ZERO, _FIRST_FRAME = range(2)


# kernel/extable.c __kernel_text_address(), over lanes: core text, init text, the module area
def kernel_text_lanes(pc: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Is each pc in one of its lane's ``[lo, hi)`` text ranges (``lo``, ``hi``: ranges x lanes)?"""
    return ((lo <= pc) & (pc < hi)).any(axis=0)


def batch_walk(jobs: list[Job]) -> Walked:
    """``walk_stackframe()`` of every blocked task of ``jobs`` that the plain step can take, in lockstep."""
    rec, consts, cols, taken, tasks = gather_lanes(jobs, SOURCES, STOPS, DumpConstants.of, _lanes_of, 5)
    if not tasks:
        return rec.finish()
    words = u64_columns(cols)
    if words is None:
        return Recorder(rec.lanes, SOURCES, STOPS).finish()
    pc, fp, sp, low, high = words
    lanes = np.flatnonzero(taken)
    job_of = lane_jobs(jobs)[lanes]
    text = np.array([c.text if c is not None else [(0, 0)] * _TEXT_RANGES for c in consts], _U64)[job_of]
    exc = np.array([c.exc_frame if c is not None else (0, 0) for c in consts], _U64)[job_of]
    rth = np.array([c.return_to_handler if c is not None else 0 for c in consts], _U64)[job_of]
    # thread_size(): the task stack's size; task_pt_regs(tsk) = top - ALIGN(sizeof(pt_regs), STACK_ALIGN)
    ts = high - low
    pt_size = np.array([align(c.pt.size, STACK_ALIGN) if c is not None else 0 for c in consts], _U64)[job_of]
    task_pt_regs = high - pt_size
    flat, seg_lo, seg_hi, origin, base = locate_lanes(jobs, job_of, tasks, fp - _U64(STACKFRAME_SIZE))

    # walk_stackframe(task): pc = thread.ra, fp = thread.s[0], sp = thread.sp; the first pc must be text
    text_lo, text_hi = text[:, :, 0].T, text[:, :, 1].T
    keep = kernel_text_lanes(pc, text_lo, text_hi)
    on_task = (low <= sp) & (sp <= high)  # StackSet.kind_of(sp): in [low, high), or at the very top
    label_task, label_none = rec.label("task"), rec.label(None)
    rec.frames(lanes[keep], pc[keep], sp=sp[keep], fp=fp[keep], source=_TASK,
               stack=np.where(on_task, label_task, label_none)[keep])
    # each record must also lie on the task stack, so every frame consumes 16 captured stack bytes
    ts1 = ts - _U64(1)
    state = np.vstack([np.stack([fp, sp, pc, ~_U64(0) - ts, ts1, ~ts1, task_pt_regs, np.maximum(low, seg_lo),
                                 np.minimum(high, seg_hi), origin, base.astype(_U64), lanes.astype(_U64), rth,
                                 exc[:, 0], exc[:, 1]]), text_lo, text_hi])[:, keep]
    live = np.ones(state.shape[1], bool)
    size = _U64(STACKFRAME_SIZE)
    fp_word, ra_word = STACKFRAME_FP // 8, STACKFRAME_RA // 8
    while True:
        fp, sp, pc, top, ts1, align_mask, task_pt_regs, lo, hi, origin, base, lanes, rth, exc_lo, exc_hi = state[:15]
        # fp_is_valid(fp, sp): sp + 16 <= fp <= ALIGN(sp, THREAD_SIZE), 8-aligned (a sum that would wrap:
        # the scalar walk)
        room = live & (sp <= top)
        valid = room & (fp >= sp + size) & (fp <= ((sp + ts1) & align_mask)) & ((fp & _U64(7)) == 0)
        # its natural ends: a zero fp, and the first frame of the task (the record's fp, now sp, is task_pt_regs)
        zero = room & ~valid & (fp == 0)
        if zero.any():
            rec.stop(lanes[zero], _FP_ZERO)
        first = room & ~valid & ~zero & (sp == task_pt_regs)
        if first.any():
            rec.stop(lanes[first], _FIRST_FRAME, fp[first], sp[first], pc[first])
        # the record {fp, ra} at fp - 16, on the task stack and in the lane's captured segment
        at = fp - size
        plain = valid & (lo <= at) & (at < hi) & (hi - at >= size)
        word = np.where(plain, base + ((at - origin) >> _U64(3)), _U64(0)).astype(np.int64)
        new_fp, ra = flat.words[word + fp_word], flat.words[word + ra_word]
        # ftrace_graph_ret_addr() and the exception frame need the scalar walk; the pc must be kernel text
        go = (plain & (ra != rth) & ~((exc_lo <= ra) & (ra < exc_hi))
              & kernel_text_lanes(ra, state[15:15 + _TEXT_RANGES], state[15 + _TEXT_RANGES:]))
        if not go.any():
            break
        rec.frames(lanes[go], ra[go], sp=fp[go], fp=new_fp[go], source=_FRAME, stack=label_task)
        state[1] = fp  # sp = fp
        state[0] = new_fp
        state[2] = ra
        state, live = narrowed(state, go)
    return rec.finish()


def _lanes_of(job: Job, taken: list[bool], cols: list[list[int]], tasks: list[Task]) -> None:
    """The lanes of ``job`` the batch takes: blocked tasks with a saved ra, s0 and sp on their one task
    stack of known size (THREAD_SIZE, at least one record). ``taken`` gets a bool per task; ``cols``
    each lane's ``pc, fp, sp, stack low, stack high``, ``tasks`` its task."""
    take = taken.append
    pc_, fp_, sp_, low_, high_ = (col.append for col in cols)
    for task in job.tasks:
        ctx = task.context
        if task.regs is None and ctx is not None and len(task.stacks) == 1:
            stack = task.stacks[0]
            pc, fp, sp = ctx.get("ra"), ctx.get("s0"), ctx.get("sp")
            if (stack.kind == "task" and stack.high - stack.low >= STACKFRAME_SIZE and pc is not None
                    and fp is not None and sp is not None):
                take(True)
                pc_(pc)
                fp_(fp)
                sp_(sp)
                low_(stack.low)
                high_(stack.high)
                tasks.append(task)
                continue
        take(False)
