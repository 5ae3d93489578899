"""The registers a riscv walk establishes for a frame: what ``unwind gdb`` hands gdb for a caller.

A frame record ``{fp, ra}`` gives the caller's ``s0``, its ``sp`` (the callee's ``s0``: the frame
pointer is the stack pointer at entry) and its return address (``ra`` holds it when the callee
returns). A ``struct pt_regs`` crossed at an exception frame gives every register the exception
return restores: ``x1``-``x31`` and ``pc`` (``epc``).
"""

from __future__ import annotations

from unwind.core.frame import Frame, Source
from unwind.core.memory import MemoryFault
from unwind.core.target import Target
from unwind.kernel.layout import resolve_layout

from .structs import RESTORED_MEMBERS, RESTORED_TABLE


# restore_all (arch/riscv/kernel/entry.S): epc into sepc, then x1..x31 from pt_regs
def restore_all(target: Target, base: int) -> dict[str, int]:
    """The registers the exception return restores from the ``struct pt_regs`` at ``base`` (those
    captured), by ``NT_PRSTATUS`` names (``epc`` is the pc)."""
    layout = target.per_dump("riscv pt_regs restored",
                             lambda t: resolve_layout(t, "pt_regs", RESTORED_MEMBERS, RESTORED_TABLE))
    out = {}
    for member in RESTORED_MEMBERS:
        try:
            out["pc" if member == "epc" else member] = target.mem.read_u64(base + layout[member])
        except MemoryFault:
            continue
    return out


def frame_registers(frames: list[Frame], index: int, target: Target) -> dict[str, int]:
    """The registers the walk establishes for ``frames[index]``, by ``NT_PRSTATUS`` names."""
    frame = frames[index]
    if frame.pt_regs is not None:
        out = restore_all(target, frame.pt_regs)
    else:
        out = {"sp": frame.sp} if frame.sp is not None else {}
        if frame.source in (Source.FRAME, Source.STACK_SWITCH, Source.LIVE_LR):
            out["ra"] = frame.pc  # the return address the record held, as the callee's ret leaves it
    out["pc"] = frame.pc
    if frame.fp is not None:
        out["s0"] = frame.fp
    return out
