"""The RISC-V walk of many blocked tasks in numpy lockstep (:mod:`unwind.session.batch`).

One step, the plain one, of ``walk_stackframe()`` for every lane at once:
``fp_is_valid(fp, sp)``, then the ``{fp, ra}`` record at ``fp - 16`` becomes
the next ``(fp, pc)`` with ``sp = fp`` when ``ra`` is kernel text that is
neither ``return_to_handler`` nor in the exception-frame range. The walk's
natural ends are taken here too: a zero fp, and the task's first frame (the
record's fp is ``task_pt_regs(tsk)``).

The exception frame of a task that entered the kernel from user space is
taken too: ``ra`` in the exception range is printed, and the ``pt_regs`` at
the new sp give an ``epc`` outside kernel text with ``SR_SPP`` clear, the end
of every such task's walk (``_next_regs_pc()``'s user-mode stop).

A lane goes back to the scalar unwinder (:mod:`.stacktrace`) for anything
else: a task with registers, an fgraph return to recover, an exception frame
whose ``pt_regs`` say anything else or lie outside the lane's captured
segment, a pc outside kernel text, any other ``fp_is_valid()`` failure, a
record off the task stack or outside the lane's captured segment. The
per-dump constants are the scalar unwinder's own.
"""

from __future__ import annotations

from collections.abc import MutableSequence

import numpy as np

from unwind.session import batch
from unwind.session.batch import Job, LaneReader, Walked, dump_inputs, gather_lanes, locate_lanes, narrowed, word_index
from unwind.core.frame import Source
from unwind.core.target import Task
from unwind.core.walk import StopReason

from .stacktrace import FP_ZERO_DETAIL, MASK64, RiscvUnwinder, align, first_frame_detail, user_mode_detail
from .structs import SR_SPP, STACK_ALIGN, STACKFRAME_FP, STACKFRAME_RA, STACKFRAME_SIZE

_U64 = np.uint64
#: the frame sources a batch walk reports, by index
SOURCES = (Source.FRAME, Source.TASK)
_FRAME, _TASK = range(2)
#: kernel text ranges a lane carries (core, init, modules)
_TEXT_RANGES = 3


