"""The arm64 backend as the core sees it."""

from __future__ import annotations

import capstone

from unwind.frame import Frame
from unwind.registry import ArchBackend
from unwind.target import Target
from unwind.walk import Stop, Unwinder


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
        raise NotImplementedError("arm64 unwinder: issue 3")

    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[tuple[str, Frame | None]]:
        raise NotImplementedError("arm64 trace format: issue 3")
