"""RISC-V kernel knowledge for reading a stopped kernel: saved contexts and per-CPU stacks.

Read through a :class:`unwind.kernel.model.KernelReader` (a vmcore, or a live guest
during capture); every offset from BTF, every size from BTF or THREAD_SIZE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unwind.kernel.percpu_stacks import percpu_stack_array, percpu_stack_ptr

if TYPE_CHECKING:
    from unwind.kernel.model import KernelReader

#: OVERFLOW_STACK_SIZE (arch/riscv/include/asm/thread_info.h) when BTF has no VAR for overflow_stack
OVERFLOW_STACK_SIZE = 4096

#: the task_struct members blocked_context() reads
CONTEXT_MEMBERS = ("thread.ra", "thread.sp", "thread.s")


#: struct thread_struct's callee-saved registers (arch/riscv/include/asm/processor.h): name -> member
THREAD_MEMBERS = {"ra": "thread.ra", "sp": "thread.sp", **{f"s{i}": f"thread.s[{i}]" for i in range(12)}}
#: their names, in the struct's order
THREAD_CONTEXT = tuple(THREAD_MEMBERS)


# __switch_to (arch/riscv/kernel/entry.S) saves ra, sp and s0..s11 in task->thread
def blocked_context(k: "KernelReader", task: int, tbytes: bytes) -> dict[str, int]:
    """``thread.ra``, ``thread.sp`` and ``thread.s[0..11]`` of a task that is not running."""
    out = {}
    for key, path in THREAD_MEMBERS.items():
        off = k.btf.offsetof("task_struct", path)
        out[key] = int.from_bytes(tbytes[off:off + 8], "little")
    return out


# irq_stack_ptr (CONFIG_IRQ_STACKS, arch/riscv/kernel/irq.c) and overflow_stack (kernel/traps.c)
def percpu_stacks(k: "KernelReader", cpu: int) -> list[tuple[str, int, int]]:
    """(kind, low, high) of the IRQ and overflow stacks of ``cpu``."""
    out: list[tuple[str, int, int]] = []
    if k.symbol("irq_stack_ptr") is not None:
        out = percpu_stack_ptr(k, "irq_stack_ptr", cpu, "irq")  # IRQ_STACK_SIZE == THREAD_SIZE
    return out + percpu_stack_array(k, "overflow_stack", cpu, "overflow", OVERFLOW_STACK_SIZE)


def cpu_mode(regs: dict[str, int]) -> str:
    """``kernel`` or ``user`` for a CPU's saved registers: NT_PRSTATUS carries no privilege level, so
    the pc's half of the address space decides (kernel addresses have the top bit set)."""
    return "kernel" if regs.get("pc", 0) >> 63 else "user"


# get_current() (arch/riscv/include/asm/current.h): tp holds current in the kernel
def current_task(k: "KernelReader", cpu: int, regs: dict[str, int]) -> tuple[int, str]:
    """(``current`` of ``cpu``, where it was read): ``tp`` when the CPU is in the kernel, else ``rq->curr``."""
    tp = regs.get("tp", 0)
    if cpu_mode(regs) == "kernel" and tp >> 63:
        return tp, "tp"
    return k.read_u64(k.percpu_addr("runqueues", cpu) + k.btf.offsetof("rq", "curr")), "runqueues.curr"
