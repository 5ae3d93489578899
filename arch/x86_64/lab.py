"""x86-64 capture knowledge for ``unwind capture`` (QEMU gdbstub, 64-bit kernels).

Which registers to read, when a stopped vCPU is in the kernel, and where
``current`` is. The hooks read the guest through :class:`unwind.kernel.model.Kernel`;
saved contexts and per-CPU stacks (IRQ, entry, IST exception stacks) are the
arch's ``kernel`` hooks. Layouts come from BTF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .kernel import percpu_member

if TYPE_CHECKING:
    from unwind.kernel.model import Kernel

NAME = "x86_64"
#: gdb ``set architecture`` value and Z1 breakpoint kind
GDB_ARCH = "i386:x86-64"
BREAK_KIND = 1
#: registers outside the ``g`` block we record
SYSREGS = ["fs_base", "gs_base", "k_gs_base", "cr0", "cr2", "cr3", "cr4", "efer"]
#: where random/breakpoint stops go for each capture kind
SYSCALL_ENTRY = ["do_syscall_64"]
IRQ_BREAKS = ["hrtimer_interrupt", "__sysvec_apic_timer_interrupt"]
HIJACK_BREAKS = ["read_zero", "urandom_read_iter"]
#: return trampolines whose addresses the JSON note records
TRAMPOLINES = ["return_to_handler", "arch_rethook_trampoline", "__kretprobe_trampoline"]


def prstatus(raw: dict[str, int]) -> dict[str, int]:
    """Registers named as the dump's NT_PRSTATUS layout (user_regs_struct)."""
    out = {k: raw[k] for k in ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
                               "rax", "rcx", "rdx", "rsi", "rdi", "rip", "cs", "eflags", "rsp", "ss",
                               "fs_base", "gs_base", "ds", "es", "fs", "gs") if k in raw}
    out["orig_rax"] = 2**64 - 1
    return out


def classify(raw: dict[str, int], k: "Kernel") -> tuple[str, dict[str, int], str | None]:
    """(mode, registers to record, normalisation note) of a stopped vCPU."""
    mode = "user" if raw.get("cs", 0) & 3 == 3 else "kernel"
    return mode, prstatus(raw), None


def pc_sp(regs: dict[str, int]) -> tuple[int, int]:
    """Program counter and stack pointer of recorded registers."""
    return regs["rip"], regs["rsp"]


def current_task(k: "Kernel", cpu: int, raw: dict[str, int]) -> tuple[int, str]:
    """(task_struct address, where it was read) for ``cpu``.

    Not ``gs_base``: before ``swapgs`` it holds the user value.
    """
    where = "current_task" if k.symbol("current_task") is not None else "pcpu_hot.current_task"
    return k.read_u64(percpu_member(k, "current_task", cpu)), where


#: the printer sysrq-l runs on each other CPU with the interrupted registers (first argument)
REGS_PRINTER = ("show_regs", "rdi")
_PT_REGS = {"r15": "r15", "r14": "r14", "r13": "r13", "r12": "r12", "bp": "rbp", "bx": "rbx",
            "r11": "r11", "r10": "r10", "r9": "r9", "r8": "r8", "ax": "rax", "cx": "rcx", "dx": "rdx",
            "si": "rsi", "di": "rdi", "orig_ax": "orig_rax", "ip": "rip", "cs": "cs", "flags": "eflags",
            "sp": "rsp", "ss": "ss"}


def regs_from_pt_regs(k: "Kernel", addr: int) -> tuple[str, dict[str, int]]:
    """(mode, registers) of the ``struct pt_regs`` at ``addr``."""
    data = k.read(addr, k.btf.sizeof("pt_regs"))
    out = {}
    for member, name in _PT_REGS.items():
        m = k.btf.member("pt_regs", member)
        out[name] = int.from_bytes(data[m.offset:m.offset + m.size], "little")
    return ("user" if out["cs"] & 3 == 3 else "kernel"), out
