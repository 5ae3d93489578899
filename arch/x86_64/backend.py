"""The x86-64 backend as the core sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import capstone

from unwind.frame import Flag, Frame, Source
from unwind.image import ImageError
from unwind.memory import MemoryFault
from unwind.registry import ArchBackend
from unwind.symbols import SymbolTable
from unwind.target import Target
from unwind.walk import Stop, Unwinder

from .dumpstack import KIND_TYPES, STACK_TYPE_NAMES
from .orc import OrcTable, load_orc
from .structs import PT_REGS, PT_REGS_SIZE
from .unwind_orc import OrcUnwinder

if TYPE_CHECKING:
    from unwind.replay import Replay

_REGS_SOURCES = (Source.REGS_PC, Source.ORC_REGS, Source.ORC_REGS_PARTIAL)
#: show_opcodes(): 42 bytes before the ip, the byte at it, 21 after
PROLOGUE_SIZE, EPILOGUE_SIZE = 42, 21
#: pt_regs member -> NT_PRSTATUS (user_regs_struct) name
_PRSTATUS = {"r15": "r15", "r14": "r14", "r13": "r13", "r12": "r12", "bp": "rbp", "bx": "rbx", "r11": "r11",
             "r10": "r10", "r9": "r9", "r8": "r8", "ax": "rax", "cx": "rcx", "dx": "rdx", "si": "rsi",
             "di": "rdi", "orig_ax": "orig_rax", "ip": "rip", "cs": "cs", "flags": "eflags", "sp": "rsp", "ss": "ss"}


def orc_table(target: Target) -> OrcTable:
    """The ORC table of ``target.image``, decoded once per image (see :func:`load_orc`)."""
    image = target.image
    if image is None:
        raise ImageError("x86-64 replay needs the kernel image's ORC tables: give --vmlinux "
                         "(full, stripped or slim image of the dump's build-id)")
    return load_orc(image, target.release, target.options.orc_version, target.symbol_address)


#: the documented differences from an oracle (``unwind diff`` categories)
CATEGORIES = {
    "printed": "the kernel prints a pt_regs ip as a 'RIP:' line, not a trace line, and a rethook-hijacked "
               "return address as the trampoline (its printer does not recover rethook)",
    "stale": "the task ran between the capture and the oracle",
    "oracle-merged": "the console text lost a 'task:' header: the oracle block runs two tasks' traces together, "
                     "ours is its first part",
    "oracle-stops-early": "gdb stops at the first stack switch (IRQ, entry or exception stack)",
    "oracle-continues": "the oracle goes on past where the kernel stops (user-mode frames, garbage past entry code)",
}
_KERNEL_ORACLES = ("sysrq-t", "sysrq-l", "ftrace-stacktrace")


def printed_pcs(frames: list[Frame], target: Target) -> list[int]:
    """The addresses ``__show_trace_log_lvl()`` prints as reliable trace lines for these frames."""
    tramp = target.symbol_address("arch_rethook_trampoline")
    out = []
    for f in frames:
        if f.source in _REGS_SOURCES:
            continue
        out.append(tramp if f.flags & Flag.KRETPROBE and tramp is not None else f.pc)
    return out


def backtrace_symbol(symbols: SymbolTable | None, addr: int) -> str:
    """``%pB`` (``sprint_backtrace()``): look up ``addr - 1``, print the offset of ``addr``."""
    sym = symbols.lookup(addr - 1) if symbols is not None else None
    if sym is None or sym.offset >= sym.size:
        return hex(addr)
    return f"{sym.name}+{sym.offset + 1:#x}/{sym.size:#x}"


def plain_symbol(symbols: SymbolTable | None, addr: int) -> str:
    """``%pS``: ``name+off/size``, or the bare address outside every symbol."""
    sym = symbols.lookup(addr) if symbols is not None else None
    if sym is None or sym.offset >= sym.size:
        return hex(addr)
    return str(sym)


class X86_64Backend(ArchBackend):
    """x86-64: ORC tables, IRQ/entry/exception stacks."""

    name = "x86_64"
    elf_machine = "EM_X86_64"
    e_machine = 62
    # struct user_regs_struct
    prstatus_regs = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx",
                     "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base",
                     "gs_base", "ds", "es", "fs", "gs")
    pc_reg = "rip"
    sp_reg = "rsp"
    capstone = (capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    # call rel32 (5), call *%reg (2, 3 with REX), call *disp(%reg) (3..7), retpoline thunks are call rel32
    call_lengths = (2, 3, 4, 5, 6, 7)

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """CALL in any form."""
        return mnemonic.startswith("call")

    def unwinder(self, target: Target) -> Unwinder:
        """An ORC walk over the tables of ``target.image`` (full, stripped or slim)."""
        return OrcUnwinder(target, orc_table(target))

    def categorize(self, oracle: dict[str, Any], expected: list[int], replay: "Replay") -> str | None:
        """Name the documented category of a difference from an oracle (:data:`CATEGORIES`), else ``None``."""
        if oracle.get("stale"):
            return "stale"
        frames = [f for f in replay.frames if f.reliable]
        got = [f.pc for f in frames]
        if oracle.get("source") in _KERNEL_ORACLES:
            printed = printed_pcs(frames, replay.target)
            if printed == expected:
                return "printed"
            if (got and len(expected) > len(printed) and expected[:len(printed)] == printed
                    and expected[len(printed)] == printed[0] and replay.stop.clean):
                return "oracle-merged"
            return None
        if len(expected) < len(got) and got[:len(expected)] == expected:
            return "oracle-stops-early"
        if len(got) < len(expected) and expected[:len(got)] == got and replay.stop.clean:
            return "oracle-continues"
        return None

    def symbolize(self, frame: Frame, target: Target) -> str:
        """``%pS`` for a pc from pt_regs (the ``RIP:`` line), ``%pB`` for return addresses."""
        if frame.source in _REGS_SOURCES:
            return plain_symbol(target.symbols, frame.pc)
        return backtrace_symbol(target.symbols, frame.pc)

    # show_regs() / __show_trace_log_lvl() (dumpstack.c), without the '?' stack-scan lines
    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[tuple[str, Frame | None]]:
        """The trace as x86 prints it: regs blocks, ``Call Trace:``, ``<TASK>``/``<IRQ>``/``<NMI>`` markers."""
        out: list[tuple[str, Frame | None]] = []
        if frames and frames[0].source is Source.REGS_PC and target.task.regs is not None:
            regs = {k: target.task.regs.get(v, 0) for k, v in _PRSTATUS.items()}
            out += self._paired(self._regs_lines(regs, False, target), frames[0])
        out.append(("Call Trace:", None))
        open_name: str | None = None
        for f in frames:
            if f.source is Source.REGS_PC:
                continue
            name = STACK_TYPE_NAMES.get(KIND_TYPES.get(f.stack or "", 0))
            if name != open_name:
                if open_name:
                    out.append((f" </{open_name}>", None))
                if name:
                    out.append((f" <{name}>", None))
                open_name = name
            if f.source in _REGS_SOURCES:
                extra = f.extra or {}
                out += self._paired(self._pt_regs_lines(f, extra.get("regs"), bool(extra.get("partial")), target), f)
            else:
                out += self._trace_lines(f, target)
            user = (f.extra or {}).get("user_regs")
            if user is not None:
                out += [(line, None) for line in self._pt_regs_lines(None, user, False, target)]
        if open_name:
            out.append((f" </{open_name}>", None))
        return out

    @staticmethod
    def _paired(lines: list[str], frame: Frame) -> list[tuple[str, Frame | None]]:
        """A regs block: the ``RIP:`` line stands for the frame, the rest are plain lines."""
        return [(line, frame if i == 0 else None) for i, line in enumerate(lines)]

    def _trace_lines(self, f: Frame, target: Target) -> list[tuple[str, Frame | None]]:
        """``printk_stack_address()``: ``? return_to_handler`` before an fgraph-recovered address, and the
        rethook trampoline where the kernel's printer (which does not recover it) shows it."""
        out: list[tuple[str, Frame | None]] = []
        q = "" if f.reliable else "? "
        if f.flags & Flag.FGRAPH:
            rth = target.symbol_address("return_to_handler")
            if rth is not None:
                out.append((f" ? {backtrace_symbol(target.symbols, rth)}", None))
        if f.flags & Flag.KRETPROBE:
            tramp = target.symbol_address("arch_rethook_trampoline")
            if tramp is not None:
                out.append((f" {q}{backtrace_symbol(target.symbols, tramp)}", f))
                return out
        out.append((f" {q}{f.symbol or self.symbolize(f, target)}", f))
        return out

    def _pt_regs_lines(self, f: Frame | None, addr: int | None, partial: bool, target: Target) -> list[str]:
        """``show_regs_if_on_stack()`` for a ``pt_regs`` in memory (IRET frame only when ``partial``)."""
        names = [sc.name for sc in PT_REGS.subcons]
        try:
            if addr is None:
                raise MemoryFault(0, PT_REGS_SIZE)
            raw = target.mem.read(addr, PT_REGS_SIZE) if not partial else \
                bytes(128) + target.mem.read(addr + 128, PT_REGS_SIZE - 128)
            regs = dict(PT_REGS.parse(raw))
        except MemoryFault:
            return [f"RIP: {f.symbol or self.symbolize(f, target)}"] if f is not None else []
        return self._regs_lines({n: regs[n] for n in names}, partial, target)

    def _regs_lines(self, r: dict[str, int], partial: bool, target: Target) -> list[str]:
        """``__show_regs(SHOW_REGS_SHORT)`` or, for an IRET frame, ``show_iret_regs()``."""
        user = bool(r["cs"] & 3)
        sym = hex(r["ip"]) if user else plain_symbol(target.symbols, r["ip"])
        lines = [f"RIP: {r['cs'] & 0xFFFF:04x}:{sym}"]
        code = None if user or target.image is None else target.image.text(r["ip"] - PROLOGUE_SIZE, PROLOGUE_SIZE + 1 + EPILOGUE_SIZE)
        if code is not None:
            lines.append(f"Code: {code[:PROLOGUE_SIZE].hex(' ')} <{code[PROLOGUE_SIZE]:02x}> "
                         f"{code[PROLOGUE_SIZE + 1:].hex(' ')}")
        rsp = f"RSP: {r['ss'] & 0xFFFF:04x}:{r['sp']:016x} EFLAGS: {r['flags']:08x}"
        if partial:
            return lines + [rsp]
        if r["orig_ax"] != 2**64 - 1:
            rsp += f" ORIG_RAX: {r['orig_ax']:016x}"
        lines.append(rsp)
        for row in (("ax", "bx", "cx"), ("dx", "si", "di"), ("bp", "r8", "r9"), ("r10", "r11", "r12"),
                    ("r13", "r14", "r15")):
            lines.append(" ".join(f"{_REG_LABEL[n]}: {r[n]:016x}" for n in row))
        return lines


_REG_LABEL = {"ax": "RAX", "bx": "RBX", "cx": "RCX", "dx": "RDX", "si": "RSI", "di": "RDI", "bp": "RBP",
              "r8": "R08", "r9": "R09", "r10": "R10", "r11": "R11", "r12": "R12", "r13": "R13", "r14": "R14",
              "r15": "R15"}
