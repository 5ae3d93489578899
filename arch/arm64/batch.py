"""The arm64 walk of many blocked tasks in numpy lockstep (:mod:`unwind.session.batch`).

One step, the plain one, for every lane at once: ``kunwind_next()`` through
``unwind_next_frame_record()`` (v6.12) or ``kunwind_next_frame_record()``
(v6.13+) when the record is an ordinary ``{fp, lr}`` on the stack the walk is
on, above what it consumed, followed by the PAC strip. The walk's natural
ends are taken here too: ``fp == task_pt_regs(tsk)->stackframe`` (v6.12) and
the ``FRAME_META_TYPE_FINAL`` record there (v6.13+).

A lane goes back to the scalar unwinder (:mod:`.stacktrace`) for anything
else: a task with exception registers, a ``return_to_handler`` or kretprobe
trampoline pc to recover, a misaligned fp, a record off the current stack (a
transition or a refusal), a read outside the lane's captured segment, any
other meta record. The per-dump constants are the scalar unwinder's own.
"""

from __future__ import annotations

from collections.abc import MutableSequence

import numpy as np

from unwind.session import batch
from unwind.session.batch import Job, LaneReader, Walked, dump_inputs, gather_lanes, locate_lanes, narrowed, word_index
from unwind.core.frame import Flag, Source
from unwind.core.target import Task
from unwind.core.walk import StopReason

from unwind.kernel.generation import kernel_generation

from .ptrauth import BIT55, genmask_ull
from .stacktrace import (FRAME_META_TYPE_FINAL, FRAME_RECORD_META_SIZE, FRAME_RECORD_SIZE, Arm64Unwinder,
                         _btf_meta_records, final_frame_detail, final_record_detail)

_U64 = np.uint64
#: the frame sources a batch walk reports, by index
SOURCES = (Source.FRAME, Source.TASK, Source.CALLER)
_FRAME, _TASK, _CALLER = range(3)
#: the stops a batch walk reports, by index
STOPS = ((StopReason.END_OF_STACK, lambda target, constants, fp, *_: final_frame_detail(fp)),
         (StopReason.END_OF_STACK, lambda target, constants, fp, *_: final_record_detail(fp)))
_FINAL_FRAME, _FINAL_RECORD = range(2)
_PAC_STRIPPED = Flag.PAC_STRIPPED.value


class DumpConstants(batch.DumpConstants):
    """What every walk of one dump shares, read from a scalar unwinder of its first task; ``None``
    from :meth:`of` when the walk's choices depend on each task's stack (no version, no BTF)."""

    __slots__ = ("meta_records", "first_pc_recovered", "pac_mask", "clear_mask", "return_to_handler",
                 "kretprobe_trampoline", "pt_regs_size", "stackframe")

    @classmethod
    def inputs(cls, job: Job) -> object | None:
        """:func:`~unwind.session.batch.dump_inputs`: the constants never read a task (where ``sizeof(pt_regs)``
        would come from a task's stack, :meth:`read` gives ``None``)."""
        return dump_inputs(cls, job)

    @classmethod
    def read(cls, job: Job) -> "DumpConstants | None":
        target = job.session.target(job.tasks[0], job.options)
        if kernel_generation(target)[0] is None and _btf_meta_records(target)[0] is None:
            return None  # walk_generation() looks for the FINAL record in each task's stack
        unwinder = Arm64Unwinder(target)
        state = unwinder.state
        if state.meta_records and not state.layout.source.startswith(("btf:", "dump:")):
            return None  # sizeof(pt_regs) may be derived from each task's own FINAL record
        c = cls()
        c.meta_records, c.first_pc_recovered = state.meta_records, state.first_pc_recovered
        c.pac_mask = state.pac_mask
        # ptrauth_strip_kernel_insn_pac() clears the mask from a user pointer, v6.1's
        # ptrauth_clear_pac() only its GENMASK(54, 0) part
        c.clear_mask = state.pac_mask if state.first_pc_recovered else state.pac_mask & genmask_ull(54, 0)
        # no symbol: 0, which a pc may equal, but a lane with pc 0 only goes to the scalar walk
        c.return_to_handler = state.return_to_handler or 0
        c.kretprobe_trampoline = state.kretprobe_trampoline or 0
        c.pt_regs_size, c.stackframe = state.layout.size, state.layout.stackframe
        c._basis = unwinder.basis()  # made now: the scalar's per-dump basis, nothing of the session kept
        return c


# ptrauth_strip_kernel_insn_pac() (v6.4+) and v6.1's ptrauth_clear_pac(), over lanes
def ptrauth_strip_lanes(ptr: np.ndarray, mask: np.ndarray, keep_mask: np.ndarray,
                        read: np.ndarray | None = None) -> np.ndarray:
    """Bit 55 set: a kernel pointer, the mask ORed in; clear: a user pointer, ANDed with ``keep_mask``
    (``~mask``, or v6.1's ``~(mask & GENMASK(54, 0))``). ``read``: the lanes whose pointer counts, where not
    all do (the user-pointer rule is applied only when one of them has a user pointer)."""
    kernel = ptr | mask
    user = (ptr & _U64(BIT55)) == 0
    if np.count_nonzero(user if read is None else user & read):
        return np.where(user, ptr & keep_mask, kernel)
    return kernel


