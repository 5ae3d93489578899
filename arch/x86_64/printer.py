"""The x86 trace printer: ``show_regs()``, ``__show_trace_log_lvl()`` and friends (``dumpstack.c``).

The kernel does not print the unwinder's frames one by one: it scans every
word of each stack it visits (starting at the walk's first sp, then each
stack's ``next_sp``), prints every kernel-text word, and marks ``? `` the
words that are not the unwinder's current return-address slot; reaching that
slot prints it plainly and steps the unwinder. A ``pt_regs`` the unwinder
steps through is printed as a register block (``RIP: 0010:...``), and its ip
slot is skipped. This module replays that printer over a finished walk: the
frames give the unwinder's successive states, captured memory gives the words.

Kernel text for the scan is what the unwinder takes as text (``_stext.._etext``,
init text, the module area, where ftrace trampolines live too) plus the pcs the
walk itself reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from unwind.core.frame import Flag, Frame, Source
from unwind.core.memory import MemoryFault
from unwind.kernel.symbols import SymbolTable
from unwind.core.target import Target
from unwind.core.trace import LineKind, TraceLine, frame_line

from .dumpstack import StackFinder
from .unwind_orc import MODULES_RANGE
from .structs import IRET_FRAME_OFFSET, PT_REGS, PT_REGS_SIZE

PAGE_SIZE = 4096
#: show_opcodes(): 42 bytes before the ip, the byte at it, 21 after
PROLOGUE_SIZE, EPILOGUE_SIZE = 42, 21
REGS_SOURCES = (Source.REGS_PC, Source.ORC_REGS, Source.ORC_REGS_PARTIAL)
#: pt_regs member -> NT_PRSTATUS (user_regs_struct) name
PRSTATUS_NAMES = {"r15": "r15", "r14": "r14", "r13": "r13", "r12": "r12", "bp": "rbp", "bx": "rbx",
                  "r11": "r11", "r10": "r10", "r9": "r9", "r8": "r8", "ax": "rax", "cx": "rcx", "dx": "rdx",
                  "si": "rsi", "di": "rdi", "orig_ax": "orig_rax", "ip": "rip", "cs": "cs", "flags": "eflags",
                  "sp": "rsp", "ss": "ss"}
_LABEL = {"ax": "RAX", "bx": "RBX", "cx": "RCX", "dx": "RDX", "si": "RSI", "di": "RDI", "bp": "RBP",
          "r8": "R08", "r9": "R09", "r10": "R10", "r11": "R11", "r12": "R12", "r13": "R13", "r14": "R14",
          "r15": "R15"}

Lines = list[TraceLine]


def _complete_why(f: Frame) -> str:
    """Why complete mode added ``f``: what its walk says, else ``complete mode``."""
    return str((f.extra or {}).get("complete", "complete mode"))


def backtrace_symbol(symbols: SymbolTable | None, addr: int) -> str:
    """``%pB`` (``sprint_backtrace()``): look up ``addr - 1``, print the offset of ``addr``."""
    sym = symbols.lookup(addr - 1) if symbols is not None else None
    if sym is None or sym.offset >= sym.size:
        return hex(addr)
    return f"{sym.name}+{sym.offset + 1:#x}/{sym.size:#x}{sym.suffix}"


def plain_symbol(symbols: SymbolTable | None, addr: int) -> str:
    """``%pS``: ``name+off/size``, or the bare address outside every symbol."""
    sym = symbols.lookup(addr) if symbols is not None else None
    if sym is None or sym.offset >= sym.size:
        return hex(addr)
    return str(sym)


# __show_regs(SHOW_REGS_SHORT) (process_64.c), show_iret_regs() and show_opcodes() (dumpstack.c)
def regs_lines(r: dict[str, int], partial: bool, target: Target, frame: Frame | None = None) -> Lines:
    """A register block: ``RIP:``, ``Code:`` (kernel text in the image), ``RSP:``, then the GPRs.

    ``frame`` is the walk's frame whose pc the ``RIP:`` line prints.
    """
    user = bool(r["cs"] & 3)
    ip_text = hex(r["ip"]) if user else plain_symbol(target.symbols, r["ip"])
    lines = [TraceLine.regs(f"RIP: {r['cs'] & 0xFFFF:04x}:{ip_text}", {"cs": r["cs"] & 0xFFFF, "ip": r["ip"]},
                            frame, symbol=ip_text)]
    code = None if user or target.image is None else \
        target.image.text(r["ip"] - PROLOGUE_SIZE, PROLOGUE_SIZE + 1 + EPILOGUE_SIZE)
    if code is not None:
        before, at, after = code[:PROLOGUE_SIZE].hex(" "), f"{code[PROLOGUE_SIZE]:02x}", code[PROLOGUE_SIZE + 1:].hex(" ")
        lines.append(TraceLine(f"Code: {before} <{at}> {after}", LineKind.CODE, None,
                               {"ip": r["ip"], "before": before, "at": at, "after": after}))
    rsp = f"RSP: {r['ss'] & 0xFFFF:04x}:{r['sp']:016x} EFLAGS: {r['flags']:08x}"
    shown = {"ss": r["ss"] & 0xFFFF, "sp": r["sp"], "flags": r["flags"]}
    if partial:
        return lines + [TraceLine.regs(rsp, shown)]
    if r["orig_ax"] != 2**64 - 1:
        rsp += f" ORIG_RAX: {r['orig_ax']:016x}"
        shown["orig_ax"] = r["orig_ax"]
    lines.append(TraceLine.regs(rsp, shown))
    for row in (("ax", "bx", "cx"), ("dx", "si", "di"), ("bp", "r8", "r9"), ("r10", "r11", "r12"),
                ("r13", "r14", "r15")):
        lines.append(TraceLine.regs(" ".join(f"{_LABEL[n]}: {r[n]:016x}" for n in row), {n: r[n] for n in row}))
    return lines


def text_ranges(target: Target) -> list[tuple[int, int]]:
    """``[_stext, _etext)``, ``[_sinittext, _einittext)`` and the module area, as far as symbols tell."""
    out = [MODULES_RANGE]
    for lo, hi in (("_stext", "_etext"), ("_sinittext", "_einittext")):
        a, b = target.symbol_address(lo), target.symbol_address(hi)
        if a is not None and b is not None:
            out.append((a, b))
    return out


def cpu_regs(target: Target) -> dict[str, int]:
    """The running CPU's registers as ``pt_regs`` members."""
    regs = target.task.regs or {}
    return {k: regs.get(v, 0) for k, v in PRSTATUS_NAMES.items()}


