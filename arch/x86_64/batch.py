"""The x86-64 ORC walk of many blocked tasks in numpy lockstep (:mod:`unwind.batch`).

One step, the plain one, of ``unwind_next_frame()`` for every lane at once:
the ORC entry of ``ip - 1`` (``ip`` after a signal frame) is a CALL entry whose
CFA is ``sp`` or ``bp`` plus an offset; the return address is the word below
the CFA and the saved ``bp`` is undefined or at ``prev_sp``/``bp`` plus an
offset, every word on the task stack; the new ``sp`` is a word or more above
the old one and the return address is core kernel text that no tracer hijacked. The walk's
natural end is taken here too: an ``ORC_TYPE_END_OF_STACK`` entry.

A lane goes back to the scalar unwinder (:mod:`.unwind_orc`) for anything
else: a task with registers, a REGS or REGS_PARTIAL entry (a pt_regs
crossing), an UNDEFINED entry or none (module, ftrace trampoline, the
frame-pointer guess), an indirect or register CFA, an fgraph or rethook
return, a word off the task stack or outside the lane's captured segment.
The per-dump constants (the ORC table, the layouts) are the scalar unwinder's own.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import numpy as np

from unwind import batch
from unwind.batch import Job, Memo, Walked, gather_lanes, locate_lanes, narrowed, word_index
from unwind.frame import Source
from unwind.target import Options, Task
from unwind.walk import StopReason

from .orc import (ORC_REG_BP, ORC_REG_PREV_SP, ORC_REG_SP, ORC_REG_UNDEFINED, ORC_TYPE_CALL, ORC_TYPE_END_OF_STACK,
                  OrcTable)
from .unwind_orc import OrcUnwinder, orc_end_detail

_U64 = np.uint64
#: the frame sources a batch walk reports, by index
SOURCES = (Source.ORC_CALL, Source.TASK)
_ORC_CALL, _TASK = range(2)
#: the stops a batch walk reports, by index
STOPS = ((StopReason.END_OF_STACK, lambda target, constants, ip, *_: orc_end_detail(ip)),)
_ORC_END = 0


class DumpConstants(batch.DumpConstants):
    """What every walk of one dump shares, read from a scalar unwinder of its first task."""

    __slots__ = ("table", "text", "itf_size", "itf_bp", "itf_ret_addr", "return_to_handler", "rethook_trampoline",
                 "ret_from_fork_asm")

    @staticmethod
    def key(options: Options) -> object:
        return options.generation, options.orc_version

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
        c.basis = unwinder.basis()
        return c


class Tables:
    """The ORC tables of a batch: each table's rows index its few hundred distinct entries, and the
    entries of all tables are one set of short columns (table ``t``'s start at ``entry_base[t]``)."""

    def __init__(self, tables: list[OrcTable]) -> None:
        self.tables = tables
        self.rows = [t.entry_rows for t in tables]
        columns = [t.entry_columns for t in tables]
        self.entry_base = np.cumsum([0] + [len(c["type"]) for c in columns[:-1]]).astype(np.int64)

        def joined(name: str) -> np.ndarray:
            return columns[0][name] if len(columns) == 1 else np.concatenate([c[name] for c in columns])
        self.type, self.sp_reg, self.bp_reg, self.signal = (joined(n) for n in ("type", "sp_reg", "bp_reg", "signal"))
        # offsets as int64, added to words with a wrap check (add_offset())
        self.sp_offset, self.bp_offset = (joined(n).astype(np.int64) for n in ("sp_offset", "bp_offset"))

    # orc_find() (unwind_orc.c), over lanes: the entry (an index into the joined columns), or -1 where
    # it finds nothing
    def orc_find(self, table_of: np.ndarray, ip: np.ndarray) -> np.ndarray:
        """The entry of each lane's ip in its lane's table; negative where ``orc_find()`` has none."""
        if len(self.tables) == 1:
            return self._entries(0, ip)
        out = np.full(len(ip), -1, np.int64)
        for t in range(len(self.tables)):
            sel = table_of == t
            if sel.any():
                out[sel] = self._entries(t, ip[sel])
        return out

    def _entries(self, t: int, ip: np.ndarray) -> np.ndarray:
        table, rows = self.tables[t], self.rows[t]

        def entry_of(ips: np.ndarray) -> np.ndarray:
            row = table.orc_find_batch(ips)
            return np.where(row >= 0, rows[np.maximum(row, 0)].astype(np.int64), -1)
        entry = _memo(table).lookup(ip, entry_of)
        return np.where(entry >= 0, entry + self.entry_base[t], -1)


#: per ORC table: the entry orc_find() gave each ip looked up so far (a batch's lanes share their ips)
_MEMOS: "WeakKeyDictionary[OrcTable, Memo]" = WeakKeyDictionary()


def _memo(table: OrcTable) -> Memo:
    memo = _MEMOS.get(table)
    if memo is None:
        memo = _MEMOS[table] = Memo()
    return memo


def add_offset(value: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``value + offset`` as the scalar walk's unbounded sum, and where that sum is a u64 (no wrap)."""
    total = value + offset.astype(_U64)
    return total, np.where(offset >= 0, total >= value, total < value)


def batch_walk(jobs: list[Job]) -> Walked:
    """``unwind_next_frame()`` of every blocked task of ``jobs`` that the plain step can take, in lockstep."""
    lanes_in = gather_lanes(jobs, SOURCES, STOPS, DumpConstants, lane_of, 3)
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
    text = np.array([c.text if c is not None else [(0, 0)] * 3 for c in consts], _U64)[lanes_in.job_of]
    rth, rethook = per_lane(lambda c: c.return_to_handler), per_lane(lambda c: c.rethook_trampoline)
    flat, seg_lo, seg_hi, origin, base = locate_lanes(jobs, lanes_in.job_of, lanes_in.tasks, tsp)
    words = flat.words

    # __unwind_start(): a blocked task's inactive_task_frame at thread.sp
    at_bp, ok_bp = add_offset(tsp, per_lane(lambda c: c.itf_bp, np.int64))
    at_ret, ok_ret = add_offset(tsp, per_lane(lambda c: c.itf_ret_addr, np.int64))
    sp, ok_sp = add_offset(tsp, per_lane(lambda c: c.itf_size, np.int64))

    def captured(addr: np.ndarray, ok: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """8-aligned words in ``[lo, hi)`` (the lane's segment, or its stack and segment)."""
        return ok & ((addr & _U64(7)) == 0) & (lo <= addr) & (addr < hi) & (hi - addr >= _U64(8))

    delta = flat.word_delta(origin, base)
    ok_bp = captured(at_bp, ok_bp, seg_lo, seg_hi)
    ok_ret = captured(at_ret, ok_ret, seg_lo, seg_hi)
    bp, ip = words.take(word_index(at_bp, delta), mode="clip"), words.take(word_index(at_ret, delta), mode="clip")
    signal = ip == per_lane(lambda c: c.ret_from_fork_asm)
    # get_stack_info(sp): the task stack, begin <= sp < end; then check_text(ip)
    keep = ok_bp & ok_ret & ok_sp & (sp != 0) & (low <= sp) & (sp < high) & kernel_text_lanes(ip, text)
    label_task = rec.label("task")
    rec.frames(0, lanes, keep, ip, sp=sp, fp=bp, source=_TASK, stack=label_task)
    # a word read must lie on the task stack and in the lane's captured segment: one window [lo, hi)
    state = np.stack([np.maximum(low, seg_lo), np.minimum(high, seg_hi), delta.view(_U64), lanes,
                      table_of.astype(_U64), rth, rethook, text[:, 0, 0], text[:, 0, 1]])[:, keep]
    ip, sp, bp, signal = ip[keep], sp[keep], bp[keep], signal[keep]
    live = np.ones(len(ip), bool)
    step = 1
    while True:
        lo, hi, delta, lanes, table_of, rth, rethook, stext, etext = state
        delta = delta.view(np.int64)
        # unwind_next_frame(): orc_find(signal ? ip : ip - 1); END_OF_STACK ends the walk (unwind_orc.c:485-510)
        look = np.where(signal, ip, ip - _U64(1))
        found = np.where(live, orc.orc_find(table_of.view(np.int64), look), -1)
        entry = np.where(found >= 0, found, 0)
        found = found >= 0
        kind = orc.type[entry]
        end = found & (kind == ORC_TYPE_END_OF_STACK)
        if end.any():
            rec.stop(lanes[end], _ORC_END, look[end])
        call = found & (kind == ORC_TYPE_CALL)
        # the CFA: sp or bp plus sp_offset (unwind_orc.c:514-578)
        sp_reg = orc.sp_reg[entry]
        cfa, no_wrap = add_offset(np.where(sp_reg == ORC_REG_BP, bp, sp), orc.sp_offset[entry])
        call &= no_wrap & ((sp_reg == ORC_REG_SP) | (sp_reg == ORC_REG_BP)) & (cfa >= _U64(8))
        # ORC_TYPE_CALL: the return address below the CFA, deref_stack_reg() on the stack walked (582-593)
        ip_p = cfa - _U64(8)
        call &= captured(ip_p, call, lo, hi)
        new_ip = words.take(word_index(ip_p, delta), mode="clip")
        call &= (new_ip != rth) & (new_ip != rethook)
        # bp: undefined (no regs: unchanged), or saved at prev_sp or bp plus bp_offset (640-661)
        bp_reg = orc.bp_reg[entry]
        saved = (bp_reg == ORC_REG_PREV_SP) | (bp_reg == ORC_REG_BP)
        at, no_wrap = add_offset(np.where(bp_reg == ORC_REG_BP, bp, cfa), orc.bp_offset[entry])
        call &= (bp_reg == ORC_REG_UNDEFINED) | (saved & captured(at, no_wrap, lo, hi))
        new_bp = np.where(saved, words.take(word_index(at, delta), mode="clip"), bp)
        # the kernel refuses an sp that did not grow on the stack (663-670); the batch takes only an sp that
        # grew by a word at least (so each frame consumes a stack word of its own); then the ip must be core
        # kernel text (check_text())
        go = call & (cfa > sp) & (cfa - sp >= _U64(8)) & (stext <= new_ip) & (new_ip < etext)
        n = int(np.count_nonzero(go))
        if not n:
            break
        rec.frames(step, lanes, go, new_ip, sp=cfa, fp=new_bp, source=_ORC_CALL, stack=label_task)
        step += 1
        live, state, ip, sp, bp, signal = narrowed(go, n, state, new_ip, cfa, new_bp, orc.signal[entry] != 0)
    return rec.finish()


# check_text() over lanes: core text, the module area, init text
def kernel_text_lanes(ip: np.ndarray, text: np.ndarray) -> np.ndarray:
    """Is each ip in one of its lane's ``[lo, hi)`` text ranges (``text``: lanes x ranges x 2)?"""
    return ((text[:, :, 0] <= ip[:, None]) & (ip[:, None] < text[:, :, 1])).any(axis=1)


def lane_of(task: Task) -> tuple[int, ...] | None:
    """A lane's words for ``task`` when the batch takes it: a blocked task with a saved ``thread.sp`` and one
    task stack; its ``thread.sp, stack low, stack high``."""
    ctx = task.context
    if task.regs is None and ctx is not None and len(task.stacks) == 1:
        stack = task.stacks[0]
        tsp = ctx.get("sp")
        if stack.kind == "task" and stack.low < stack.high and tsp is not None:
            return tsp, stack.low, stack.high
    return None
