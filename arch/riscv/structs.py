"""Every RISC-V kernel layout the unwinder reads, declared once with construct.

- ``struct stackframe`` (``asm/stacktrace.h``): ``{fp, ra}``, found at
  ``fp - sizeof(struct stackframe)``.
- ``struct pt_regs`` (``asm/ptrace.h``): 36 words, 288 bytes; ``s0`` at 64.
- ``struct user_regs_struct`` (``uapi/asm/ptrace.h``): ``pc`` then x1..x31,
  the ``pr_reg`` of an ``NT_PRSTATUS`` note.

Code asks these declarations for sizes and offsets (:func:`offsetof`); the
walk takes ``struct pt_regs`` from the image's BTF or the dump's ``offsets``
first (:func:`unwind.kernel.layout.resolve_layout`). It is the same in the 6.1, 6.12
and 7.2 trees (7.2 groups a0..a7 in a ``struct_group``, which moves nothing).
"""

from __future__ import annotations

from construct import Int64ul, Struct

from unwind.kernel.layout import StructLayout, offsetof, table_layout

# arch/riscv/include/asm/stacktrace.h: struct stackframe
stackframe = Struct(
    "fp" / Int64ul,
    "ra" / Int64ul,
)

#: x1..x31 by ABI name, in register-number order (pt_regs and user_regs_struct share it)
GPR_NAMES = ("ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1",
             *(f"a{i}" for i in range(8)), *(f"s{i}" for i in range(2, 12)),
             "t3", "t4", "t5", "t6")

# arch/riscv/include/asm/ptrace.h: struct pt_regs
pt_regs = Struct(
    "epc" / Int64ul,
    *(name / Int64ul for name in GPR_NAMES),
    # Supervisor/Machine CSRs
    "status" / Int64ul,
    "badaddr" / Int64ul,
    "cause" / Int64ul,
    # a0 value before the syscall
    "orig_a0" / Int64ul,
)

# arch/riscv/include/uapi/asm/ptrace.h: struct user_regs_struct (NT_PRSTATUS pr_reg)
user_regs_struct = Struct(
    "pc" / Int64ul,
    *(name / Int64ul for name in GPR_NAMES),
)

# arch/riscv/include/asm/csr.h: SR_SPP, the previous privilege (1: the trap came from S-mode)
SR_SPP = 0x100


def member_names(struct: Struct) -> tuple[str, ...]:
    """The members of ``struct`` in declaration order."""
    return tuple(sub.name for sub in struct.subcons)


#: the members of ``struct pt_regs`` the walk reads
PT_REGS_MEMBERS = ("epc", "ra", "s0", "status")
#: the table's ``struct pt_regs``
PT_REGS_TABLE: StructLayout = table_layout("pt_regs", pt_regs, PT_REGS_MEMBERS, "6.1-7.2 table (288 bytes)")
#: the members of ``struct pt_regs`` the exception return (``restore_all``) loads into registers
RESTORED_MEMBERS = ("epc", *GPR_NAMES)
RESTORED_TABLE: StructLayout = table_layout("pt_regs", pt_regs, RESTORED_MEMBERS, "6.1-7.2 table (288 bytes)")
#: STACK_ALIGN (asm/processor.h): task_pt_regs() rounds sizeof(struct pt_regs) up to it
STACK_ALIGN = 16

STACKFRAME_SIZE = stackframe.sizeof()
STACKFRAME_FP = offsetof(stackframe, "fp")
STACKFRAME_RA = offsetof(stackframe, "ra")
PT_SIZE = pt_regs.sizeof()
PT_EPC = offsetof(pt_regs, "epc")
PT_RA = offsetof(pt_regs, "ra")
PT_S0 = offsetof(pt_regs, "s0")
PT_STATUS = offsetof(pt_regs, "status")

assert PT_SIZE == 288 and PT_S0 == 64 and STACKFRAME_SIZE == 16

#: without ``_stext``/``_etext`` every upper-half address counts as kernel text
UPPER_HALF = 1 << 63
