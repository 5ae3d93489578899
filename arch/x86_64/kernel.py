"""x86-64 kernel knowledge for reading a stopped kernel: saved contexts and per-CPU stacks.

Read through a :class:`unwind.kernel.model.KernelReader` (a vmcore, or a live guest
during capture); offsets from BTF, and each generation's home of a per-CPU
value asked of the symbols: ``hardirq_stack_ptr`` is a per-CPU variable in
6.1 and 6.15+, a ``pcpu_hot`` member in between; ``_cea_offset`` (6.2+)
randomises which ``cpu_entry_area`` a CPU uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unwind.core.memory import MemoryFault
from unwind.core.target import SavedRegs
from unwind.kernel.btf import BtfError
from unwind.kernel.layout import image_btf, resolve_layout

from .structs import INACTIVE_TASK_FRAME_ALL, INACTIVE_TASK_FRAME_FULL_TABLE

if TYPE_CHECKING:
    from unwind.core.target import Target
    from unwind.kernel.model import KernelReader

#: CPU_ENTRY_AREA_PER_CPU = CPU_ENTRY_AREA_BASE + PAGE_SIZE, CPU_ENTRY_AREA_BASE = -4UL << P4D_SHIFT
#: (arch/x86/include/asm/pgtable_64_types.h; the same with 4- and 5-level paging)
CEA_PER_CPU_BASE = 0xFFFFFE0000001000
#: the IST stacks of struct cea_exception_stacks (arch/x86/include/asm/cpu_entry_area.h)
EXCEPTION_STACKS = ("DF", "NMI", "DB", "MCE", "VC", "VC2")

#: the task_struct members blocked_context() reads
CONTEXT_MEMBERS = ("thread.sp",)


# switch_to() leaves task->thread.sp at the struct inactive_task_frame
def blocked_context(k: "KernelReader", task: int, tbytes: bytes) -> dict[str, int]:
    """Saved context of a task that is not running: ``thread.sp``."""
    off = k.btf.offsetof("task_struct", "thread.sp")
    return {"sp": int.from_bytes(tbytes[off:off + 8], "little")}


# switch_to(): __switch_to_asm() pushes struct inactive_task_frame and saves the stack pointer in thread.sp
def saved_regs(target: "Target") -> SavedRegs | None:
    """``thread.sp`` and the ``struct inactive_task_frame`` at it (layout: BTF, the dump's, the table)."""
    task = target.task
    if task.running or task.context is None or "sp" not in task.context:
        return None
    tsp = task.context["sp"]
    btf = image_btf(target)
    members = INACTIVE_TASK_FRAME_ALL
    if btf is not None and btf.has("inactive_task_frame", "struct"):
        members = tuple(name for name, _ in btf.members("inactive_task_frame") if name)
    layout = resolve_layout(target, "inactive_task_frame", members, INACTIVE_TASK_FRAME_FULL_TABLE)
    regs, missing = {"sp": tsp}, []
    for m in members:
        try:
            regs[m] = target.mem.read_u64(tsp + layout[m])
        except MemoryFault:
            missing.append(m)
    return SavedRegs(regs, f"task_struct.thread.sp and the struct inactive_task_frame at it, {layout.size} bytes "
                           f"(layout from {layout.source}: {layout.detail})", tuple(missing))


def percpu_member(k: "KernelReader", name: str, cpu: int) -> int:
    """The address of per-CPU ``name``: its own variable, else ``pcpu_hot.name`` (6.2-6.14)."""
    if k.symbol(name) is not None:
        return k.percpu_addr(name, cpu)
    return k.percpu_addr("pcpu_hot", cpu) + k.btf.offsetof("pcpu_hot", name)


# cea_offset() (arch/x86/mm/cpu_entry_area.c): per_cpu(_cea_offset, cpu), or the CPU number
def cea_offset(k: "KernelReader", cpu: int) -> int:
    """Which ``cpu_entry_area`` slot ``cpu`` uses."""
    if k.symbol("_cea_offset") is None:
        return cpu
    return k.read_u64(k.percpu_addr("_cea_offset", cpu)) & 0xFFFFFFFF


# get_stack_info() (arch/x86/kernel/dumpstack_64.c): in_hardirq_stack(), in_entry_stack(), in_exception_stack()
def percpu_stacks(k: "KernelReader", cpu: int) -> list[tuple[str, int, int]]:
    """(kind, low, high) of the IRQ, entry and IST exception stacks of ``cpu``."""
    out: list[tuple[str, int, int]] = []
    irq_size = k.btf.sizeof("irq_stack") if k.btf.has("irq_stack", "struct") else k.thread_size
    ptr = k.read_u64(percpu_member(k, "hardirq_stack_ptr", cpu))
    if ptr:
        # irq_init_percpu_irqstack(): the pointer holds top - 8; the top word links to the interrupted sp
        out.append(("irq", ptr + 8 - irq_size, ptr + 8))
    cea = CEA_PER_CPU_BASE + cea_offset(k, cpu) * k.btf.sizeof("cpu_entry_area")
    m = k.btf.member("cpu_entry_area", "entry_stack_page")
    out.append(("entry", cea + m.offset, cea + m.offset + m.size))
    est = cea + k.btf.offsetof("cpu_entry_area", "estacks")
    for name in EXCEPTION_STACKS:
        try:
            m = k.btf.member("cea_exception_stacks", f"{name}_stack")
        except BtfError:
            continue
        out.append((f"exception:{name}", est + m.offset, est + m.offset + m.size))
    return out




# user_mode() (arch/x86/include/asm/ptrace.h): the RPL of CS
def cpu_mode(regs: dict[str, int]) -> str:
    """``kernel`` or ``user`` for a CPU's saved registers."""
    return "user" if regs.get("cs", 0) & 3 == 3 else "kernel"


# get_current(): this_cpu_read(current_task) (6.1, 6.15+) or pcpu_hot.current_task (6.2-6.14)
def current_task(k: "KernelReader", cpu: int, regs: dict[str, int]) -> tuple[int, str]:
    """(``current`` of ``cpu``, where it was read): switch_to() changes it with the stack, unlike ``rq->curr``."""
    where = "current_task" if k.symbol("current_task") is not None else "pcpu_hot.current_task"
    return k.read_u64(percpu_member(k, "current_task", cpu)), where
