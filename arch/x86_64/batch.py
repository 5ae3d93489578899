"""The x86-64 ORC walk of many blocked tasks in numpy lockstep (:mod:`unwind.session.batch`).

One step, the plain one, of ``unwind_next_frame()`` for every lane at once:
the ORC entry of ``ip - 1`` (``ip`` after a signal frame) is a CALL entry whose
CFA is ``sp`` or ``bp`` plus an offset; the return address is the word below
the CFA and the saved ``bp`` is undefined or at ``prev_sp``/``bp`` plus an
offset, every word on the task stack; the new ``sp`` is a word or more above
the old one and the return address is core kernel text that no tracer hijacked. The walk's
natural ends are taken here too: an ``ORC_TYPE_END_OF_STACK`` entry, and the
user-mode registers of a task that entered the kernel from user space (a REGS
entry whose ``pt_regs``, at the CFA on the task stack and in the lane's
captured segment, have ``cs & 3``: ``regs_frame()``'s user-mode stop).

A lane goes back to the scalar unwinder (:mod:`.unwind_orc`) for anything
else: a task with registers, any other REGS or REGS_PARTIAL entry (a pt_regs
crossing), an UNDEFINED entry or none (module, ftrace trampoline, the
frame-pointer guess), an indirect or register CFA, an fgraph or rethook
return, a word off the task stack or outside the lane's captured segment.
The per-dump constants (the ORC table, the layouts) are the scalar unwinder's own.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from weakref import WeakKeyDictionary

import numpy as np

from unwind.session import batch
from unwind.session.batch import Job, LaneReader, Memo, Walked, dump_inputs, gather_lanes, locate_lanes, narrowed, word_index
from unwind.core.frame import Source
from unwind.core.target import Options, Task
from unwind.core.walk import StopReason
from unwind.kernel.layout import StructLayout, known_layout

from .orc import (ORC_REG_BP, ORC_REG_PREV_SP, ORC_REG_SP, ORC_REG_UNDEFINED, ORC_TYPE_CALL, ORC_TYPE_END_OF_STACK,
                  ORC_TYPE_REGS, OrcTable, orc_table)
from .structs import PT_REGS_MEMBERS
from .unwind_orc import OrcUnwinder, orc_end_detail, task_on_another_cpu, user_regs_detail

_U64 = np.uint64
#: a pt_regs size no window holds: a dump whose struct pt_regs the batch does not know
_NO_REGS = (1 << 64) - 1
#: the frame sources a batch walk reports, by index
SOURCES = (Source.ORC_CALL, Source.TASK)
_ORC_CALL, _TASK = range(2)
#: the stops a batch walk reports, by index
STOPS = ((StopReason.END_OF_STACK, lambda target, constants, ip, *_: orc_end_detail(ip)),
         (StopReason.USER_MODE, lambda target, constants, regs, ip, sp: user_regs_detail(regs, ip, sp)))
_ORC_END, _USER_MODE = range(2)


class DumpConstants(batch.DumpConstants):
    """What every walk of one dump shares, read from a scalar unwinder of its first task."""

    __slots__ = ("table", "text", "itf_size", "itf_bp", "itf_ret_addr", "return_to_handler", "rethook_trampoline",
                 "ret_from_fork_asm", "pt_regs_words")

    @staticmethod
    def key(options: Options) -> object:
        return options.generation, options.orc_version

    @classmethod
    def inputs(cls, job: Job) -> object | None:
        """:func:`~unwind.session.batch.dump_inputs` and the ORC table the walks get (``orc_table()``: the
        image's, kept per image and format, which a caller may replace): the text, ``inactive_task_frame`` and
        the symbols read no task; the basis names ``pt_regs``, derived from the dump's stacks where neither BTF
        nor the note states it (:meth:`shareable`)."""
        inputs = dump_inputs(cls, job)
        if inputs is None:
            return None
        return inputs, orc_table(job.session.target(job.tasks[0], job.options))

    @staticmethod
    def shareable(constants: "batch.DumpConstants | None") -> bool:
        """The basis made at :meth:`read` (``pt_regs`` stated by BTF or the note), not from the dump's stacks."""
        return hasattr(constants, "_basis")

    @classmethod
    def read(cls, job: Job) -> "DumpConstants":
        target = job.session.target(job.tasks[0], job.options)
        unwinder = job.session.backend.unwinder(target)
        assert isinstance(unwinder, OrcUnwinder)
        c = cls()
        c.table = unwinder.table
        # check_text(): core text, the module area, init text (unused ranges are empty)
        c.text = list(unwinder.text) + [(0, 0)] * (3 - len(unwinder.text))
        itf = unwinder.itf
        c.itf_size, c.itf_bp, c.itf_ret_addr = itf.size, itf["bp"], itf["ret_addr"]
        # no symbol: 0, which is never kernel text, so such an ip goes to the scalar walk anyway
        c.return_to_handler = unwinder.return_to_handler or 0
        c.rethook_trampoline = unwinder.rethook_trampoline or 0
        c.ret_from_fork_asm = unwinder.ret_from_fork_asm or 0
        pt = known_layout(target, "pt_regs", PT_REGS_MEMBERS)
        c.pt_regs_words = pt_regs_words(pt)
        if pt is not None:
            c._basis = unwinder.basis()  # made now (pt_regs as BTF or the note states it): nothing of the session kept
        else:
            c.basis_of = unwinder.basis_maker()  # pt_regs derived from the dump's stacks when a replay first reads the basis
        return c


def pt_regs_words(pt: StructLayout | None) -> tuple[int, int, int, int] | None:
    """``struct pt_regs`` as the lockstep reads it at a REGS entry: its size and ``ip``'s, ``sp``'s and ``cs``'s
    words. ``None`` where it is derived from the dump's stacks (not known when the constants are read) or one of
    them is not 8-aligned: such an entry goes to the scalar walk."""
    if pt is None:
        return None
    offsets = (pt["ip"], pt["sp"], pt["cs"])
    if any(off % 8 for off in offsets):
        return None
    return (pt.size, *(off // 8 for off in offsets))


class Tables:
    """The ORC tables of a batch: each table's rows index its few hundred distinct entries, and the
    entries of all tables are one set of short columns (table ``t``'s start at ``entry_base[t]``).

    What a step asks of an entry is decided once per entry, not once per lane: the columns are the
    entry's tests, and one more entry at the end (index -1, where ``orc_find()`` finds none) passes none.
    """

    def __init__(self, tables: list[OrcTable]) -> None:
        self.tables = tables
        self.rows = [t.entry_rows for t in tables]
        #: 0 to the number of tables: where each table's lanes start in a sorted ``table_of``, and the end
        self._table_numbers = np.arange(len(tables) + 1, dtype=np.int64)
        columns = [t.entry_columns for t in tables]
        self.entry_base = np.cumsum([0] + [len(c["type"]) for c in columns[:-1]]).astype(np.int64)

        def joined(name: str, none: int) -> np.ndarray:
            return np.concatenate([c[name] for c in columns] + [np.array([none], columns[0][name].dtype)])
        # the sentinel: a type that is no ORC type, undefined registers, no offsets
        kind, sp_reg, bp_reg = joined("type", 255), joined("sp_reg", ORC_REG_UNDEFINED), joined("bp_reg", ORC_REG_UNDEFINED)
        sp_offset, bp_offset = joined("sp_offset", 0).astype(np.int64), joined("bp_offset", 0).astype(np.int64)
        #: ORC_TYPE_END_OF_STACK: the walk's end (unwind_orc.c:503-510)
        self.end = kind == ORC_TYPE_END_OF_STACK
        #: ORC_TYPE_CALL with a CFA the batch takes (sp or bp plus sp_offset) and a bp it takes (undefined,
        #: or saved at prev_sp or bp plus bp_offset)
        self.call = ((kind == ORC_TYPE_CALL) & ((sp_reg == ORC_REG_SP) | (sp_reg == ORC_REG_BP))
                     & ((bp_reg == ORC_REG_UNDEFINED) | (bp_reg == ORC_REG_PREV_SP) | (bp_reg == ORC_REG_BP)))
        self.cfa_from_bp = sp_reg == ORC_REG_BP
        self.bp_saved = (bp_reg == ORC_REG_PREV_SP) | (bp_reg == ORC_REG_BP)
        self.bp_from_bp = bp_reg == ORC_REG_BP
        #: ORC_TYPE_REGS with a CFA the batch takes, and bp undefined (then read from the pt_regs): where a task
        #: that entered from user space ends
        self.regs = ((kind == ORC_TYPE_REGS) & ((sp_reg == ORC_REG_SP) | (sp_reg == ORC_REG_BP))
                     & (bp_reg == ORC_REG_UNDEFINED))
        # offsets as u64 added to words, with their sign for the wrap check (add_offset())
        self.sp_offset, self.sp_negative = sp_offset.astype(_U64), sp_offset < 0
        self.bp_offset, self.bp_negative = bp_offset.astype(_U64), bp_offset < 0
        #: not a signal frame: orc_find() looks up ip - 1 next (the sentinel's value is never read)
        self.not_signal = (joined("signal", 0) == 0).astype(_U64)

    # orc_find() (unwind_orc.c), over lanes: the entry (an index into the joined columns), or -1 where
    # it finds nothing
    def orc_find(self, table_of: np.ndarray, ip: np.ndarray) -> np.ndarray:
        """The entry of each lane's ip in its lane's table; negative where ``orc_find()`` has none.
        ``table_of`` is sorted: each table's lanes are one slice."""
        if len(self.tables) == 1:
            return self._entries(0, ip)
        out = np.full(len(ip), -1, np.int64)
        bounds = np.searchsorted(table_of, self._table_numbers).tolist()
        for t, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if lo < hi:
                out[lo:hi] = self._entries(t, ip[lo:hi])
        return out

    def _entries(self, t: int, ip: np.ndarray) -> np.ndarray:
        table, rows = self.tables[t], self.rows[t]

        def entry_of(ips: np.ndarray) -> np.ndarray:
            row = table.orc_find_batch(ips)
            return np.where(row >= 0, rows[np.maximum(row, 0)].astype(np.int64), -1)
        entry = _memo(table).lookup(ip, entry_of)
        return entry if t == 0 else np.where(entry >= 0, entry + self.entry_base[t], -1)


#: per ORC table: the entry orc_find() gave each ip looked up so far (a batch's lanes share their ips)
_MEMOS: "WeakKeyDictionary[OrcTable, Memo]" = WeakKeyDictionary()


def _memo(table: OrcTable) -> Memo:
    memo = _MEMOS.get(table)
    if memo is None:
        memo = _MEMOS[table] = Memo()
    return memo


def add_offset(value: np.ndarray, offset: np.ndarray, negative: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``value + offset`` (``offset`` as u64, ``negative`` where it is below zero) as the scalar walk's
    unbounded sum, and where that sum is a u64 (no wrap: a sum below ``value`` only for a negative offset)."""
    total = value + offset
    return total, (total < value) == negative


def batch_walk(jobs: list[Job]) -> Walked:
    """``unwind_next_frame()`` of every blocked task of ``jobs`` that the plain step can take, in lockstep."""
    lanes_in = gather_lanes(jobs, SOURCES, STOPS, DumpConstants, LANES)
    rec, per_lane, consts = lanes_in.recorder, lanes_in.per_lane, lanes_in.constants
    if lanes_in.columns is None:
        return rec.finish()
    tsp, low, high = lanes_in.columns
    lanes = lanes_in.lanes.astype(_U64)
    tables: list[OrcTable] = []
    table_index: dict[int, int] = {}
    for c in consts:
        if c is not None and id(c.table) not in table_index:
            table_index[id(c.table)] = len(tables)
            tables.append(c.table)
    orc = Tables(tables)
    table_of = per_lane(lambda c: table_index[id(c.table)], np.int64)
    text = np.array([c.text if c is not None else [(0, 0)] * 3 for c in consts], _U64).take(lanes_in.job_of, axis=0)
    rth, rethook = per_lane(lambda c: c.return_to_handler), per_lane(lambda c: c.rethook_trampoline)
    flat, seg_lo, seg_hi, origin, base = locate_lanes(jobs, lanes_in.job_of, lanes_in.tasks, tsp)
    words = flat.words

    # __unwind_start(): a blocked task's inactive_task_frame at thread.sp
    def at_offset(get):  # type: ignore[no-untyped-def]
        offset = per_lane(get, np.int64)
        return add_offset(tsp, offset.astype(_U64), offset < 0)
    at_bp, ok_bp = at_offset(lambda c: c.itf_bp)
    at_ret, ok_ret = at_offset(lambda c: c.itf_ret_addr)
    sp, ok_sp = at_offset(lambda c: c.itf_size)

    def captured(addr: np.ndarray, ok: np.ndarray, lo: np.ndarray, top: np.ndarray) -> np.ndarray:
        """8-aligned words in ``[lo, top + 8)`` (the lane's segment, or its stack and segment; :func:`window`)."""
        return ok & ((addr & _U64(7)) == 0) & (lo <= addr) & (addr <= top)

    delta = flat.word_delta(origin, base)
    seg_lo, seg_top = window(seg_lo, seg_hi)
    ok_bp = captured(at_bp, ok_bp, seg_lo, seg_top)
    ok_ret = captured(at_ret, ok_ret, seg_lo, seg_top)
    bp, ip = words.take(word_index(at_bp, delta), mode="clip"), words.take(word_index(at_ret, delta), mode="clip")
    signal = ip == per_lane(lambda c: c.ret_from_fork_asm)
    # get_stack_info(sp): the task stack, begin <= sp < end; then check_text(ip)
    keep = ok_bp & ok_ret & ok_sp & (sp != 0) & (low <= sp) & (sp < high) & kernel_text_lanes(ip, text)
    label_task = rec.label("task")
    rec.frames(0, lanes, keep, ip, sp=sp, fp=bp, source=_TASK, stack=label_task)
    # a word read must lie on the task stack and in the lane's captured segment: one window
    lo, top = window(np.maximum(low, seg_lo), np.minimum(high, seg_hi))
    # for the lanes that meet a REGS entry (user_mode_regs()), taken by lane number once the lockstep ends: per job,
    # :func:`pt_regs_words` (a size past every window where unknown); per lane, the task stack, the window, the
    # words' place and the rethook trampoline
    regs_words = [c.pt_regs_words if c is not None and c.pt_regs_words is not None else (_NO_REGS, 0, 0, 0)
                  for c in consts]
    job_regs = np.array(regs_words, _U64)
    regs_rows = (low, high, lo, top, delta.view(_U64), rethook)
    at_regs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    stext = text[:, 0, 0]
    state = np.stack([lo, top, delta.view(_U64), table_of.astype(_U64), rth, rethook, stext,
                      np.where(text[:, 0, 1] > stext, text[:, 0, 1] - stext, _U64(0))])
    # the lanes walked on, ordered by their ORC table (stable: by lane within one), so that each table's
    # lanes are one slice at every step (Tables.orc_find); a narrowing keeps their order (the lane numbers apart
    # from the state: Recorder.frames())
    keep = np.flatnonzero(keep)
    keep = keep[np.argsort(table_of[keep], kind="stable")]
    state = state[:, keep]
    lanes, ip, sp, bp, not_signal = lanes[keep], ip[keep], sp[keep], bp[keep], (~signal[keep]).astype(_U64)
    live = np.ones(len(ip), bool)
    step = 1
    while True:
        lo, top, delta, table_of, rth, rethook, stext, text_span = state
        delta = delta.view(np.int64)
        # unwind_next_frame(): orc_find(signal ? ip : ip - 1); END_OF_STACK ends the walk (unwind_orc.c:485-510)
        look = ip - not_signal
        entry = np.where(live, orc.orc_find(table_of.view(np.int64), look), -1)
        end = orc.end.take(entry)
        if np.count_nonzero(end):
            rec.stop(lanes[end], _ORC_END, look[end])
        # ORC_TYPE_CALL, the CFA: sp or bp plus sp_offset (unwind_orc.c:514-578)
        cfa, fits = add_offset(np.where(orc.cfa_from_bp.take(entry), bp, sp), orc.sp_offset.take(entry),
                               orc.sp_negative.take(entry))
        call = fits & orc.call.take(entry) & (cfa >= _U64(8))
        # ORC_TYPE_REGS: pt_regs at the CFA (unwind_orc.c:595-616); such a lane leaves the lockstep here, and
        # whether its registers end the walk in user mode is decided for all of them at once, after it
        regs = fits & orc.regs.take(entry)
        if np.count_nonzero(regs):
            e = np.flatnonzero(regs)
            at_regs.append((lanes.take(e), cfa.take(e), sp.take(e)))
        # the return address below the CFA, deref_stack_reg() on the stack walked (582-593)
        ip_p = cfa - _U64(8)
        call = captured(ip_p, call, lo, top)
        new_ip = words.take(word_index(ip_p, delta), mode="clip")
        call &= (new_ip != rth) & (new_ip != rethook)
        # bp: undefined (no regs: unchanged), or saved at prev_sp or bp plus bp_offset (640-661)
        saved = orc.bp_saved.take(entry)
        at, no_wrap = add_offset(np.where(orc.bp_from_bp.take(entry), bp, cfa), orc.bp_offset.take(entry),
                                 orc.bp_negative.take(entry))
        call &= ~saved | captured(at, no_wrap, lo, top)
        new_bp = np.where(saved, words.take(word_index(at, delta), mode="clip"), bp)
        # the kernel refuses an sp that did not grow on the stack (663-670); the batch takes only an sp that
        # grew by a word at least (so each frame consumes a stack word of its own); then the ip must be core
        # kernel text (check_text())
        go = call & (cfa > sp) & (cfa - sp >= _U64(8)) & ((new_ip - stext) < text_span)
        n = int(np.count_nonzero(go))
        if not n:
            break
        rec.frames(step, lanes, go, new_ip, sp=cfa, fp=new_bp, source=_ORC_CALL, stack=label_task)
        step += 1
        live, state, lanes, ip, sp, bp, not_signal = narrowed(go, n, state, lanes, new_ip, cfa, new_bp,
                                                              orc.not_signal.take(entry))
    if at_regs:
        ended, regs, prev_sp = (np.concatenate(column) for column in zip(*at_regs))
        user, regs_ip, regs_sp = user_mode_regs(words, regs, prev_sp,
                                                lanes_in.of_numbers(ended.view(np.int64), job_regs, regs_rows))
        if np.count_nonzero(user):
            ended, regs = ended[user], regs[user]
            rec.stop(ended, _USER_MODE, regs, regs_ip[user], regs_sp[user])
            rec.last_frame_extra(ended, "user_regs", regs)
    return rec.finish()


# unwind_orc.c:595-616 (ORC_TYPE_REGS), 640-670 (bp, the direction check) and regs_frame()'s user_mode() (476-483),
# over lanes: OrcUnwinder.step_regs() and regs_frame()'s user-mode end
def user_mode_regs(words: np.ndarray, regs: np.ndarray, sp: np.ndarray, lane: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the ``pt_regs`` at ``regs`` (a REGS entry's CFA, ``sp`` the walk's) end the walk in user mode: the
    struct on the task stack and in the lane's captured segment (its window ``lo``, ``top``), the new sp not
    refused as going the wrong way on the task stack, ``ip`` not the rethook trampoline's, and ``cs & 3``.
    ``lane`` holds per lane :func:`pt_regs_words`, its stack's low and high, its window, the words' place
    (``delta``) and the rethook trampoline. Returns that mask, ``regs->ip`` and ``regs->sp``; any other lane goes
    to the scalar walk."""
    size, ip_w, sp_w, cs_w, low, high, lo, top, delta, rethook = lane
    # stack_access_ok(sp, sizeof(pt_regs)), every word read (ip, sp, and bp and cs after them) inside the window
    inside = ((regs & _U64(7)) == 0) & (lo <= regs) & (top >= size - _U64(8)) & (regs <= top + _U64(8) - size)
    at = word_index(regs, delta.view(np.int64))
    ip, new_sp, cs = (words.take(at + w.view(np.int64), mode="clip") for w in (ip_w, sp_w, cs_w))
    # on_stack(): the new sp on the task stack and not above the old one is refused (an error stop)
    wrong_way = (low <= new_sp) & (new_sp <= high - _U64(8)) & (high >= _U64(8)) & (new_sp <= sp)
    return inside & ~wrong_way & (ip != rethook) & ((cs & _U64(3)) != 0), ip, new_sp


def window(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A lane's window ``[lo, hi)`` for word reads as ``(lo, top)``: a word at ``a`` lies in it when ``lo <= a
    <= top`` (``top = hi - 8``); a window shorter than a word takes none (``(1, 0)``)."""
    short = hi < _U64(8)
    return np.where(short, _U64(1), lo), np.where(short, _U64(0), hi - _U64(8))


# check_text() over lanes: core text, the module area, init text
def kernel_text_lanes(ip: np.ndarray, text: np.ndarray) -> np.ndarray:
    """Is each ip in one of its lane's ``[lo, hi)`` text ranges (``text``: lanes x ranges x 2)?"""
    return ((text[:, :, 0] <= ip[:, None]) & (ip[:, None] < text[:, :, 1])).any(axis=1)


class PlainLanes(LaneReader):
    """The tasks the plain step takes: a blocked task with a saved ``thread.sp`` (an integer) and one task stack, not
    refused by ``task_on_another_cpu()``; its words are ``thread.sp, stack low, stack high``."""

    width = 3

    def lane(self, task: Task, words: MutableSequence[int], at: int) -> bool:
        ctx, stacks = task.context, task.stacks
        if task.regs is None and ctx is not None and len(stacks) == 1 and not task_on_another_cpu(task):
            stack = stacks[0]
            tsp = ctx.get("sp")
            if stack.kind == "task" and stack.low < stack.high and isinstance(tsp, int):
                words[at], words[at + 1], words[at + 2] = tsp, stack.low, stack.high
                return True
        return False


LANES = PlainLanes()