class DumpConstants(batch.DumpConstants):
    """What every walk of one dump shares, read from a scalar unwinder of its first task; ``None``
    from :meth:`of` when the batch cannot take the dump (no kernel text bounds)."""

    __slots__ = ("text", "exc_frame", "return_to_handler", "pt", "regs_words", "lane_row")

    @classmethod
    def inputs(cls, job: Job) -> object | None:
        """:func:`~unwind.session.batch.dump_inputs`: the fields read (text, the exception frame,
        ``return_to_handler``, ``pt_regs`` and the basis) read no task, unless ``pt_regs`` is derived from the
        dump's stacks (:meth:`shareable`); THREAD_SIZE, the first task's, is none of them."""
        return dump_inputs(cls, job)

    @staticmethod
    def shareable(constants: "batch.DumpConstants | None") -> bool:
        """``pt_regs`` from BTF or the dump's offsets: a layout derived from the dump's stacks (or the table, where
        the derivation found none) is the dump's own."""
        return not isinstance(constants, DumpConstants) or constants.pt.source in ("btf", "dump")

    @classmethod
    def read(cls, job: Job) -> "DumpConstants | None":
        target = job.session.target(job.tasks[0], job.options)
        unwinder = job.session.backend.unwinder(target)
        assert isinstance(unwinder, RiscvUnwinder)
        if not unwinder.k.text or len(unwinder.k.text) > _TEXT_RANGES:
            return None  # without _stext/_etext every upper-half address is text: the scalar walk
        c = cls()
        c.text = list(unwinder.k.text) + [(0, 0)] * (_TEXT_RANGES - len(unwinder.k.text))
        lo, hi = unwinder.k.exc_frame  # -1: no such symbol (an empty range, or one from 0)
        if hi > MASK64:
            return None  # ret_from_exception at the last address: a range no u64 column holds
        c.exc_frame = (max(lo, 0), max(hi, 0))
        # no symbol (-1): 0, which is never kernel text, so such a pc goes to the scalar walk anyway
        c.return_to_handler = max(unwinder.k.return_to_handler, 0)
        c.pt = unwinder.pt
        # where _next_regs_pc() reads pt_regs->epc, ->s0 and ->status, in words (None: not all 8-aligned, so an
        # exception frame goes to the scalar walk)
        offsets = (unwinder.k.pt_epc, unwinder.k.pt_s0, unwinder.k.pt_status)
        c.regs_words = None if any(off % 8 or off < 0 for off in offsets) else tuple(off // 8 for off in offsets)
        c.lane_row = lane_row(c.text, c.exc_frame, c.return_to_handler, align(c.pt.size, STACK_ALIGN))
        c._basis = unwinder.basis()  # made now: the scalar's per-dump basis, nothing of the session kept
        return c


def lane_row(text: list[tuple[int, int]], exc_frame: tuple[int, int], return_to_handler: int, regs_below_top: int
             ) -> tuple[int, ...]:
    """The words of a dump's constants that each of its lanes carries: the text ranges' starts, then their
    lengths; the exception frame's start and length (an inverted range is empty); ``return_to_handler``; and
    ``ALIGN(sizeof(struct pt_regs), STACK_ALIGN)``, how far below the stack's top ``task_pt_regs()`` is."""
    lengths = [hi - lo if hi > lo else 0 for lo, hi in (*text, exc_frame)]
    return (*(lo for lo, _ in text), *lengths[:-1], exc_frame[0], lengths[-1], return_to_handler, regs_below_top)


#: the lane row of a job the batch does not take (it has no lanes)
_NO_ROW = (0,) * (2 * _TEXT_RANGES + 4)


#: the stops a batch walk reports, by index
STOPS = ((StopReason.END_OF_STACK, lambda target, constants, *_: FP_ZERO_DETAIL),
         (StopReason.END_OF_STACK, lambda target, constants, fp, sp, pc: first_frame_detail(
             target, constants.pt, fp, sp, pc)),
         (StopReason.USER_MODE, lambda target, constants, regs, epc, status: user_mode_detail(regs, epc, status)))
_FP_ZERO, _FIRST_FRAME, _USER_MODE = range(3)


# kernel/extable.c __kernel_text_address(), over lanes: core text first, then init text and the module area
def kernel_text_lanes(pc: np.ndarray, lo: np.ndarray, span: np.ndarray, among: np.ndarray | None = None
                      ) -> np.ndarray:
    """Is each pc in one of its lane's text ranges ``[lo, lo + span)`` (``lo``, ``span``: ranges x lanes, core text
    the first)? ``lo <= pc < hi`` as one unsigned compare: ``pc - lo`` wraps past every span when ``pc < lo``.
    ``among``: the lanes asked (the others are not text). As the kernel asks, a range after the first is
    looked at only for the pcs asked that core text does not hold, one range at a time (a pc broadcast over
    the ranges costs numpy several times more)."""
    hit = (pc - lo[0]) < span[0]
    if among is not None:
        hit &= among
        rest = among ^ hit
    else:
        rest = ~hit
    if len(lo) > 1 and np.count_nonzero(rest):
        for r in range(1, len(lo)):
            hit |= rest & ((pc - lo[r]) < span[r])
    return hit


# stacktrace.c walk_stackframe(): pc = ((struct pt_regs *)sp)->epc, fp = ->s0 after an exception frame, over lanes:
# RiscvUnwinder._next_regs_pc()'s user-mode end
def user_mode_regs(words: np.ndarray, regs: np.ndarray, lane: np.ndarray, ranges: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the ``pt_regs`` at ``regs`` end the walk in user mode: its epc, s0 and status in the lane's captured
    segment, epc not kernel text and ``SR_SPP`` clear in status. ``lane`` holds per lane epc's and status's words
    in ``pt_regs``, the bytes read from it, the end of its window on the segment (``hi``), the words' place
    (:meth:`~unwind.session.batch.FlatMemory.word_delta`) and its ``ranges`` text ranges (starts, then spans).
    Returns that mask, epc and status; any other lane goes to the scalar walk (it reads memory anywhere, and
    goes on from a kernel epc)."""
    epc_w, status_w, span, hi, delta = lane[:5]
    inside = (hi >= span) & (regs <= hi - span)
    at = word_index(regs, delta.view(np.int64))
    epc = words.take(at + epc_w.view(np.int64), mode="clip")
    status = words.take(at + status_w.view(np.int64), mode="clip")
    user = inside & ~kernel_text_lanes(epc, lane[5:5 + ranges], lane[5 + ranges:]) & ((status & _U64(SR_SPP)) == 0)
    return user, epc, status


def batch_walk(jobs: list[Job]) -> Walked:
    """``walk_stackframe()`` of every blocked task of ``jobs`` that the plain step can take, in lockstep."""
    lanes_in = gather_lanes(jobs, SOURCES, STOPS, DumpConstants, LANES)
    rec = lanes_in.recorder
    if lanes_in.columns is None:
        return rec.finish()
    pc, fp, sp, low, high = lanes_in.columns
    lanes = lanes_in.lanes.astype(_U64)
    consts = lanes_in.constants
    job_of = lanes_in.job_of
    # each lane's job's lane_row(), taken over the lanes at once; a text range empty in every job holds no pc: not
    # checked (core text always is)
    per_job = np.array([c.lane_row if c is not None else _NO_ROW for c in consts], _U64).T
    used = per_job[_TEXT_RANGES:2 * _TEXT_RANGES].any(axis=1)
    used[0] = True
    ranges = int(np.count_nonzero(used))
    rows = per_job[np.concatenate([used, used, np.ones(4, bool)])].take(job_of, axis=1)
    text_lo, text_span = rows[:ranges], rows[ranges:2 * ranges]
    exc_lo, exc_span, rth, regs_below_top = rows[-4:]
    # thread_size(): the task stack's size; task_pt_regs(tsk) = top - ALIGN(sizeof(pt_regs), STACK_ALIGN)
    ts = high - low
    task_pt_regs = high - regs_below_top
    size = _U64(STACKFRAME_SIZE)
    flat, seg_lo, seg_hi, origin, base = locate_lanes(jobs, job_of, lanes_in.tasks, fp - size)

    # walk_stackframe(task): pc = thread.ra, fp = thread.s[0], sp = thread.sp; the first pc must be text
    keep = kernel_text_lanes(pc, text_lo, text_span)
    on_task = (low <= sp) & (sp <= high)  # StackSet.kind_of(sp): in [low, high), or at the very top
    label_task, label_none = rec.label("task"), rec.label(None)
    rec.frames(0, lanes, keep, pc, sp=sp, fp=fp, source=_TASK, stack=np.where(on_task, label_task, label_none))
    # each record {fp, ra} at fp - 16 must also lie on the task stack and in the lane's captured segment
    # [lo, hi): lo + 16 <= fp <= hi (a window past the last address takes none)
    lo = np.maximum(low, seg_lo)
    lo16 = np.where(lo <= ~size, lo + size, ~_U64(0))
    hi = np.minimum(high, seg_hi)
    # the record's words: fp - 16 is an 8-aligned address of the segment when fp is
    word_delta = flat.word_delta(origin, base)
    delta = word_delta + STACKFRAME_SIZE // 8
    ts1 = ts - _U64(1)
    # for the lanes that meet an exception frame (user_mode_regs()), taken by lane number once the lockstep ends:
    # per job, the pt_regs it leaves at the new sp, epc's and status's words and the bytes read from it (up to the
    # last of epc, s0, status; all of memory where the offsets are unknown: never inside); per lane, the segment's
    # end, the words' place and the text ranges
    regs_words = [c.regs_words if c is not None else None for c in consts]
    job_regs = np.array([(w[0], w[2], 8 * (max(w) + 1)) if w is not None else (0, 0, MASK64) for w in regs_words],
                        _U64)
    exc_rows = (hi, word_delta.view(_U64), text_lo, text_span)
    at_exception: list[tuple[np.ndarray, np.ndarray]] = []
    state = np.vstack([~_U64(0) - ts, ts1, ~ts1, task_pt_regs, lo16, hi, delta.view(_U64), rth, exc_lo, exc_span,
                       text_lo, text_span])
    # the lanes whose first pc is text walk on (the lane numbers apart from the state: Recorder.frames())
    live, state, lanes, fp, sp, pc = narrowed(keep, int(np.count_nonzero(keep)), state, lanes, fp, sp, pc)
    # the record's fp and ra words: the words read from two places
    fp_words, ra_words = flat.words[STACKFRAME_FP // 8:], flat.words[STACKFRAME_RA // 8:]
    step = 1
    while True:
        top, ts1, align_mask, task_pt_regs, lo16, hi, delta, rth, exc_lo, exc_span = state[:10]
        # fp_is_valid(fp, sp): sp + 16 <= fp <= ALIGN(sp, THREAD_SIZE), 8-aligned (a sum that would wrap:
        # the scalar walk)
        room = live & (sp <= top)
        valid = room & (fp >= sp + size) & (fp <= ((sp + ts1) & align_mask)) & ((fp & _U64(7)) == 0)
        # its natural ends, where a lane's fp is not valid: a zero fp, and the first frame of the task (the record's
        # fp, now sp, is task_pt_regs)
        invalid = room ^ valid
        if np.count_nonzero(invalid):
            zero = invalid & (fp == 0)
            if np.count_nonzero(zero):
                rec.stop(lanes[zero], _FP_ZERO)
            first = (invalid ^ zero) & (sp == task_pt_regs)
            if np.count_nonzero(first):
                rec.stop(lanes[first], _FIRST_FRAME, fp[first], sp[first], pc[first])
        # the record {fp, ra} at fp - 16, on the task stack and in the lane's captured segment
        plain = valid & (lo16 <= fp) & (fp <= hi)
        at = word_index(fp, delta.view(np.int64))
        new_fp, ra = fp_words.take(at, mode="clip"), ra_words.take(at, mode="clip")
        # ftrace_graph_ret_addr() needs the scalar walk; the pc must be kernel text
        taken = kernel_text_lanes(ra, state[10:10 + ranges], state[10 + ranges:], plain & (ra != rth))
        n = int(np.count_nonzero(taken))
        if not n:
            break
        rec.frames(step, lanes, taken, ra, sp=fp, fp=new_fp, source=_FRAME, stack=label_task)
        step += 1
        # an exception frame: printed, then the walk goes on from the pt_regs at the new sp (the old fp); such a
        # lane leaves the lockstep here, and whether those registers end the walk in user mode is decided for all
        # of them at once, after it
        exc = taken & ((ra - exc_lo) < exc_span)
        go = taken
        if np.count_nonzero(exc):
            go = taken ^ exc
            e = np.flatnonzero(exc)
            at_exception.append((lanes.take(e), fp.take(e)))
            n -= len(e)
            if not n:
                break
        # sp = fp; fp, pc = the record's
        live, state, lanes, fp, sp, pc = narrowed(go, n, state, lanes, new_fp, fp, ra)
    if at_exception:
        ended, regs = (np.concatenate(column) for column in zip(*at_exception))
        lane = lanes_in.of_numbers(ended.view(np.int64), job_regs, exc_rows)
        user, epc, status = user_mode_regs(flat.words, regs, lane, ranges)
        if np.count_nonzero(user):
            rec.stop(ended[user], _USER_MODE, regs[user], epc[user], status[user])
    return rec.finish()


class PlainLanes(LaneReader):
    """The tasks the plain step takes: a blocked task with a saved ra, s0 and sp (integers) on its one task stack of
    known size (THREAD_SIZE, at least one record); its words are ``pc, fp, sp, stack low, stack high``."""

    width = 5

    def lane(self, task: Task, words: MutableSequence[int], at: int) -> bool:
        ctx, stacks = task.context, task.stacks
        if task.regs is None and ctx is not None and len(stacks) == 1:
            stack = stacks[0]
            pc, fp, sp = ctx.get("ra"), ctx.get("s0"), ctx.get("sp")
            if (stack.kind == "task" and stack.high - stack.low >= STACKFRAME_SIZE and isinstance(pc, int)
                    and isinstance(fp, int) and isinstance(sp, int)):
                words[at], words[at + 1], words[at + 2] = pc, fp, sp
                words[at + 3], words[at + 4] = stack.low, stack.high
                return True
        return False


LANES = PlainLanes()
