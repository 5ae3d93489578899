"""The RISC-V backend as the core sees it."""

from __future__ import annotations

import capstone

from unwind.frame import Frame
from unwind.registry import ArchBackend
from unwind.target import Target
from unwind.walk import Stop, Unwinder


class RiscvBackend(ArchBackend):
    """RISC-V 64: s0 frame records, exception frames, IRQ stacks."""

    name = "riscv"
    elf_machine = "EM_RISCV"
    e_machine = 243
    e_flags = 0x5  # EF_RISCV_RVC | EF_RISCV_FLOAT_ABI_DOUBLE, as the kernel image
    # struct user_regs_struct: pc, then x1..x31 by ABI name
    prstatus_regs = ("pc", "ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1",
                     *(f"a{i}" for i in range(8)), *(f"s{i}" for i in range(2, 12)),
                     "t3", "t4", "t5", "t6")
    pc_reg = "pc"
    sp_reg = "sp"
    capstone = (capstone.CS_ARCH_RISCV, capstone.CS_MODE_RISCV64 | capstone.CS_MODE_RISCVC)
    call_lengths = (2, 4)

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """JAL/JALR (and compressed forms) that write a link register (rd != zero)."""
        if mnemonic in ("c.jal", "c.jalr"):
            return True
        if mnemonic in ("jal", "jalr"):
            return not op_str.startswith("zero")
        return False

    def unwinder(self, target: Target) -> Unwinder:
        raise NotImplementedError("riscv unwinder: issue 5")

    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[tuple[str, Frame | None]]:
        raise NotImplementedError("riscv trace format: issue 5")
