"""The x86-64 backend as the core sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from unwind.core.callsite import CallSiteChecker
from unwind.core.frame import Flag, Frame
from unwind.core.registry import ArchBackend
from unwind.core.target import SavedRegs, Target
from unwind.core.trace import TraceLine
from unwind.core.walk import Stop, StopReason, Unwinder

from . import kernel, mm
from .mm import X86_64Translator
from .orc import orc_table
from .printer import REGS_SOURCES, backtrace_symbol, plain_symbol, show_trace
from .structs import INACTIVE_TASK_FRAME_MEMBERS, PT_REGS_MEMBERS
from .unwind_orc import MODULES_RANGE, OrcUnwinder

if TYPE_CHECKING:
    import random
    from collections.abc import Sequence

    from unwind.session.batch import Job, Walked
    from unwind.formats.image import Image
    from unwind.session.replay import Replay
    from unwind.formats.vmcore.virtual import PhysReader
    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo


#: the documented differences from an oracle (``unwind diff`` categories)
CATEGORIES = {
    "printed": "the kernel prints a pt_regs ip as a 'RIP:' line, not a trace line, and a rethook-hijacked "
               "return address as the trampoline (its printer does not recover rethook)",
    "stale": "the task ran between the capture and the oracle",
    "ftrace-trampoline": "our walk stops at a dynamic ftrace trampoline the dump does not list (orc_ftrace_find() "
                         "needs ftrace_trampolines); up to there it prints what the kernel printed",
    "oracle-merged": "the console text lost a 'task:' header: the oracle block runs two tasks' traces together, "
                     "ours is its first part",
    "oracle-stops-early": "gdb stops at the first stack switch (IRQ, entry or exception stack)",
    "oracle-no-fgraph": "gdb cannot unwind through return_to_handler: it shows the hijacked slot and stops, or "
                        "guesses past the trampoline's asm; it does not read the function-graph return stack",
    "oracle-tail-call": "gdb reports a pc that follows no call (a tail call's jmp: the kernel's stack has no such "
                        "frame); without those its frames are ours, or a prefix of ours",
    "switching": "the CPU's sp is on no stack of the task recorded as current (a context switch in progress): "
                 "get_stack_info() refuses it, as the kernel would",
    "oracle-continues": "the oracle goes on past where the kernel stops (user-mode frames, garbage past entry code)",
}
_KERNEL_ORACLES = ("sysrq-t", "sysrq-l", "ftrace-stacktrace")


def printed_pcs(frames: list[Frame], target: Target) -> list[int]:
    """The addresses ``__show_trace_log_lvl()`` prints as reliable trace lines for these frames."""
    tramp = target.symbol_address("arch_rethook_trampoline")
    out = []
    for f in frames:
        if f.source in REGS_SOURCES:
            continue
        out.append(tramp if f.flags & Flag.KRETPROBE and tramp is not None else f.pc)
    return out


class X86_64Backend(ArchBackend):
    """x86-64: ORC tables, IRQ/entry/exception stacks."""

    name = "x86_64"
    aliases = ("x86", "x86-64", "amd64")
    options = frozenset({"orc_version"})
    image_required = "x86-64 walks read the image's ORC tables (.orc_unwind_ip/.orc_unwind)"
    elf_machine = "EM_X86_64"
    e_machine = 62
    # struct user_regs_struct
    prstatus_regs = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
                     "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
                     "gs_base", "ds", "es", "fs", "gs")
    gdb_arch = "i386:x86-64"
    fp_reg = "rbp"
    pc_reg = "rip"
    sp_reg = "rsp"
    # thread.sp, and the inactive_task_frame members above it
    context_keys = frozenset({"sp", "bp", "ip"})
    min_frame_bytes = 8  # a return address alone: ORC frames without a saved register (sp_offset 8)
    capstone = ("CS_ARCH_X86", "CS_MODE_64")
    # call rel32 (5), call *%reg (2, 3 with REX), call *disp(%reg) (3..7), retpoline thunks are call rel32
    call_lengths = (2, 3, 4, 5, 6, 7)
    layouts = {"pt_regs": PT_REGS_MEMBERS, "inactive_task_frame": INACTIVE_TASK_FRAME_MEMBERS}

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """CALL in any form."""
        return mnemonic.startswith("call")

    def call_site_length(self, text: Callable[[int, int], bytes | None], ret: int) -> int | None:
        """``call rel32`` (``E8``) when no shorter call can end at ``ret``: a near or far indirect
        call is ``FF /2`` or ``FF /3`` and a direct one ``E8``, so the four offset bytes must hold
        no ``E8`` and no ``FF`` whose next byte's reg field is 2 or 3."""
        code = text(ret - 5, 5)
        if code is None or code[0] != 0xE8 or 0xE8 in code[1:]:
            return None
        for i in range(1, 4):
            if code[i] == 0xFF and (code[i + 1] >> 3) & 7 in (2, 3):
                return None
        return 5

    def frame_registers(self, frames: list[Frame], index: int, target: Target) -> dict[str, int]:
        """rip, rsp and rbp of an ORC frame; the registers of a ``pt_regs`` crossed."""
        from .caller_regs import frame_registers

        return frame_registers(frames, index, target)

    def unwinder(self, target: Target) -> Unwinder:
        """An ORC walk over the tables of ``target.image`` (full, stripped or slim)."""
        return OrcUnwinder(target, target.per_dump("x86_64.orc", orc_table))

    def batch_walk(self, jobs: "list[Job]") -> "Walked":
        """The plain ORC CALL step of every blocked task in lockstep (:mod:`.batch`)."""
        from . import batch

        return batch.batch_walk(jobs)

    def translator(self, info: "VmcoreInfo", phys: "PhysReader",
                   symbol: Callable[[str], int | None]) -> X86_64Translator:
        """The kernel's page tables and linear maps of a vmcore (:mod:`.mm`)."""
        return mm.translator(info, phys, symbol)

    def saved_regs(self, target: Target) -> SavedRegs | None:
        """``thread.sp`` and the ``struct inactive_task_frame`` at it: r15, r14, r13, r12, bx, bp, ret_addr."""
        return kernel.saved_regs(target)

    def categorize(self, oracle: dict[str, Any], expected: list[int], replay: "Replay") -> str | None:
        """Name the documented category of a difference from an oracle (:data:`CATEGORIES`), else ``None``."""
        if oracle.get("stale"):
            return "stale"
        frames = [f for f in replay.frames if f.reliable]
        got = [f.pc for f in frames]
        if oracle.get("source") in _KERNEL_ORACLES:
            # the oracle keeps the reliable 'sym+off/size' lines: not the bare addresses the kernel prints
            symbols = replay.target.symbols
            printed = printed_pcs(frames, replay.target)
            named = [pc for pc in printed if backtrace_symbol(symbols, pc) != hex(pc)]
            if expected in (printed, named):
                return "printed"
            printed = named if expected[:len(named)] == named else printed
            if (got and printed and len(expected) > len(printed) and expected[:len(printed)] == printed
                    and expected[len(printed)] == printed[0] and replay.stop.clean):
                return "oracle-merged"
            last = replay.frames[-1] if replay.frames else None
            if (last is not None and not replay.stop.clean and MODULES_RANGE[0] <= last.pc < MODULES_RANGE[1]
                    and not replay.target.info.ftrace_trampolines and expected[:len(printed)] == printed):
                return "ftrace-trampoline"
            return None
        if not replay.frames and replay.task.running and (replay.stop.reason is StopReason.OUTSIDE_STACK
                                                          or "switching_to" in replay.task.extra):
            return "switching"
        return self._categorize_debugger(expected, got, replay)

    def _categorize_debugger(self, expected: list[int], got: list[int], replay: "Replay") -> str | None:
        """gdb/drgn: drop what they report and the kernel cannot (tail-call sites, return_to_handler)."""
        want, category = list(expected), None
        rth = replay.target.symbol_address("return_to_handler")
        sym = replay.target.symbols.lookup(rth) if rth is not None and replay.target.symbols else None
        inside = [i for i, pc in enumerate(want) if i and sym is not None and rth <= pc < rth + sym.size]
        if inside:  # the hijacked slot itself, or gdb's guess past the asm it cannot unwind
            i = inside[0]
            want, category = want[:i] if want[i] == rth else want[:i + 1], "oracle-no-fgraph"
        sites = CallSiteChecker(self, replay.target.image)
        # a pc the ORC walk reports too is no tail-call artifact, whatever the file's (unpatched) text says
        walked = set(got)
        kept = want[:1] + [pc for pc in want[1:] if pc in walked or sites.check(pc).status != "bad"]
        if kept != want:
            want, category = kept, "oracle-tail-call"
        if want == got:
            return category
        if len(want) < len(got) and got[:len(want)] == want:
            return category or "oracle-stops-early"
        if len(got) < len(want) and want[:len(got)] == got and replay.stop.clean:
            return category or "oracle-continues"
        return None

    def fuzz_image(self, rng: "random.Random", image: "Image", release: str | None,
                   words: "Sequence[int]") -> Callable[[], None] | None:
        """Corrupt ORC entries the next walks look up, or parse a mutated window (:mod:`.fuzz`)."""
        from .fuzz import mutate_orc

        return mutate_orc(rng, image, release, words)

    def symbolize(self, frame: Frame, target: Target) -> str:
        """``%pS`` for a pc from pt_regs (the ``RIP:`` line), ``%pB`` for return addresses."""
        if frame.source in REGS_SOURCES:
            return plain_symbol(target.symbols, frame.pc)
        return backtrace_symbol(target.symbols, frame.pc)

    # show_regs() / show_trace_log_lvl() (dumpstack.c)
    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[TraceLine]:
        """The trace as x86 prints it: the stack scan with ``? `` guesses, markers and register blocks."""
        return show_trace(frames, target)