def pt_regs_at(target: Target, addr: int, partial: bool) -> dict[str, int] | None:
    """A ``pt_regs`` (only its IRET frame when ``partial``) from captured memory."""
    try:
        if partial:
            raw = bytes(IRET_FRAME_OFFSET) + target.mem.read(addr + IRET_FRAME_OFFSET,
                                                             PT_REGS_SIZE - IRET_FRAME_OFFSET)
        else:
            raw = target.mem.read(addr, PT_REGS_SIZE)
    except MemoryFault:
        return None
    parsed = PT_REGS.parse(raw)
    return {sc.name: parsed[sc.name] for sc in PT_REGS.subcons}


@dataclass(slots=True)
class _State:
    """One unwinder state as the printer sees it: the frame, its return-address slot, its entry regs."""

    frame: Frame | None
    ret_addr_p: int | None
    regs: int | None = None
    partial: bool = False


def _states(frames: list[Frame]) -> list[_State]:
    """``unwind_get_return_address_ptr()`` / ``unwind_get_entry_regs()`` of each state after the start."""
    out = []
    for f in frames:
        extra = f.extra or {}
        if f.source in (Source.ORC_REGS, Source.ORC_REGS_PARTIAL) and f.pt_regs is not None:
            out.append(_State(f, f.pt_regs + IRET_FRAME_OFFSET, f.pt_regs, f.source is Source.ORC_REGS_PARTIAL))
        elif f.sp is not None:
            out.append(_State(f, f.sp - 8))
        if extra.get("user_regs") is not None:  # the walk's last state: user-mode regs, then done
            out.append(_State(None, extra["user_regs"] + IRET_FRAME_OFFSET, extra["user_regs"]))
    return out


