"""RISC-V (rv64) capture knowledge for ``unwind capture`` (QEMU gdbstub).

Privilege from QEMU's virtual ``priv`` register (0 U, 1 S, 3 M); stops at
``stvec`` (``handle_exception+0``) normalised to ``sepc``; ``current`` from
``tp`` in S-mode, ``sscratch`` in U-mode (else the runqueue's ``curr``); Linux CPU numbers
from ``mhartid`` and ``__cpuid_to_hartid_map``. The hooks read the guest through
:class:`unwind.kernel.model.Kernel`; saved contexts and per-CPU stacks are the arch's ``kernel``
hooks. Layouts come from BTF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unwind.kernel.model import Kernel

NAME = "riscv"
GDB_ARCH = "riscv:rv64"
BREAK_KIND = 4
SYSREGS = ["priv", "sstatus", "sepc", "scause", "stval", "stvec", "sscratch", "satp", "mhartid"]
#: the vCPU's hardware id and the kernel's map from Linux CPU number to it
HW_CPU_ID_REG = "mhartid"
HW_CPU_ID_MAP = "__cpuid_to_hartid_map"
#: current_task() sources that name the task by itself (their thread_info.cpu checks the numbering)
SELF_CURRENT = ("tp", "sscratch")
#: sstatus.SPP: the trap came from S-mode
SSTATUS_SPP = 1 << 8
SYSCALL_ENTRY = ["do_trap_ecall_u"]
IRQ_BREAKS = ["handle_riscv_irq", "riscv_timer_interrupt"]
HIJACK_BREAKS = ["read_zero", "urandom_read_iter"]
TRAMPOLINES = ["return_to_handler", "arch_rethook_trampoline", "__kretprobe_trampoline"]
EXTRA_SYMBOLS = ["handle_exception", "ret_from_exception", "call_on_irq_stack"]
_GPRS = ["ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1", "a0", "a1", "a2", "a3", "a4", "a5",
         "a6", "a7", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "t3", "t4", "t5", "t6"]


def classify(raw: dict[str, int], k: "Kernel") -> tuple[str, dict[str, int], str | None]:
    """(mode, registers to record, normalisation note); ``stvec`` stops become ``sepc``."""
    regs = {r: raw.get(r, raw.get("fp", 0) if r == "s0" else 0) for r in _GPRS}
    regs["pc"] = raw["pc"]
    priv = raw.get("priv", 1)
    note = None
    if priv == 1 and raw.get("stvec") and raw["pc"] == raw["stvec"] and "sepc" in raw:
        note = "stvec (trap entry) -> sepc"
        regs["pc"] = raw["sepc"]
        if not raw.get("sstatus", 0) & SSTATUS_SPP:
            return "user", regs, note
    mode = {0: "user", 1: "kernel"}.get(priv, "firmware")
    return mode, regs, note


def pc_sp(regs: dict[str, int]) -> tuple[int, int]:
    """Program counter and stack pointer of recorded registers."""
    return regs["pc"], regs["sp"]


# cpuid_to_hartid_map() (arch/riscv/include/asm/smp.h): Linux CPU n runs on hart map[n]
def hw_cpu_ids(k: "Kernel", ncpu: int) -> list[int] | None:
    """The hart id of each Linux CPU (``__cpuid_to_hartid_map[0..ncpu)``; OpenSBI's boot hart is CPU 0)."""
    addr = k.symbol(HW_CPU_ID_MAP)
    if addr is None:
        return None
    data = k.read(addr, 8 * ncpu)
    return [int.from_bytes(data[i * 8:i * 8 + 8], "little") for i in range(ncpu)]


def _from_user(raw: dict[str, int]) -> bool:
    """The vCPU runs in U-mode, or stopped at ``stvec`` on a trap from U-mode (before the swap)."""
    if raw.get("priv") == 0:
        return True
    return (raw.get("priv") == 1 and bool(raw.get("stvec")) and raw.get("pc") == raw["stvec"]
            and not raw.get("sstatus", 0) & SSTATUS_SPP)


def current_task(k: "Kernel", cpu: int, raw: dict[str, int]) -> tuple[int, str]:
    """(task_struct address, source): ``tp`` in S-mode, ``sscratch`` in U-mode (handle_exception swaps
    them; the return to user stores tp there), when it is a task; else the runqueue's ``curr``."""
    reg = "sscratch" if _from_user(raw) else "tp" if raw.get("priv") == 1 else None
    task = raw.get(reg, 0) if reg else 0
    if task >> 63 and k.readable(task):
        stack = k.read_u64(task + k.btf.offsetof("task_struct", "stack"))
        if stack >> 63:
            return task, reg
    rq = k.percpu_addr("runqueues", cpu) + k.btf.offsetof("rq", "curr")
    return k.read_u64(rq), "runqueues.curr"


#: the printer sysrq-l runs on each other CPU with the interrupted registers (first argument)
REGS_PRINTER = ("show_regs", "a0")


def regs_from_pt_regs(k: "Kernel", addr: int) -> tuple[str, dict[str, int]]:
    """(mode, registers) of the ``struct pt_regs`` at ``addr``."""
    data = k.read(addr, k.btf.sizeof("pt_regs"))

    def u(path: str) -> int:
        off = k.btf.offsetof("pt_regs", path)
        return int.from_bytes(data[off:off + 8], "little")

    out = {r: u(r) for r in _GPRS}
    out["pc"] = u("epc")
    return ("kernel" if u("status") & SSTATUS_SPP else "user"), out
