"""The arm64 backend as the core sees it."""

from __future__ import annotations

import capstone

from unwind.frame import Flag, Frame, Source
from unwind.registry import ArchBackend
from unwind.target import Target
from unwind.walk import Stop, Unwinder

from .stacktrace import META_RECORDS_SINCE, Arm64Unwinder, kernel_generation

# state_source_string() (v6.13+)
_SOURCE_LETTER = {Source.FRAME: "", Source.CALLER: "C", Source.TASK: "T", Source.REGS_PC: "P"}
#: what complete mode prints after the frames it adds (never printed by a kernel)
_COMPLETE_MARK = {Source.LIVE_LR: " [complete: live lr]", Source.EXCEPTION_FRAME: " [complete: vector]"}


class Arm64Backend(ArchBackend):
    """arm64: frame records at x29, PAC stripping, exception boundaries."""

    name = "arm64"
    elf_machine = "EM_AARCH64"
    e_machine = 183
    # struct user_pt_regs: x0..x30, sp, pc, pstate
    prstatus_regs = tuple(f"x{i}" for i in range(31)) + ("sp", "pc", "pstate")
    pc_reg = "pc"
    sp_reg = "sp"
    capstone = (capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
    call_lengths = (4,)

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """BL and every BLR form (BLRAA, BLRAAZ, ...)."""
        return mnemonic == "bl" or mnemonic.startswith("blr")

    def unwinder(self, target: Target) -> Unwinder:
        """``kunwind_stack_walk()`` of the dumped kernel's generation (v6.12 or v6.13+)."""
        return Arm64Unwinder(target)

    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[tuple[str, Frame | None]]:
        """``dump_backtrace()``: ``Call trace:`` then `` %pSb`` per frame.

        From v6.13 each line ends with the source and recovery markers of
        ``dump_backtrace_entry()``: `` (P)``, `` (T)``, `` (C)``, `` (U)``,
        `` (F)``, `` (K)`` and their combinations such as `` (TF)``.
        Frames only complete mode adds carry a ``[complete: ...]`` mark.
        """
        gen, _ = kernel_generation(target)
        markers = gen is not None and gen >= META_RECORDS_SINCE
        out: list[tuple[str, Frame | None]] = [("Call trace:", None)]
        for f in frames:
            line = " " + (f.symbol or self.symbolize(f, target))
            if f.flags & Flag.COMPLETE:
                line += _COMPLETE_MARK.get(f.source, " [complete]")
            elif markers:
                info = _SOURCE_LETTER.get(f.source, "U")
                info += ("F" if f.flags & Flag.FGRAPH else "") + ("K" if f.flags & Flag.KRETPROBE else "")
                if info:
                    line += f" ({info})"
            out.append((line, f))
        return out
