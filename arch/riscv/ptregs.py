"""``task_pt_regs()`` found from the stacks' side, for a dump that gives no ``struct pt_regs`` size.

The blocked tasks' frame-record chains end, as ``walk_stackframe()`` follows them, on the first
``pt_regs`` of each task stack; where most chains end below the stack's top is
``ALIGN(sizeof(struct pt_regs), STACK_ALIGN)``.
"""

from __future__ import annotations

import struct
from typing import Callable

from unwind.core.memory import Memory, MemoryFault
from unwind.core.stackinfo import StackInfo
from unwind.core.target import Target
from unwind.kernel.layout import StructLayout

from .structs import SR_SPP, STACK_ALIGN, STACKFRAME_FP, STACKFRAME_SIZE, UPPER_HALF

#: ``fp_is_valid(fp, sp, thread_size)`` of ``arch/riscv/kernel/stacktrace.c``
FpCheck = Callable[[int, int, int], bool]
_U64 = struct.Struct("<Q").unpack_from


#: frame records followed per task when the pt_regs place is derived from the stacks
_DERIVE_RECORDS = 512
#: blocked tasks looked at for it
_DERIVE_TASKS = 32
#: no riscv pt_regs is larger (36 words today)
_DERIVE_MAX = 1024
#: sstatus.SPIE: set in every task's first pt_regs (U-mode runs with interrupts on; copy_thread()'s SR_PIE)
_SR_SPIE = 0x20
#: copy_thread(): a kernel thread's pt_regs is zeroed but for status = SR_PP | SR_PIE
_KTHREAD_STATUS = SR_SPP | _SR_SPIE


# task_pt_regs() (asm/processor.h) from the stacks' side: the first kernel frame's fp
def chain_end(mem: Memory, sp: int, fp: int, stack: StackInfo, ts: int, fp_is_valid: FpCheck) -> int | None:
    """The last frame pointer of the record chain from ``(sp, fp)`` that stays on ``stack``, as
    walk_stackframe() follows it (fp_is_valid() at each step)."""
    last = None
    start = end = 0  # the segment of the last record read: [start, end) holds data
    data = b""
    for _ in range(_DERIVE_RECORDS):
        if not (stack.low < fp <= stack.high and fp_is_valid(fp, sp, ts)):
            break
        last = fp
        addr = fp - STACKFRAME_SIZE + STACKFRAME_FP
        if not (start <= addr and addr + 8 <= end):
            try:
                seg = mem.segment(addr, 8)
            except MemoryFault:
                break
            start, end, data = seg.start, seg.end, seg.data
        sp, fp = fp, _U64(data, addr - start)[0]
    return last


def first_pt_regs(mem: Memory, addr: int, table: StructLayout) -> bool:
    """Is a task's first pt_regs at ``addr``: a user-mode one (SPIE set, SPP clear, epc a non-zero user
    address), or the one copy_thread() leaves a kernel thread (zero epc, status SR_PP | SR_PIE)?"""
    try:
        epc, status = mem.read_u64(addr + table["epc"]), mem.read_u64(addr + table["status"])
    except MemoryFault:
        return False
    user = status & (SR_SPP | _SR_SPIE) == _SR_SPIE and 0 < epc < UPPER_HALF
    return user or (epc == 0 and status == _KTHREAD_STATUS)


def _blocked_starts(target: Target) -> list[tuple[int, int, StackInfo]]:
    """(sp, fp, task stack) of the blocked tasks the dump lists (the same for every task walked)."""
    out: list[tuple[int, int, StackInfo]] = []
    last: dict[int | None, StackInfo] = {}  # each pid's task stack: the last the dump lists
    for st in target.info.stacks:
        if st.kind == "task":
            last[st.pid] = StackInfo(st.low, st.high, "task", None)
    for t in target.info.blocked:
        if len(out) >= _DERIVE_TASKS:
            break
        st, sp, fp = last.get(t.pid), t.context.get("sp"), t.context.get("s0")
        if st is not None and sp is not None and fp is not None:
            out.append((sp, fp, st))
    return out


def derived_pt_regs(target: Target, table: StructLayout, fp_is_valid: FpCheck) -> StructLayout | None:
    """``struct pt_regs`` placed where the tasks' record chains end (task_pt_regs(tsk) = top -
    ALIGN(sizeof(struct pt_regs), STACK_ALIGN)), when a first pt_regs sits there: the most common
    distance below the stack top; the member offsets stay the table's.

    Each chain is followed with its own stack's size as THREAD_SIZE, so the answer is the dump's,
    whichever task is being walked. ``fp_is_valid`` is the walk's own test of each record."""
    votes: dict[int, int] = {}
    for sp, fp, stack in _blocked_starts(target):
        end = chain_end(target.mem, sp, fp, stack, stack.high - stack.low, fp_is_valid)
        if end is None:
            continue
        dist = stack.high - end
        if (dist % STACK_ALIGN == 0 and max(table.offsets.values()) + 8 <= dist <= _DERIVE_MAX
                and first_pt_regs(target.mem, end, table)):
            votes[dist] = votes.get(dist, 0) + 1
    if not votes:
        return None
    dist = max(votes, key=lambda d: (votes[d], -d))
    return StructLayout("pt_regs", dist, dict(table.offsets), "derived",
                        f"{votes[dist]} of {sum(votes.values())} task record chains end at top-{dist:#x} on a "
                        f"first pt_regs, so ALIGN(sizeof, {STACK_ALIGN}) = {dist} (other offsets: {table.detail})")
