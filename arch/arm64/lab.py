"""arm64 capture knowledge for ``unwind capture`` (QEMU gdbstub).

Exception level from PSTATE, vector-entry stops normalised to ELR/SPSR,
``current`` from SP_EL0 (or per-CPU ``__entry_task`` while SP_EL0 still holds
the user sp). The hooks read the guest through :class:`unwind.kernel.model.Kernel`;
saved contexts and per-CPU stacks are the arch's ``kernel`` hooks. Layouts come from BTF.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unwind.kernel.model import Kernel

NAME = "arm64"
GDB_ARCH = "aarch64"
BREAK_KIND = 4
SYSREGS = ["SP_EL0", "ELR_EL1", "SPSR_EL1", "ESR_EL1", "FAR_EL1", "VBAR", "SCTLR", "TCR_EL1",
           "TTBR0_EL1", "TTBR1_EL1"]
#: the vector table spans 16 entries of 0x80 bytes
VECTORS_SIZE = 0x800
SYSCALL_ENTRY = ["invoke_syscall", "el0_svc_common"]
IRQ_BREAKS = ["arch_timer_handler_virt", "hrtimer_interrupt"]
HIJACK_BREAKS = ["read_zero", "urandom_read_iter"]
TRAMPOLINES = ["return_to_handler", "__kretprobe_trampoline"]
EXTRA_SYMBOLS = ["vectors", "call_on_irq_stack"]
_CTX = ["x19", "x20", "x21", "x22", "x23", "x24", "x25", "x26", "x27", "x28", "fp", "sp", "pc"]


def _el(pstate: int) -> int:
    return (pstate >> 2) & 3


def _mode(el: int) -> str:
    return {0: "user", 1: "kernel"}.get(el, "firmware")


def classify(raw: dict[str, int], k: "Kernel") -> tuple[str, dict[str, int], str | None]:
    """(mode, registers to record, normalisation note); vector stops become the interrupted state."""
    regs = {f"x{i}": raw[f"x{i}"] for i in range(31)}
    regs.update(sp=raw["sp"], pc=raw["pc"], pstate=raw["cpsr"])
    note = None
    vbar = raw.get("VBAR", 0)
    if vbar and vbar <= raw["pc"] < vbar + VECTORS_SIZE and "ELR_EL1" in raw:
        note = f"vectors+{raw['pc'] - vbar:#x} -> ELR_EL1/SPSR_EL1"
        regs["pc"], regs["pstate"] = raw["ELR_EL1"], raw.get("SPSR_EL1", 0)
    mode = _mode(_el(regs["pstate"]))
    if mode == "user" and _el(raw["cpsr"]) == 0:
        regs["sp"] = raw["sp"]
    elif mode == "user":
        regs["sp"] = raw.get("SP_EL0", regs["sp"])
    return mode, regs, note


def pc_sp(regs: dict[str, int]) -> tuple[int, int]:
    """Program counter and stack pointer of recorded registers."""
    return regs["pc"], regs["sp"]


#: current_task() sources that name the task by itself (their thread_info.cpu checks the numbering)
SELF_CURRENT = ("SP_EL0",)


def current_task(k: "Kernel", cpu: int, raw: dict[str, int]) -> tuple[int, str]:
    """(task_struct address, source): SP_EL0 at EL1, else per-CPU ``__entry_task``."""
    sp_el0 = raw.get("SP_EL0", 0)
    if _el(raw["cpsr"]) == 1 and sp_el0 >> 63 and k.readable(sp_el0):
        stack = k.read_u64(sp_el0 + k.btf.offsetof("task_struct", "stack"))
        if stack >> 63:
            return sp_el0, "SP_EL0"
    return k.read_u64(k.percpu_addr("__entry_task", cpu)), "__entry_task"


def gdb_fixup(segs: dict[int, bytes], cpus: list[tuple[int, dict[str, int]]], vmcoreinfo: Mapping[str, str],
              text: tuple[int, int]) -> tuple[dict[int, bytes], list[tuple[int, dict[str, int]]]]:
    """A copy of a dump's memory and registers that gdb can unwind: PAC-signed text addresses stripped.

    QEMU 7.2 offers gdb no pauth feature, so gdb never strips PACs. Every
    8-byte word (and x30) that has bit 55 set and lands in kernel text once
    ``| KERNELPACMASK`` is applied is replaced by the stripped value.
    """
    mask = int(vmcoreinfo.get("NUMBER(KERNELPACMASK)", "0"), 0)
    if not mask:
        return segs, cpus
    lo, hi = text

    def strip(w: int) -> int:
        if w >> 55 & 1 and lo <= (w | mask) < hi:
            return w | mask
        return w

    out = {}
    for start, data in segs.items():
        buf = bytearray(data)
        first = (-start) % 8
        for i in range(first, len(buf) - 7, 8):
            w = int.from_bytes(buf[i:i + 8], "little")
            s = strip(w)
            if s != w:
                buf[i:i + 8] = s.to_bytes(8, "little")
        out[start] = bytes(buf)
    return out, [(cpu, {**regs, "x30": strip(regs.get("x30", 0))}) for cpu, regs in cpus]


#: the printer sysrq-l runs on each other CPU with the interrupted registers (first argument)
REGS_PRINTER = ("show_regs", "x0")


def regs_from_pt_regs(k: "Kernel", addr: int) -> tuple[str, dict[str, int]]:
    """(mode, registers) of the ``struct pt_regs`` at ``addr``."""
    data = k.read(addr, k.btf.sizeof("pt_regs"))

    def u(path: str) -> int:
        off = k.btf.offsetof("pt_regs", path)
        return int.from_bytes(data[off:off + 8], "little")

    out = {f"x{i}": u(f"regs[{i}]") for i in range(31)}
    out.update(sp=u("sp"), pc=u("pc"), pstate=u("pstate"))
    return _mode(_el(out["pstate"])), out
