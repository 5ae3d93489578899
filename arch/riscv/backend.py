"""The RISC-V backend as the core sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from unwind.core.frame import Flag, Frame, Source
from unwind.core.registry import ArchBackend
from unwind.core.target import SavedRegs, Target
from unwind.core.trace import TraceLine, frame_line
from unwind.core.walk import Stop, Unwinder

from . import mm, structs
from .kernel import THREAD_CONTEXT
from .liveness import LiveRaProver
from .stacktrace import KernelLayout, RiscvUnwinder
from .user import UserUnwinder

if TYPE_CHECKING:
    from unwind.session.batch import Job, Walked
    from unwind.kernel.btf import Btf
    from unwind.session.replay import Replay
    from unwind.formats.vmcore.virtual import PhysReader
    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

#: the kernel's own printed traces: faithful replay must equal them
_KERNEL_ORACLES = ("sysrq-t", "sysrq-l", "ftrace-stacktrace", "dump_backtrace")

#: documented differences from an oracle (``unwind diff``, the corpus tests)
CATEGORIES = {
    "stale": "the capture marked the oracle stale: the task ran between the dump and the printout",
    "tracer-frames": "the kernel's trace was taken deeper in the same chain (the tracer's own frames on top): "
                     "the replay equals its tail",
    "entry-or-leaf": "the oracle has the ra-held caller of a function stopped at its entry, in a frameless "
                     "leaf or in its epilogue, which the kernel's method drops and complete mode could not "
                     "prove (no text, or no proof); gdb may also stop inside the replay",
    "oracle-stops-early": "the oracle stops inside the replay: gdb has no CFI at handle_exception or "
                          "call_on_irq_stack (\"frame did not save the PC\")",
    "oracle-continues": "the replay ended cleanly where the oracle goes on",
    "oracle-fgraph": "the oracle stops at return_to_handler (gdb cannot see through the function-graph "
                     "hijack); the replay recovered the return from the ret_stack and goes on",
    "oracle-trap-entry": "the CPU stopped inside handle_exception before it saved the registers; gdb's "
                         "unwind from there is wrong (drops the sepc function, repeats frames)",
}

#: the marker a complete-mode line carries, by the source of its pc
_COMPLETE_WHY = {
    Source.LIVE_LR: "caller held in ra",
    Source.STACK_SWITCH: "past call_on_irq_stack",
}


def _is_c_jalr(h: int) -> bool:
    """``c.jalr rs1``: funct4 1001, rs1 != 0, rs2 == 0, op 10 (rs1 == 0 is c.ebreak)."""
    return h & 0xF07F == 0x9002 and bool(h & 0x0F80)


def _is_link_jump(word: int) -> bool:
    """``jal rd, off`` or ``jalr rd, off(rs1)`` with rd != zero (rd == zero is a jump, not a call)."""
    return bool(word & 0xF80) and (word & 0x7F == 0x6F or word & 0x707F == 0x67)

class RiscvBackend(ArchBackend):
    """RISC-V 64: s0 frame records, exception frames, IRQ stacks."""

    name = "riscv"
    aliases = ("riscv64",)
    options = frozenset({"user"})
    elf_machine = "EM_RISCV"
    e_machine = 243
    e_flags = 0x5  # EF_RISCV_RVC | EF_RISCV_FLOAT_ABI_DOUBLE, as the kernel image
    # struct user_regs_struct: pc, then x1..x31 by ABI name
    prstatus_regs = structs.member_names(structs.user_regs_struct)
    gdb_arch = "riscv:rv64"
    fp_reg = "s0"
    gdb_registers = {"s0": "fp"}
    pc_reg = "pc"
    sp_reg = "sp"
    # thread.ra, thread.sp, thread.s[0..11]
    context_keys = frozenset({"ra", "sp", *(f"s{i}" for i in range(12))})
    capstone = ("CS_ARCH_RISCV", "CS_MODE_RISCV64", "CS_MODE_RISCVC")
    call_lengths = (2, 4)
    layouts = {"pt_regs": structs.PT_REGS_MEMBERS}

    #: QEMU writes no VMCOREINFO for riscv guests: the kernel's own is found in memory (mm.find_vmcoreinfo)
    vmcoreinfo_in_memory = True

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """JAL/JALR (and compressed forms) that write a link register (rd != zero)."""
        if mnemonic in ("c.jal", "c.jalr"):
            return True
        if mnemonic in ("jal", "jalr"):
            return not op_str.startswith("zero")
        return False

    def call_site_length(self, text: Callable[[int, int], bytes | None], ret: int) -> int | None:
        """C.JALR (2 bytes), else JAL or JALR with a link register (4 bytes), from their encodings."""
        half = text(ret - 2, 2)
        if half is None:
            return None
        if _is_c_jalr(int.from_bytes(half, "little")):
            return 2
        code = text(ret - 4, 4)
        return 4 if code is not None and _is_link_jump(int.from_bytes(code, "little")) else None

    def no_call_site(self, text: Callable[[int, int], bytes | None], ret: int) -> bool:
        """Neither the halfword before ``ret`` is a C.JALR nor the word before it a JAL/JALR with a
        link register: no call (RV64 has no C.JAL) ends there."""
        half, code = text(ret - 2, 2), text(ret - 4, 4)
        return (half is not None and code is not None and not _is_c_jalr(int.from_bytes(half, "little"))
                and not _is_link_jump(int.from_bytes(code, "little")))

    def frame_registers(self, frames: list[Frame], index: int, target: Target) -> dict[str, int]:
        """s0, sp and the return address of a frame record; every register of a ``pt_regs`` crossed."""
        from .caller_regs import frame_registers

        return frame_registers(frames, index, target)

    def unwinder(self, target: Target) -> Unwinder:
        """``walk_stackframe()`` of the task, or ``arch_stack_walk_user()`` with ``options.user``."""
        if target.options.user:
            return UserUnwinder(target)
        layout = KernelLayout.of(target)
        prover = None
        if target.options.complete:
            trap = ((layout.handle_exception, layout.ret_from_exception_end),)
            prover = LiveRaProver(target.image, target.symbols, trap, self.capstone_mode())
        return RiscvUnwinder(target, layout, prover)

    def batch_walk(self, jobs: "list[Job]") -> "Walked":
        """The plain ``walk_stackframe()`` step of every blocked task in lockstep (:mod:`.batch`)."""
        from . import batch

        return batch.batch_walk(jobs)

    # arch/riscv/kernel/stacktrace.c:138-155 print_trace_address(), show_stack(); process.c:62-69 __show_regs()
    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[TraceLine]:
        """The 6.12 riscv trace: ``print_trace_address()`` lines, ``[<%px>] %pS``.

        A blocked task prints as ``show_stack()`` does (``Call Trace:`` first); a
        CPU's registers as ``show_regs()`` does (``epc : %pS`` and `` ra : %pS``
        from ``__show_regs()``, then the lines, no header). The user walk prints
        as ftrace's ``<user stack trace>``. Complete-mode frames carry a
        ``[complete: ...]`` mark and the stack switch a marker line.
        """
        out: list[TraceLine] = []
        if target.options.user:
            out.append(TraceLine.header("<user stack trace>"))
            out.extend(TraceLine.of_frame(f" =>  <{f.pc:016x}>", f, f.pc, hex(f.pc)) for f in frames)
            return out
        regs = target.task.regs
        if regs is not None:
            for name, key, label in (("epc", "pc", "epc :"), ("ra", "ra", " ra :")):
                sym = self._sym(regs[key], target)
                out.append(TraceLine.regs(f"{label} {sym}", {name: regs[key]}, symbol=sym))
        else:
            out.append(TraceLine.header("Call Trace:"))
        for f in frames:
            if f.source is Source.STACK_SWITCH:
                out.append(TraceLine.marker("--- call_on_irq_stack: IRQ stack -> task stack [complete] ---",
                                            "irq", "switch"))
            sym = f.symbol or self.symbolize(f, target)
            out.append(frame_line(f, sym, f"[<{f.pc:016x}>] {sym}", self._complete_why))
        return out

    def translator(self, info: "VmcoreInfo", phys: "PhysReader",
                   symbol: Callable[[str], int | None]) -> mm.RiscvTranslator:
        """The kernel's page tables and linear maps of a vmcore (:mod:`.mm`)."""
        return mm.translator(info, phys, symbol)

    def vmcoreinfo_from_memory(self, phys: "PhysReader", ranges: Iterable[tuple[int, int]],
                               symbol: Callable[[str], int | None],
                               btf: "Btf | None" = None) -> "tuple[VmcoreInfo, str]":
        """The kernel's own ``vmcoreinfo_note``, found through the image's symbols (:func:`.mm.find_vmcoreinfo`)."""
        return mm.find_vmcoreinfo(phys, ranges, symbol, btf)

    # __switch_to (arch/riscv/kernel/entry.S) stores ra, sp and s0..s11 in task->thread
    def saved_regs(self, target: Target) -> SavedRegs | None:
        """``thread.ra``, ``thread.sp`` and ``thread.s[0..11]``."""
        return SavedRegs.of_context(target.task, THREAD_CONTEXT, "task_struct.thread (ra, sp, s[0..11])")

    def categorize(self, oracle: dict[str, Any], expected: list[int], replay: "Replay") -> str | None:
        """Name the documented category of a difference from an oracle (:data:`CATEGORIES`), else ``None``."""
        if oracle.get("stale"):
            return "stale"
        got = [f.pc for f in replay.frames]
        if oracle.get("source") in _KERNEL_ORACLES:
            if oracle.get("source") == "ftrace-stacktrace" and len(got) >= 2 and expected[-len(got):] == got:
                return "tracer-frames"
            return None
        frames = replay.frames
        handler = replay.target.symbol_address("return_to_handler")
        if frames and frames[0].flags & Flag.BOUNDARY and self._in_trap_entry(frames[0].pc, replay.target):
            return "oracle-trap-entry"
        n = len(expected) - 1
        if (handler is not None and expected and expected[-1] == handler and len(got) > n
                and got[:n] == expected[:n] and frames[n].flags & Flag.FGRAPH):
            return "oracle-fgraph"
        for i in range(1, min(len(expected), len(got) + 1)):
            # the oracle may also stop inside the replay (gdb at ftrace_caller, handle_exception)
            if frames[i - 1].flags & Flag.BOUNDARY and expected[:i] + expected[i + 1:] == got[:n]:
                return "entry-or-leaf"
        if len(expected) < len(got) and got[:len(expected)] == expected:
            return "oracle-stops-early"
        if len(got) < len(expected) and expected[:len(got)] == got and replay.stop.clean:
            return "oracle-continues"
        return None

    @staticmethod
    def _in_trap_entry(pc: int, target: Target) -> bool:
        """Is ``pc`` in ``handle_exception``, the trap entry?"""
        lo, hi = target.symbol_address("handle_exception"), target.symbol_address("ret_from_exception")
        return lo is not None and hi is not None and lo <= pc < hi

    def _sym(self, addr: int, target: Target) -> str:
        """``%pS`` of an address."""
        return target.symbols.format(addr) if target.symbols is not None else hex(addr)

    @staticmethod
    def _complete_why(f: Frame) -> str:
        if f.extra and "complete" in f.extra:
            return str(f.extra["complete"])
        if f.flags & Flag.FGRAPH:
            return "fgraph return recovered"
        if f.flags & Flag.KRETPROBE:
            return "kretprobe return recovered"
        return _COMPLETE_WHY.get(f.source, "beyond where the kernel stops")
