"""arm64 kernel knowledge for reading a stopped kernel: saved contexts and per-CPU stacks.

Read through a :class:`unwind.kernel.model.KernelReader` (a vmcore, or a live guest
during capture); every offset from BTF, every size from BTF or THREAD_SIZE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unwind.kernel.percpu_stacks import percpu_stack_array, percpu_stack_ptr

if TYPE_CHECKING:
    from unwind.kernel.model import KernelReader

#: struct cpu_context (arch/arm64/include/asm/processor.h): what cpu_switch_to() saves
CPU_CONTEXT = ("x19", "x20", "x21", "x22", "x23", "x24", "x25", "x26", "x27", "x28", "fp", "sp", "pc")
#: OVERFLOW_STACK_SIZE (arch/arm64/include/asm/stacktrace.h) when BTF has no VAR for overflow_stack
OVERFLOW_STACK_SIZE = 4096

#: the task_struct members blocked_context() reads
CONTEXT_MEMBERS = ("thread.cpu_context",)


# thread_saved_pc()/thread_saved_sp()/thread_saved_fp() read task->thread.cpu_context
def blocked_context(k: "KernelReader", task: int, tbytes: bytes) -> dict[str, int]:
    """``thread.cpu_context`` (x19..x28, fp, sp, pc) of a task that is not running."""
    out = {}
    for r in CPU_CONTEXT:
        off = k.btf.offsetof("task_struct", f"thread.cpu_context.{r}")
        out[r] = int.from_bytes(tbytes[off:off + 8], "little")
    return out


# on_irq_stack(), on_overflow_stack(), on_sdei_*_stack() (arch/arm64/include/asm/stacktrace.h, kernel/sdei.c)
def percpu_stacks(k: "KernelReader", cpu: int) -> list[tuple[str, int, int]]:
    """(kind, low, high) of the IRQ, overflow and SDEI stacks of ``cpu``."""
    out = percpu_stack_ptr(k, "irq_stack_ptr", cpu, "irq")  # IRQ_STACK_SIZE == THREAD_SIZE
    out += percpu_stack_array(k, "overflow_stack", cpu, "overflow", OVERFLOW_STACK_SIZE)
    for name, kind in (("sdei_stack_normal_ptr", "sdei_normal"), ("sdei_stack_critical_ptr", "sdei_critical")):
        if k.symbol(name) is not None:
            out += percpu_stack_ptr(k, name, cpu, kind)  # SDEI_STACK_SIZE == IRQ_STACK_SIZE
    return out


# user_mode() / PSR_MODE_MASK (arch/arm64/include/asm/ptrace.h)
def cpu_mode(regs: dict[str, int]) -> str:
    """``kernel``, ``user`` or ``firmware`` for a CPU's saved registers (PSTATE.EL)."""
    return {0: "user", 1: "kernel"}.get((regs.get("pstate", 0) >> 2) & 3, "firmware")


# entry_task_switch() (arch/arm64/kernel/process.c): __switch_to() records next in __entry_task
def current_task(k: "KernelReader", cpu: int, regs: dict[str, int]) -> tuple[int, str]:
    """(``current`` of ``cpu``, where it was read): per-CPU ``__entry_task`` (SP_EL0 is not in NT_PRSTATUS)."""
    return k.read_u64(k.percpu_addr("__entry_task", cpu)), "__entry_task"