class TracePrinter:
    """``__show_trace_log_lvl()`` over a finished walk."""

    def __init__(self, frames: list[Frame], target: Target) -> None:
        self.frames = frames
        self.target = target
        self.symbols = target.symbols
        running = bool(frames) and frames[0].source is Source.REGS_PC
        # unwind_start(): with regs, the regs frame is skipped at once (show_regs() printed it)
        self.states = _states(frames[1:] if running else frames)
        self.k = 0
        self.out: Lines = []
        self.text = text_ranges(target)
        self.walked = {f.pc for f in frames}
        self.rth = target.symbol_address("return_to_handler")
        if running:
            self.start = (target.task.regs or {}).get("rsp", 0)
        else:
            self.start = (target.task.context or {}).get("sp", 0)

    def kernel_text(self, addr: int) -> bool:
        """``__kernel_text_address()`` as far as the replay knows it."""
        return any(lo <= addr < hi for lo, hi in self.text) or addr in self.walked

    def state(self) -> _State | None:
        return self.states[self.k] if self.k < len(self.states) else None

    # __show_trace_log_lvl() (dumpstack.c:186-306): the loop over stacks
    def print_trace(self) -> Lines:
        """``Call Trace:``, then each visited stack between its ``<NAME>`` markers."""
        self.out.append(TraceLine.header("Call Trace:"))
        finder = StackFinder(self.target.task.stacks, self.target.mem)
        mask = [0]
        stack = self.start
        while stack:
            stack &= ~7  # PTR_ALIGN()
            info = finder.get_stack_info(stack, mask)
            if info is None:  # a guard page: try one page up
                stack = (stack + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
                info = finder.get_stack_info(stack, mask)
                if info is None:
                    break
            if info.name:
                self.out.append(TraceLine.marker(f" <{info.name}>", info.name, "begin"))
            self.show_regs_if_on_stack(info.begin, info.end)
            # the scan reads only what was captured: an uncaptured word is never kernel text
            for start, end in self.target.mem.captured(stack, info.end):
                for addr in range(start + (stack - start) % 8, end - 7, 8):
                    self.scan_word(addr, info.begin, info.end)
            if info.name:
                self.out.append(TraceLine.marker(f" </{info.name}>", info.name, "end"))
            stack = info.next_sp or 0
        for st in self.states[self.k:]:
            if st.frame is not None:
                sym = backtrace_symbol(self.symbols, st.frame.pc)
                self.out.append(TraceLine.of_frame(f" [not reached by the stack scan] {sym}", st.frame,
                                                   st.frame.pc, sym))
        return self.out

    # dumpstack.c:251-287, printk_stack_address() (68-73)
    def scan_word(self, addr: int, begin: int, end: int) -> None:
        """One word of the scan: skip non-text, print ``? `` guesses, print and step at the unwinder's slot."""
        try:
            word = self.target.mem.read_u64(addr)
        except MemoryFault:
            return
        if not self.kernel_text(word):
            return
        st = self.state()
        if st is not None and st.regs is not None and addr == st.regs + IRET_FRAME_OFFSET:
            self.step(begin, end)  # regs->ip was printed in the register block
            return
        if st is not None and addr == st.ret_addr_p and st.frame is not None:
            f = st.frame
            if f.flags & Flag.FGRAPH:
                self._guess(word)
                sym = backtrace_symbol(self.symbols, f.pc)
                self.out.append(TraceLine.of_frame(f" {self._q(f)}{sym}", f, f.pc, sym))
            elif f.flags & Flag.COMPLETE:  # complete mode's frame: never printed by a kernel, so marked
                sym = backtrace_symbol(self.symbols, f.pc)
                self.out.append(frame_line(f, sym, f" {sym}", _complete_why))
            else:  # a rethook-hijacked slot prints the trampoline: the printer does not recover rethook
                sym = backtrace_symbol(self.symbols, word)
                self.out.append(TraceLine.of_frame(f" {self._q(f)}{sym}", f, word, sym))
            self.step(begin, end)
            return
        real = self._fgraph_guess(word, addr)
        if real != word:
            self._guess(word)
        self._guess(real)

    def _guess(self, addr: int) -> None:
        """A ``? `` line: a text address on the stack that is not the unwinder's slot."""
        sym = backtrace_symbol(self.symbols, addr)
        self.out.append(TraceLine.guess(f" ? {sym}", addr, sym))

    @staticmethod
    def _q(f: Frame) -> str:
        return "" if f.reliable else "? "

    def _fgraph_guess(self, word: int, retp: int) -> int:
        """``ftrace_graph_ret_addr()`` for a scanned word that is ``return_to_handler``."""
        if word != self.rth:
            return word
        for e in reversed(self.target.task.fgraph):
            if e.retp == retp and e.ret != word:
                return e.ret
        return word

    # dumpstack.c:289-300
    def step(self, begin: int, end: int) -> None:
        """``unwind_next_frame()``, then print the new state's entry regs if they are on this stack."""
        self.k += 1
        self.show_regs_if_on_stack(begin, end)

    # show_regs_if_on_stack() (dumpstack.c:154-178)
    def show_regs_if_on_stack(self, begin: int, end: int) -> None:
        """The current state's ``pt_regs`` (or IRET frame) when it lies on the stack being printed."""
        st = self.state()
        if st is None or st.regs is None:
            return
        lo = st.regs + (IRET_FRAME_OFFSET if st.partial else 0)
        if not (begin <= lo and st.regs + PT_REGS_SIZE <= end):
            return
        regs = pt_regs_at(self.target, st.regs, st.partial)
        if regs is None:
            return
        self.out.extend(regs_lines(regs, st.partial, self.target, st.frame))


def captured_sysregs(target: Target) -> dict[str, int]:
    """The system registers the capture recorded for the task's CPU (MSRs, control registers)."""
    cpu = target.info.cpu(target.task.running_cpu)
    return dict(cpu.sysregs) if cpu is not None else {}


# __show_regs(SHOW_REGS_USER) (process_64.c): the line after the general registers
def user_system_regs_lines(target: Target) -> Lines:
    """``FS:`` / ``GS:`` of a CPU in user mode: MSR_FS_BASE and, read after the kernel's swapgs,
    MSR_KERNEL_GS_BASE, which then holds the user GS base (the captured GS_BASE while still in user mode)."""
    sysregs = captured_sysregs(target)
    if "fs_base" not in sysregs or "gs_base" not in sysregs:
        return []
    fs, gs = sysregs["fs_base"], sysregs["gs_base"]
    return [TraceLine.regs(f"FS:  {fs:016x} GS:  {gs:016x}", {"fs_base": fs, "gs_base": gs})]


# __show_regs(SHOW_REGS_ALL) (process_64.c): the lines after the general registers
def system_regs_lines(target: Target) -> Lines:
    """``FS:``/``CS:``/``CR2:`` lines from the CPU's captured system registers (none when not captured).

    The debug registers are left out: they print only in a non-default state, which a capture
    does not record.
    """
    sysregs = captured_sysregs(target)
    need = ("fs_base", "gs_base", "k_gs_base", "cr0", "cr2", "cr3", "cr4")
    if not all(k in sysregs for k in need):
        return []
    r = target.task.regs or {}
    seg = {k: r.get(k, 0) & 0xFFFF for k in ("fs", "gs", "ds", "es", "cs")}
    return [TraceLine.regs(f"FS:  {sysregs['fs_base']:016x}({seg['fs']:04x}) GS:{sysregs['gs_base']:016x}"
                           f"({seg['gs']:04x}) knlGS:{sysregs['k_gs_base']:016x}",
                           {"fs_base": sysregs["fs_base"], "fs": seg["fs"], "gs_base": sysregs["gs_base"],
                            "gs": seg["gs"], "k_gs_base": sysregs["k_gs_base"]}),
            TraceLine.regs(f"CS:  {seg['cs']:04x} DS: {seg['ds']:04x} ES: {seg['es']:04x} CR0: {sysregs['cr0']:016x}",
                           {"cs": seg["cs"], "ds": seg["ds"], "es": seg["es"], "cr0": sysregs["cr0"]}),
            TraceLine.regs(f"CR2: {sysregs['cr2']:016x} CR3: {sysregs['cr3']:016x} CR4: {sysregs['cr4']:016x}",
                           {"cr2": sysregs["cr2"], "cr3": sysregs["cr3"], "cr4": sysregs["cr4"]})]


def show_trace(frames: list[Frame], target: Target) -> Lines:
    """``show_regs()`` for a running task's CPU registers, then ``show_trace_log_lvl()``.

    A CPU in user mode prints its registers only (``SHOW_REGS_USER``, no ``Code:`` since the
    dump holds no user text) and no ``Call Trace:``, as ``show_regs()`` does. In kernel mode
    ``__show_regs()`` prints the registers before the walk starts, so a walk that gives no frame
    (a CPU caught mid-switch, a stack the dump lacks) still has them above its ``Call Trace:``.
    """
    regs = cpu_regs(target) if target.task.regs is not None else None
    if regs is not None and regs["cs"] & 3:
        return regs_lines(regs, False, target) + user_system_regs_lines(target)
    out: Lines = []
    if regs is not None and (not frames or frames[0].source is Source.REGS_PC):
        out += regs_lines(regs, False, target, frames[0] if frames else None) + system_regs_lines(target)
    return out + TracePrinter(frames, target).print_trace()
