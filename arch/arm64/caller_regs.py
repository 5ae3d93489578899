"""The registers an arm64 walk establishes for a frame: what ``unwind gdb`` hands gdb for a caller.

A frame record gives the caller's ``x29`` and its return address (``x30`` holds it when the callee
returns). A ``struct pt_regs`` crossed at an exception boundary gives every register the exception
return restores: ``x0``-``x30``, ``sp``, ``pc`` (ELR) and ``pstate`` (SPSR). Up to v6.12 the walk
crosses it as the ordinary record ``{x29, ELR}`` in ``pt_regs->stackframe``; the ``pt_regs`` is
recognised as an EL1 one whose pc and x29 are the record's.
"""

from __future__ import annotations

from unwind.core.frame import Frame, Source
from unwind.core.memory import Memory, MemoryFault
from unwind.core.target import Target

from .structs import USER_PT_REGS_SP, PtRegsLayout

#: PSR_MODE_EL1h/EL1t (``asm/ptrace.h``): the exception came from the kernel; PSR_MODE32_BIT clear
_PSR_MODE_EL1_MASK, _PSR_MODE_EL1 = 0xC, 0x4
_PSR_MODE32_BIT = 0x10


def el1_pt_regs(mem: Memory, layout: PtRegsLayout, base: int, pc: int, fp: int) -> bool:
    """Is the ``struct pt_regs`` at ``base`` the EL1 exception frame whose ``{x29, ELR}`` are ``fp``, ``pc``?"""
    try:
        elr = mem.read_u64(base + layout.pc)
        x29 = mem.read_u64(base + layout.reg(29))
        pstate = mem.read_u64(base + layout.pstate)
    except MemoryFault:
        return False
    el1 = (pstate & _PSR_MODE_EL1_MASK) == _PSR_MODE_EL1 and not pstate & _PSR_MODE32_BIT
    return el1 and elr == pc and x29 == fp


# kernel_exit (arch/arm64/kernel/entry.S): x0..x30 from pt_regs->regs, sp, ELR_EL1 and SPSR_EL1
def kernel_exit(mem: Memory, layout: PtRegsLayout, base: int) -> dict[str, int]:
    """The registers the exception return restores from the ``struct pt_regs`` at ``base`` (those captured)."""
    out = {}
    for name, off in ((*((f"x{i}", layout.reg(i)) for i in range(31)), ("sp", layout.regs + USER_PT_REGS_SP),
                       ("pc", layout.pc), ("pstate", layout.pstate))):
        try:
            out[name] = mem.read_u64(base + off)
        except MemoryFault:
            continue
    return out


def record_pt_regs(frames: list[Frame], index: int, target: Target, layout: PtRegsLayout) -> int | None:
    """Up to v6.12: the EL1 ``struct pt_regs`` whose ``stackframe`` is the record ``frames[index]`` came
    from (read at the callee's fp), or ``None``."""
    frame = frames[index]
    if index == 0 or frame.source is not Source.FRAME:
        return None
    record_at = frames[index - 1].fp
    if record_at is None or frame.fp is None:
        return None
    base = record_at - layout.stackframe
    return base if el1_pt_regs(target.mem, layout, base, frame.pc, frame.fp) else None


def frame_registers(frames: list[Frame], index: int, target: Target, layout: PtRegsLayout,
                    meta_records: bool) -> dict[str, int]:
    """The registers the walk (``meta_records``: of v6.13+, with the ``struct pt_regs`` ``layout``)
    establishes for ``frames[index]``, by ``NT_PRSTATUS`` names."""
    frame = frames[index]
    out: dict[str, int] = {}
    base = frame.pt_regs if meta_records else record_pt_regs(frames, index, target, layout)
    if base is not None:
        out.update(kernel_exit(target.mem, layout, base))
    elif frame.source is Source.FRAME:
        out["x30"] = frame.pc  # the return address the record held, as the callee's ret leaves it
    out["pc"] = frame.pc
    if frame.fp is not None:
        out["x29"] = frame.fp
    if frame.sp is not None and base is None:
        out["sp"] = frame.sp
    return out