def batch_walk(jobs: list[Job]) -> Walked:
    """``kunwind_stack_walk()`` of every task of ``jobs`` that the plain step can take, in lockstep."""
    lanes_in = gather_lanes(jobs, SOURCES, STOPS, DumpConstants, LANES)
    rec, per_lane = lanes_in.recorder, lanes_in.per_lane
    if lanes_in.columns is None:
        return rec.finish()
    fp, pc, sp, source, low, high = lanes_in.columns
    lanes = lanes_in.lanes.astype(_U64)
    meta = per_lane(lambda c: c.meta_records)
    first_pc = per_lane(lambda c: c.first_pc_recovered, bool)
    mask, clear_mask = per_lane(lambda c: c.pac_mask), per_lane(lambda c: c.clear_mask)
    rth, krt = per_lane(lambda c: c.return_to_handler), per_lane(lambda c: c.kretprobe_trampoline)
    # task_pt_regs(tsk)->stackframe: THREAD_SIZE + task_stack_page(tsk) - sizeof(pt_regs) + offsetof(stackframe)
    final = high - per_lane(lambda c: c.pt_regs_size) + per_lane(lambda c: c.stackframe)

    # the lane's captured segment: the one holding its first record; a record must lie in it and on the
    # current stack above what the walk consumed, so the walk checks one window [lo, hi) for both
    flat, seg_lo, seg_hi, origin, base = locate_lanes(jobs, lanes_in.job_of, lanes_in.tasks, fp)

    # do_kunwind(): the first frame, from the saved context (v6.4+ recovers its pc first)
    keep = ~(first_pc & ((pc == rth) | (pc == krt)))
    on_task = (low <= sp) & (sp <= high)  # StackSet.kind_of(sp): in [low, high), or at the very top
    label_task, label_none = rec.label("task"), rec.label(None)
    rec.frames(0, lanes, keep, pc, sp=sp, fp=fp, source=source, stack=np.where(on_task, label_task, label_none))
    size, meta_size = _U64(FRAME_RECORD_SIZE), _U64(FRAME_RECORD_META_SIZE)
    lo, hi = np.maximum(low, seg_lo), np.minimum(high, seg_hi)
    # a record {fp, lr} lies in [lo, hi) when lo <= fp <= hi - 16; a window too short for one takes none
    short = hi < size
    top = np.where(short, _U64(0), hi - size)
    lo = np.where(short, _U64(1), lo)
    state = np.stack([final, top, hi, mask, ~clear_mask, rth, krt, flat.word_delta(origin, base).view(_U64)])
    # the lanes kept walk on (the lane numbers apart from the state: Recorder.frames())
    live, state, lanes, fp, lo, meta = narrowed(keep, int(np.count_nonzero(keep)), state, lanes, fp, lo, meta != 0)
    any_meta = bool(np.count_nonzero(meta))
    not_meta = ~meta
    # the record's words at fp, fp + 8 and fp + 16: one array, read from three places
    words = flat.words
    words1, words2 = words[1:], words[2:]
    step = 1
    while True:
        final, top, hi, mask, keep_mask, rth, krt, delta = state
        # kunwind_next() up to v6.12: the final frame ends the walk
        at_final = fp == final
        end = live & at_final
        if any_meta:
            end &= not_meta
        if np.count_nonzero(end):
            rec.stop(lanes[end], _FINAL_FRAME, fp[end])
        # unwind_next_frame_record() / kunwind_next_frame_record(): an 8-aligned record on the current
        # stack, above what the walk consumed (unwind_find_stack()), in the lane's captured segment
        plain = (live ^ end) & ((fp & _U64(7)) == 0) & (lo <= fp) & (fp <= top)
        at = word_index(fp, delta.view(np.int64))
        new_fp, raw = words.take(at, mode="clip"), words1.take(at, mode="clip")
        if any_meta:
            # v6.13+: a {0, 0} record is a frame_record_meta; FINAL at task_pt_regs(tsk)->stackframe ends the walk
            is_meta = plain & meta & ((new_fp | raw) == 0)
            if np.count_nonzero(is_meta):
                kind = words2.take(at, mode="clip")  # frame_record_meta.type, read where the record has room
                final_end = is_meta & (hi - fp >= meta_size) & (kind == FRAME_META_TYPE_FINAL) & at_final
                rec.stop(lanes[final_end], _FINAL_RECORD, fp[final_end])
                plain &= ~is_meta  # any other meta record: the scalar walk
        # kunwind_next(): strip the PAC; return_to_handler and the kretprobe trampoline need the scalar walk
        pc = ptrauth_strip_lanes(raw, mask, keep_mask, plain)
        go = plain & (pc != rth) & (pc != krt)
        n = int(np.count_nonzero(go))
        if not n:
            break
        rec.frames(step, lanes, go, pc, fp=new_fp, flags=(pc != raw) * _PAC_STRIPPED, source=_FRAME,
                   stack=label_task)
        step += 1
        # unwind_consume_stack(), then the next record
        live, state, lanes, fp, lo, meta, not_meta = narrowed(go, n, state, lanes, new_fp, fp + size, meta, not_meta)
    return rec.finish()


class PlainLanes(LaneReader):
    """The tasks the plain step takes: a blocked task with a saved fp, pc and sp (integers) on its one task stack (a
    NULL task stack, ``task_stack_freed()``, is left to the scalar walk); its words are ``fp, pc, sp, source, stack
    low, stack high``."""

    width = 6

    def lane(self, task: Task, words: MutableSequence[int], at: int) -> bool:
        ctx, stacks = task.context, task.stacks
        if task.regs is None and ctx is not None and len(stacks) == 1:
            stack = stacks[0]
            fp, pc, sp = ctx.get("fp"), ctx.get("pc"), ctx.get("sp")
            if (stack.kind == "task" and stack.low and isinstance(fp, int) and isinstance(pc, int)
                    and isinstance(sp, int)):
                words[at], words[at + 1], words[at + 2] = fp, pc, sp
                words[at + 3] = _CALLER if ctx.get("caller") else _TASK
                words[at + 4], words[at + 5] = stack.low, stack.high
                return True
        return False


LANES = PlainLanes()
