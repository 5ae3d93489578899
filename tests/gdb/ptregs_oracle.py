"""The ``struct pt_regs`` an exception left on a stack, read straight from a dump file (not through the
walk): found on the task's stacks by its interrupted pc and stack (x86-64) or frame (arm64) pointer, its
words at the offsets of the kernel's headers, BTF's where the image has it. Names are gdb's."""

from __future__ import annotations

from typing import Any

from unwind.core.memory import Memory, MemoryFault

#: arch/x86/include/asm/ptrace.h, struct pt_regs: every member a word, in this order
X86_64 = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
          "orig_rax", "rip", "cs", "eflags", "rsp", "ss")
#: arch/arm64/include/uapi/asm/ptrace.h, struct user_pt_regs (the head of struct pt_regs)
ARM64 = (*(f"x{i}" for i in range(31)), "sp", "pc", "cpsr")
#: each arch's gdb names, their offsets, and the two that find the pt_regs of a frame
LAYOUTS = {"x86_64": ({n: 8 * i for i, n in enumerate(X86_64)}, ("rip", "rsp")),
           "arm64": ({n: 8 * i for i, n in enumerate(ARM64)}, ("pc", "x29"))}
#: the interrupted context was the kernel's: __KERNEL_CS (x86-64), EL1t/EL1h in AArch64 state (arm64)
KERNEL_MODE = {"x86_64": lambda w: w["cs"] == 0x10, "arm64": lambda w: w["cpsr"] & 0x1F in (0x4, 0x5)}


def offsets(arch: str, btf: Any) -> dict[str, int]:
    """The layout's offsets, checked against the image's BTF where it has one."""
    offs, _ = LAYOUTS[arch]
    if btf is not None and arch == "arm64":
        assert btf.offsetof("pt_regs", "regs") == offs["x0"] and btf.offsetof("pt_regs", "sp") == offs["sp"]
        assert btf.offsetof("pt_regs", "pc") == offs["pc"] and btf.offsetof("pt_regs", "pstate") == offs["cpsr"]
    return offs


def find(arch: str, mem: Memory, stacks: list[tuple[int, int]], frame: dict[str, int],
         btf: Any = None) -> dict[str, int] | None:
    """The words of the ``pt_regs`` on ``stacks`` whose key registers are ``frame``'s, or ``None``."""
    offs = offsets(arch, btf)
    _, keys = LAYOUTS[arch]
    size = max(offs.values()) + 8
    found = []
    for lo, hi in stacks:
        for addr in range(lo, hi - size + 1, 8):
            try:
                if all(mem.read_u64(addr + offs[k]) == frame[k] for k in keys):
                    words = {n: mem.read_u64(addr + o) for n, o in offs.items()}
                    if KERNEL_MODE[arch](words):
                        found.append(words)
            except MemoryFault:
                continue
    assert len(found) <= 1, f"{len(found)} pt_regs match {keys}"
    return found[0] if found else None
