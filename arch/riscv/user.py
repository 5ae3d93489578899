"""The user stack of a task, as ``arch_stack_walk_user()`` (``arch/riscv/kernel/stacktrace.c``) walks it.

``unwind replay --user``: the pc from the task's user ``pt_regs`` (epc), then ``regs->ra`` with the first
record's fp, then the frame records on the user stack, below ``TASK_SIZE``.
"""

from __future__ import annotations

from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.core.memory import MemoryFault
from unwind.core.target import Target
from unwind.core.walk import StopReason, Unwinder, UnwindStop
from unwind.formats.vmcore.vmcoreinfo import vmcoreinfo_number

from .structs import STACKFRAME_FP, STACKFRAME_RA, STACKFRAME_SIZE

MASK64 = (1 << 64) - 1
#: the user address limit when VMCOREINFO has no ``NUMBER(VA_BITS)``: TASK_SIZE_64 of Sv57
DEFAULT_VA_BITS = 57
_BOUNDARY = Flag.BOUNDARY
_NONE = Flag.NONE


def user_task_size(target: Target) -> int:
    """TASK_SIZE_64 = PGDIR_SIZE * PTRS_PER_PGD / 2 = 2^(VA_BITS - 1)."""
    bits = vmcoreinfo_number(target.vmcoreinfo, "NUMBER(VA_BITS)")  # bounded to [32, 64]
    return 1 << ((bits if bits is not None else DEFAULT_VA_BITS) - 1)


# arch/riscv/kernel/stacktrace.c:214-226 arch_stack_walk_user()
class UserUnwinder(Unwinder):
    """``arch_stack_walk_user()``: epc, then ``regs->ra`` with the first record's fp, then records."""

    def __init__(self, target: Target) -> None:
        self.t = target
        self.mem = target.mem
        self.record = target.options.record
        self.task_size = user_task_size(target)
        self.fp = 0
        self.reg_ra = 0
        self.first = True

    def start(self) -> Frame:
        """``consume_entry(cookie, regs->epc)`` with ``fp = regs->s0``."""
        regs = self.t.task.user_regs
        if regs is None:
            raise UnwindStop(StopReason.MISSING_REGISTER, "no user registers in the dump for this task")
        try:
            epc = regs["epc"] if "epc" in regs else regs["pc"]
            self.fp, self.reg_ra = regs["s0"], regs["ra"]
        except KeyError as e:
            raise UnwindStop(StopReason.MISSING_REGISTER, f"user regs have no {e.args[0]}") from None
        prov = None
        if self.record:
            prov = Provenance("arch_stack_walk_user: regs->epc first")
            prov.note(f"user regs: epc {epc:#x}, s0 {self.fp:#x}, ra {self.reg_ra:#x}")
        return Frame(epc, regs.get("sp"), self.fp, Source.REGS_PC, "user", _BOUNDARY, prov)

    def next(self) -> Frame:
        """The loop ``while (fp && !(fp & 0x7)) fp = unwind_user_frame(..., fp, 0)``."""
        fp, reg_ra = self.fp, self.reg_ra if self.first else 0
        if not self.first:
            if fp == 0:
                raise UnwindStop(StopReason.END_OF_STACK, "user fp is 0")
            if fp & 7:
                raise UnwindStop(StopReason.MISALIGNED_FP, f"user fp {fp:#x}")
        self.first = False
        return self._unwind_user_frame(fp, reg_ra)

    # arch/riscv/kernel/stacktrace.c:189-212 unwind_user_frame()
    def _unwind_user_frame(self, fp: int, reg_ra: int) -> Frame:
        tail = (fp - STACKFRAME_SIZE) & MASK64
        # access_ok(user_frame_tail, sizeof(buftail))
        if tail > self.task_size - STACKFRAME_SIZE:
            if fp == 0:
                raise UnwindStop(StopReason.END_OF_STACK, "user s0 is 0: no frame record")
            raise UnwindStop(StopReason.OUTSIDE_STACK, f"user record at {tail:#x} is above TASK_SIZE "
                                                       f"{self.task_size:#x}")
        try:
            new_fp = self.mem.read_u64(tail + STACKFRAME_FP)
            ra = self.mem.read_u64(tail + STACKFRAME_RA)
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, f"user record at {tail:#x} unreadable "
                                                      f"(__copy_from_user_inatomic fails): {e}") from None
        pc = reg_ra or ra
        self.fp = new_fp
        if not pc:
            raise UnwindStop(StopReason.END_OF_STACK, f"ra 0 in the user record at {tail:#x}")
        prov = None
        if self.record:
            prov = Provenance("unwind_user_frame: {fp, ra} at fp - 16" + (", ra from regs->ra" if reg_ra else ""))
            prov.read(tail + STACKFRAME_FP, 8, new_fp, "buftail.fp")
            prov.read(tail + STACKFRAME_RA, 8, ra, "buftail.ra" + (" (unused)" if reg_ra else ""))
            prov.note(f"access_ok: record below TASK_SIZE {self.task_size:#x}")
        source = Source.LIVE_LR if reg_ra else Source.FRAME
        return Frame(pc, None, new_fp, source, "user", _NONE, prov)
