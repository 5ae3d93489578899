"""The arm64 backend as the core sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from unwind.core.frame import Flag, Frame, Source
from unwind.core.registry import ArchBackend
from unwind.core.target import SavedRegs, Target
from unwind.core.trace import TraceLine, frame_line
from unwind.core.walk import Stop, Unwinder

from . import mm
from .kernel import CPU_CONTEXT
from .structs import PT_REGS_MEMBERS
from .ptrauth import kernel_pac_mask, ptrauth_strip_kernel_insn_pac
from .stacktrace import Arm64Unwinder, user_mode, walk_constants, walk_generation

if TYPE_CHECKING:
    from unwind.session.batch import Job, Walked
    from unwind.session.replay import Replay
    from unwind.formats.vmcore.virtual import PhysReader
    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

# state_source_string() (v6.13+)
_SOURCE_LETTER = {Source.FRAME: "", Source.CALLER: "C", Source.TASK: "T", Source.REGS_PC: "P"}
#: why complete mode added a frame, by the source of its pc (printed after it: no kernel prints it)
_COMPLETE_WHY = {Source.LIVE_LR: "live lr", Source.EXCEPTION_FRAME: "vector"}
#: oracles that are the kernel's own printout of the same state
_KERNEL_ORACLES = ("sysrq-t", "sysrq-l", "ftrace-stacktrace", "dump_backtrace")

#: the documented differences from an oracle (docs/arch-arm64.md, "Oracles")
CATEGORIES = {
    "stale": "the capture marked the oracle stale: the task ran between the dump and the printout",
    "vector": "the CPU stopped at an exception vector; complete mode adds the vector pc, gdb sees the "
              "normalised registers",
    "oracle-pac": "the oracle printed PAC-signed return addresses (gdb without the pauth registers)",
    "entry-or-leaf": "the oracle has the x30 caller of a function stopped at its entry or in a leaf, "
                     "which the kernel's method drops and complete mode could not prove",
    "oracle-trampoline": "the oracle shows return_to_handler or the kretprobe trampoline where the kernel "
                         "resolves the original return address (F / K)",
    "oracle-loop": "the oracle repeats a frame (no CFI for an asm trampoline such as return_to_handler); "
                   "compared up to the repetition",
    "oracle-stops-early": "the oracle stops inside the replay: no CFI (vectors, call_on_irq_stack, entry "
                          "code) or a PAC-signed return address it cannot strip",
    "oracle-continues": "the replay ended cleanly where the oracle goes on past the final record",
}


def _complete_why(f: Frame) -> str:
    """Why complete mode added ``f`` (``""``: a bare mark)."""
    return _COMPLETE_WHY.get(f.source, "")


def _is_call_word(word: int) -> bool:
    """BL, BLR, BLRAA/BLRAB, BLRAAZ/BLRABZ: the encodings of a call (Arm ARM C6.2 BL, BLR, BLRAA...)."""
    return (word & 0xFC000000 == 0x94000000                                   # BL imm26
            or word & 0xFFFFFC1F == 0xD63F0000                                # BLR Xn
            or word & 0xFFFFF800 == 0xD73F0800                                # BLRAA/BLRAB Xn, Xm
            or word & 0xFFFFF81F == 0xD63F081F)                               # BLRAAZ/BLRABZ Xn

class Arm64Backend(ArchBackend):
    """arm64: frame records at x29, PAC stripping, exception boundaries."""

    name = "arm64"
    aliases = ("aarch64",)
    elf_machine = "EM_AARCH64"
    e_machine = 183
    # struct user_pt_regs: x0..x30, sp, pc, pstate
    prstatus_regs = tuple(f"x{i}" for i in range(31)) + ("sp", "pc", "pstate")
    gdb_arch = "aarch64"
    fp_reg = "x29"
    gdb_registers = {"pstate": "cpsr"}
    pc_reg = "pc"
    sp_reg = "sp"
    # thread.cpu_context (x19..x28, fp, sp, pc); "caller" marks a walk started from a caller
    context_keys = frozenset({*(f"x{i}" for i in range(19, 29)), "fp", "sp", "pc", "caller"})
    capstone = ("CS_ARCH_ARM64", "CS_MODE_ARM")
    call_lengths = (4,)
    layouts = {"pt_regs": PT_REGS_MEMBERS}

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """BL and every BLR form (BLRAA, BLRAAZ, ...)."""
        return mnemonic == "bl" or mnemonic.startswith("blr")

    def call_site_length(self, text: Callable[[int, int], bytes | None], ret: int) -> int | None:
        """BL, BLR and the pointer-authenticating BLRAA/BLRAB/BLRAAZ/BLRABZ, from their encodings."""
        code = text(ret - 4, 4)
        return 4 if code is not None and _is_call_word(int.from_bytes(code, "little")) else None

    def no_call_site(self, text: Callable[[int, int], bytes | None], ret: int) -> bool:
        """Every instruction is 4 bytes: the word before ``ret`` is no call encoding, so none ends there."""
        code = text(ret - 4, 4)
        return code is not None and not _is_call_word(int.from_bytes(code, "little"))

    def frame_registers(self, frames: list[Frame], index: int, target: Target) -> dict[str, int]:
        """x29 and the return address of a frame record; every register of a ``pt_regs`` crossed."""
        from .caller_regs import frame_registers

        _, gen, layout = walk_constants(target)
        return frame_registers(frames, index, target, layout, gen.meta_records)

    def unwinder(self, target: Target) -> Unwinder:
        """``kunwind_stack_walk()`` of the dumped kernel's generation (v6.12 or v6.13+)."""
        return Arm64Unwinder(target)

    def batch_walk(self, jobs: "list[Job]") -> "Walked":
        """The plain frame-record step of every blocked task in lockstep (:mod:`.batch`)."""
        from . import batch

        return batch.batch_walk(jobs)

    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[TraceLine]:
        """``dump_backtrace()``: ``Call trace:`` then `` %pSb`` per frame; nothing for EL0 registers.

        From v6.13 each line ends with the source and recovery markers of
        ``dump_backtrace_entry()``: `` (P)``, `` (T)``, `` (C)``, `` (U)``,
        `` (F)``, `` (K)`` and their combinations such as `` (TF)``.
        Frames only complete mode adds carry a ``[complete: ...]`` mark.
        """
        regs = target.task.regs
        if regs is not None and user_mode(regs.get("pstate", 0)):  # `if (regs && user_mode(regs)) return;`
            return []
        markers = walk_generation(target).meta_records
        out = [TraceLine.header("Call trace:")]
        for f in frames:
            sym = f.symbol or self.symbolize(f, target)
            line = " " + sym
            if markers and not f.flags & Flag.COMPLETE:
                info = _SOURCE_LETTER.get(f.source, "U")
                info += ("F" if f.flags & Flag.FGRAPH else "") + ("K" if f.flags & Flag.KRETPROBE else "")
                if info:
                    line += f" ({info})"
            out.append(frame_line(f, sym, line, _complete_why))
        return out

    def translator(self, info: "VmcoreInfo", phys: "PhysReader",
                   symbol: Callable[[str], int | None]) -> mm.Arm64Translator:
        """The kernel's page tables and linear maps of a vmcore (:mod:`.mm`)."""
        return mm.translator(info, phys, symbol)

    # cpu_switch_to() (arch/arm64/kernel/entry.S) stores x19..x28, fp, sp and lr in thread.cpu_context
    def saved_regs(self, target: Target) -> SavedRegs | None:
        """``thread.cpu_context``: x19..x28, fp (x29), sp, and pc (the lr cpu_switch_to() returns to)."""
        return SavedRegs.of_context(target.task, CPU_CONTEXT, "task_struct.thread.cpu_context")

    def categorize(self, oracle: dict[str, Any], expected: list[int], replay: "Replay") -> str | None:
        """Name the documented category of a difference from an oracle (:data:`CATEGORIES`), else ``None``.

        gdb and drgn traces are first brought to the replay's terms: PAC stripped, a repeated frame
        (an unwinder looping on code without CFI) cut, and a trampoline address accepted where the
        replay resolved it; what remains must be equal, a prefix, or the replay with one x30 caller
        after a boundary frame, or must go on past a clean end.
        """
        if oracle.get("stale"):
            return "stale"
        if oracle.get("source") in _KERNEL_ORACLES:
            return None
        target = replay.target
        mask, _ = kernel_pac_mask(target.vmcoreinfo)
        want = [ptrauth_strip_kernel_insn_pac(pc, mask) for pc in expected]
        seen = {"pac"} if want != expected else set()
        loop = next((i for i in range(1, len(want)) if want[i] == want[i - 1]), None)
        if loop is not None:
            want = want[:loop]
            seen.add("loop")
        frames = replay.frames
        if frames and frames[0].source is Source.EXCEPTION_FRAME:
            frames = frames[1:]
            seen.add("vector")
        got = [f.pc for f in frames]
        trampolines = {target.symbol_address(n) for n in ("return_to_handler", "__kretprobe_trampoline",
                                                           "arch_rethook_trampoline")} - {None}
        for i, pc in enumerate(want):
            if pc in trampolines and i < len(frames) and frames[i].flags & (Flag.FGRAPH | Flag.KRETPROBE):
                want[i] = got[i]
                seen.add("trampoline")

        def within(w: list[int]) -> bool:  # equal, or the oracle stopped inside the replay
            return len(w) <= len(got) and got[:len(w)] == w

        if len(got) < len(want) and want[:len(got)] == got and replay.stop.clean:
            return "oracle-continues"
        if not within(want):
            for i in range(1, min(len(want), len(frames) + 1)):
                if frames[i - 1].flags & Flag.BOUNDARY and within(want[:i] + want[i + 1:]):
                    return "entry-or-leaf"
            return None
        for label in ("trampoline", "loop"):
            if label in seen:
                return f"oracle-{label}"
        if want != got:
            return "oracle-stops-early"
        return "vector" if "vector" in seen else "oracle-pac"
