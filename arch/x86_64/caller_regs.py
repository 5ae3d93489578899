"""The registers an x86-64 ORC walk establishes for a frame: what ``unwind gdb`` hands gdb for a caller.

An ORC CALL frame restores ``rip``, ``rsp`` and ``rbp``. A full ``struct pt_regs`` (ORC REGS) restores
every general register and the IRET frame; a partial one (ORC REGS_PARTIAL) only the IRET frame
(``rip``, ``cs``, ``eflags``, ``rsp``, ``ss``), with ``rbp`` as the walk has it.
"""

from __future__ import annotations

from unwind.core.frame import Frame, Source
from unwind.core.target import Target

from .printer import PRSTATUS_NAMES, pt_regs_at

#: the IRET frame's members: all a REGS_PARTIAL entry has
_IRET_MEMBERS = ("ip", "cs", "flags", "sp", "ss")


# restore_regs_and_return_to_kernel (arch/x86/entry/entry_64.S): POP_REGS, then iretq
def restore_regs(target: Target, base: int, partial: bool) -> dict[str, int]:
    """The registers restored from the ``struct pt_regs`` at ``base`` (only its IRET frame when ``partial``),
    by ``NT_PRSTATUS`` names; nothing when it was not captured."""
    words = pt_regs_at(target, base, partial) or {}
    return {PRSTATUS_NAMES[m]: v for m, v in words.items() if not partial or m in _IRET_MEMBERS}


def frame_registers(frames: list[Frame], index: int, target: Target) -> dict[str, int]:
    """The registers the walk establishes for ``frames[index]``, by ``NT_PRSTATUS`` names."""
    frame = frames[index]
    out = {} if frame.pt_regs is None else \
        restore_regs(target, frame.pt_regs, frame.source is Source.ORC_REGS_PARTIAL)
    out["rip"] = frame.pc
    if frame.sp is not None:
        out["rsp"] = frame.sp
    if frame.fp is not None:
        out["rbp"] = frame.fp
    return out
