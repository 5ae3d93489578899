"""The arm64 walk of many blocked tasks in numpy lockstep (:mod:`unwind.batch`).

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

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

from unwind.batch import Job, Recorder, Walked, gather_lanes, lane_jobs, locate_lanes, narrowed, u64_columns
from unwind.frame import Flag, Source
from unwind.target import Task
from unwind.walk import StopReason

from .stacktrace import (_BIT55, FRAME_META_TYPE_FINAL, FRAME_RECORD_META_SIZE, FRAME_RECORD_SIZE,
                         Arm64Unwinder, _btf_meta_records, final_frame_detail, final_record_detail,
                         genmask_ull, kernel_generation)

_U64 = np.uint64
#: the frame sources a batch walk reports, by index
SOURCES = (Source.FRAME, Source.TASK, Source.CALLER)
_FRAME, _TASK, _CALLER = range(3)
#: the stops a batch walk reports, by index
STOPS = ((StopReason.END_OF_STACK, lambda target, constants, fp, *_: final_frame_detail(fp)),
         (StopReason.END_OF_STACK, lambda target, constants, fp, *_: final_record_detail(fp)))
_FINAL_FRAME, _FINAL_RECORD = range(2)
_PAC_STRIPPED = Flag.PAC_STRIPPED.value

if TYPE_CHECKING:
    from unwind.replay import Session


class DumpConstants:
    """What every walk of one dump shares, read from a scalar unwinder of its first task; ``None``
    from :meth:`of` when the walk's choices depend on each task's stack (no version, no BTF)."""

    __slots__ = ("meta_records", "first_pc_recovered", "pac_mask", "clear_mask", "return_to_handler",
                 "kretprobe_trampoline", "pt_regs_size", "stackframe", "basis")

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
        c.basis = unwinder.basis()
        return c


_CONSTANTS: "WeakKeyDictionary[Session, dict[str | None, DumpConstants | None]]" = WeakKeyDictionary()


# ptrauth_strip_kernel_insn_pac() (v6.4+) and v6.1's ptrauth_clear_pac(), over lanes
def ptrauth_strip_lanes(ptr: np.ndarray, mask: np.ndarray, keep_mask: np.ndarray) -> np.ndarray:
    """Bit 55 set: a kernel pointer, the mask ORed in; clear: a user pointer, ANDed with ``keep_mask``
    (``~mask``, or v6.1's ``~(mask & GENMASK(54, 0))``)."""
    return np.where(ptr & _U64(_BIT55), ptr | mask, ptr & keep_mask)


def batch_walk(jobs: list[Job]) -> Walked:
    """``kunwind_stack_walk()`` of every task of ``jobs`` that the plain step can take, in lockstep."""
    rec, consts, cols, taken, tasks = gather_lanes(jobs, SOURCES, STOPS, DumpConstants.of, _lanes_of, 6)
    if not tasks:
        return rec.finish()
    words = u64_columns(cols)
    if words is None:
        return Recorder(rec.lanes, SOURCES, STOPS).finish()
    fp, pc, sp, source, low, high = words
    source = source.astype(np.int64)
    lanes = np.flatnonzero(taken)
    job_of = lane_jobs(jobs)[lanes]

    def per_job(name: str) -> np.ndarray:
        table = np.array([getattr(c, name) if c is not None else 0 for c in consts], _U64)
        return table[job_of]

    meta = np.array([bool(c and c.meta_records) for c in consts])[job_of]
    first_pc = np.array([bool(c and c.first_pc_recovered) for c in consts])[job_of]
    mask, clear_mask = per_job("pac_mask"), per_job("clear_mask")
    rth, krt = per_job("return_to_handler"), per_job("kretprobe_trampoline")
    # task_pt_regs(tsk)->stackframe: THREAD_SIZE + task_stack_page(tsk) - sizeof(pt_regs) + offsetof(stackframe)
    final = high - per_job("pt_regs_size") + per_job("stackframe")

    # the lane's captured segment: the one holding its first record; a record must lie in it and on the
    # current stack above what the walk consumed, so the walk checks one window [lo, hi) for both
    flat, seg_lo, seg_hi, origin, base = locate_lanes(jobs, job_of, tasks, fp)

    # do_kunwind(): the first frame, from the saved context (v6.4+ recovers its pc first)
    keep = ~(first_pc & ((pc == rth) | (pc == krt)))
    on_task = (low <= sp) & (sp <= high)  # StackSet.kind_of(sp): in [low, high), or at the very top
    label_task, label_none = rec.label("task"), rec.label(None)
    rec.frames(lanes[keep], pc[keep], sp=sp[keep], fp=fp[keep], source=source[keep],
               stack=np.where(on_task, label_task, label_none)[keep])
    state = np.stack([fp, np.maximum(low, seg_lo), np.minimum(high, seg_hi), final, mask, ~clear_mask, rth, krt,
                      origin, base.astype(_U64), lanes.astype(_U64), meta.astype(_U64)])[:, keep]
    live = np.ones(state.shape[1], bool)
    any_meta = bool(meta.any())
    size, meta_size = _U64(FRAME_RECORD_SIZE), _U64(FRAME_RECORD_META_SIZE)
    while True:
        fp, lo, hi, final, mask, keep_mask, rth, krt, origin, base, lanes, meta = state
        # kunwind_next() up to v6.12: the final frame ends the walk
        end = live & (fp == final) & (meta == 0)
        if end.any():
            rec.stop(lanes[end], _FINAL_FRAME, fp[end])
        # unwind_next_frame_record() / kunwind_next_frame_record(): an 8-aligned record on the current
        # stack, above what the walk consumed (unwind_find_stack()), in the lane's captured segment
        plain = live & ~end & ((fp & _U64(7)) == 0) & (lo <= fp) & (fp < hi) & (hi - fp >= size)
        at = np.where(plain, base + ((fp - origin) >> _U64(3)), _U64(0)).astype(np.int64)
        new_fp, raw = flat.words[at], flat.words[at + 1]
        if any_meta:
            # v6.13+: a {0, 0} record is a frame_record_meta; FINAL at task_pt_regs(tsk)->stackframe ends the walk
            is_meta = plain & (meta != 0) & (new_fp == 0) & (raw == 0)
            if is_meta.any():
                typed = is_meta & (hi - fp >= meta_size)
                kind = flat.words[np.where(typed, at + 2, 0)]
                final_end = typed & (kind == FRAME_META_TYPE_FINAL) & (fp == final)
                rec.stop(lanes[final_end], _FINAL_RECORD, fp[final_end])
                plain &= ~is_meta  # any other meta record: the scalar walk
        # kunwind_next(): strip the PAC; return_to_handler and the kretprobe trampoline need the scalar walk
        pc = ptrauth_strip_lanes(raw, mask, keep_mask)
        go = plain & (pc != rth) & (pc != krt)
        if not go.any():
            break
        rec.frames(lanes[go], pc[go], fp=new_fp[go], flags=np.where((pc != raw)[go], _PAC_STRIPPED, 0),
                   source=_FRAME, stack=label_task)
        state[1] = fp + size  # unwind_consume_stack()
        state[0] = new_fp
        state, live = narrowed(state, go)
    return rec.finish()


def _lanes_of(job: Job, taken: list[bool], cols: list[list[int]], tasks: list[Task]) -> None:
    """The lanes of ``job`` the batch takes: blocked tasks with a saved fp, pc and sp on their one task
    stack (a NULL task stack, ``task_stack_freed()``, is left to the scalar walk).

    ``taken`` gets a bool per task; ``cols`` each lane's ``fp, pc, sp, source, stack low, stack high``,
    ``tasks`` its task.
    """
    take = taken.append
    fp_, pc_, sp_, source_, low_, high_ = (col.append for col in cols)
    for task in job.tasks:
        ctx = task.context
        if task.regs is None and ctx is not None and len(task.stacks) == 1:
            stack = task.stacks[0]
            fp, pc, sp = ctx.get("fp"), ctx.get("pc"), ctx.get("sp")
            if stack.kind == "task" and stack.low and fp is not None and pc is not None and sp is not None:
                take(True)
                fp_(fp)
                pc_(pc)
                sp_(sp)
                source_(_CALLER if ctx.get("caller") else _TASK)
                low_(stack.low)
                high_(stack.high)
                tasks.append(task)
                continue
        take(False)
