"""The x86-64 backend as the core sees it."""

from __future__ import annotations

import capstone

from unwind.frame import Frame
from unwind.registry import ArchBackend
from unwind.target import Target
from unwind.walk import Stop, Unwinder


class X86_64Backend(ArchBackend):
    """x86-64: ORC tables, IRQ/entry/exception stacks."""

    name = "x86_64"
    elf_machine = "EM_X86_64"
    e_machine = 62
    # struct user_regs_struct
    prstatus_regs = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
                     "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
                     "gs_base", "ds", "es", "fs", "gs")
    pc_reg = "rip"
    sp_reg = "rsp"
    capstone = (capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    # call rel32 (5), call *%reg (2, 3 with REX), call *disp(%reg) (3..7), retpoline thunks are call rel32
    call_lengths = (2, 3, 4, 5, 6, 7)

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """CALL in any form."""
        return mnemonic.startswith("call")

    def unwinder(self, target: Target) -> Unwinder:
        raise NotImplementedError("x86-64 unwinder: issue 4")

    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[tuple[str, Frame | None]]:
        raise NotImplementedError("x86-64 trace format: issue 4")
