"""Kernel traces printed on a console or in dmesg: their lines, frames and blocks.

The kernel prints a trace as lines of ``name+0xoff/0xsize`` (``%pS``/``%pB``), with a ``[module]`` or
``[module build-id]`` after a module's symbol, a ``? `` before an x86 stack-scan guess, a raw
``[<address>]`` before each frame on riscv, a bare ``0x...`` for code without a symbol, and since 7.x on
arm64 the source of each frame after it (``(P)``, ``(T)``, ``(F)``, ``(CF)``, ...). A line may carry
printk's prefixes: a log level (``<4>``), a timestamp (``[   12.345678]``), a caller id
(``[  T123]``/``[   C1]``), or a syslog line's ``host kernel:``.

:func:`parse_traces` splits text into :class:`PrintedTrace` blocks, each saying whose trace it is:

- ``task``: ``sched_show_task()``'s ``task:COMM state:S ... pid:N`` (sysrq-t, a hung task);
- ``nmi``: ``NMI backtrace for cpu N`` (sysrq-l, an RCU stall), printed from that CPU's registers;
- ``crash``: a ``CPU: N ... PID: M Comm: C`` line (``dump_stack()`` of a panic, an oops, a ``WARN``);
- ``trace``: a ``Call Trace:`` that nothing before it names.

:data:`SYMBOL` is the one pattern of a printed ``name+0xoff/0xsize``, shared with ``unwind decode``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

#: ``name+0xoff/0xsize``, then `` [module]`` or `` [module build-id]``, then an arm64 source marker `` (P)``
SYMBOL = (r"(?P<name>[^\s+()\[\]:<>]+)\+0x(?P<off>[0-9a-f]+)/0x(?P<size>[0-9a-f]+)"
          r"(?P<module> \[(?P<modname>[^\]\s]+)(?: [0-9a-f]+)?\])?(?P<info> \((?P<flags>[A-Z]+)\))?")
#: :data:`SYMBOL` anywhere in a line, with an x86 segment (``0010:``) before it
SYMBOL_RE = re.compile(r"(?P<segment>\b[0-9a-f]{4}:)?" + SYMBOL)

#: printk's prefixes: a syslog ``... kernel:``, a log level, a timestamp, a caller id (and the one space after)
_PREFIX = re.compile(r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: )?(?:<\d+>)?"
                     r"(?:\[\s*\d+\.\d+\](?:\[\s*[TC]\d+\])? ?)?")
#: a frame line: ``[<address>] `` (riscv) and ``? `` (a guess) before the symbol, nothing after it
_FRAME = re.compile(r"^\s*(?P<q>\? )?(?:\[<(?P<addr>[0-9a-f]+)>\]\s+)?" + SYMBOL + r"\s*$")
#: a frame without a symbol: a bare address (after riscv's ``[<address>]``)
_BARE = re.compile(r"^\s*(?P<q>\? )?(?:\[<[0-9a-f]+>\]\s+)?0x(?P<addr>[0-9a-f]+)\s*$")
#: ``RIP: 0010:name+0xoff/0xsize``, printed where an x86 trace crosses a ``pt_regs``
_RIP = re.compile(r"^RIP: [0-9a-f]{4}:" + SYMBOL)

#: sched_show_task(): ``task:%-15.15s state:%c ... pid:%-5d``
_TASK = re.compile(r"task:(?P<comm>.*?)\s+state:(?P<state>\S).*?\bpid:\s*(?P<pid>\d+)")
#: nmi_cpu_backtrace(): ``NMI backtrace for cpu %d`` (`` skipped: idling at ...`` prints no trace)
_NMI = re.compile(r"NMI backtrace for cpu (?P<cpu>\d+)(?P<skipped> skipped)?")
#: dump_stack_print_info(): ``CPU: %d UID: %u PID: %d Comm: %.20s ...`` (no ``UID:`` before 6.10)
_CPU = re.compile(r"\bCPU: (?P<cpu>\d+) (?:UID: \d+ )?PID: (?P<pid>\d+) Comm: (?P<comm>\S+(?: \S+)*?)"
                  r"(?= Kdump:| Not tainted| Tainted:|\s*$)")
#: what ends a block: sysrq-t's next sections, sysrq's own lines, the end of an oops or a panic
_END = re.compile(r"Showing busy workqueues|^Sched Debug|^runnable tasks:|^sysrq: |^---\[ end ")


def strip_prefix(line: str) -> str:
    """``line`` without printk's log level, timestamp and caller id (or a syslog line's ``host kernel:``)."""
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1)


@dataclass(frozen=True, slots=True)
class PrintedSymbol:
    """A printed ``name+0xoff/0xsize [module] (flags)``."""

    name: str
    offset: int
    size: int
    module: str | None = None
    #: the arm64 source marker's letters (``P``, ``CF``), empty when there is none
    flags: str = ""

    @classmethod
    def of_match(cls, m: re.Match[str]) -> "PrintedSymbol":
        """The symbol a :data:`SYMBOL` match holds."""
        return cls(m["name"], int(m["off"], 16), int(m["size"], 16), m["modname"], m["flags"] or "")

    @property
    def key(self) -> str:
        """What names the pc: ``name+0xoff``, with `` [module]`` for a module's symbol."""
        return f"{self.name}+{self.offset:#x}" + (f" [{self.module}]" if self.module else "")


@dataclass(frozen=True, slots=True)
class PrintedFrame:
    """One frame line of a printed trace."""

    #: the line's number in the text (from 1)
    line: int
    #: the line without its printk prefix
    text: str
    #: ``None`` for a bare address
    symbol: PrintedSymbol | None
    #: riscv's ``[<address>]``, or the bare address
    address: int | None
    #: printed with ``? ``: an x86 stack-scan guess, no frame of the kernel's walk
    guess: bool

    @property
    def key(self) -> str:
        """What names the pc: the symbol's ``name+0xoff`` or, without one, the address in hex."""
        if self.symbol is not None:
            return self.symbol.key
        assert self.address is not None
        return hex(self.address)

    def same_pc(self, other: "PrintedFrame") -> bool:
        """Do both lines print the same pc: equal addresses where both print one (riscv), else equal
        ``name+0xoff``."""
        if self.address is not None and other.address is not None:
            return self.address == other.address
        return self.key == other.key


def parse_frame(text: str, line: int = 0) -> PrintedFrame | None:
    """The frame ``text`` (a line without its prefix) prints, or ``None`` when it is no frame line."""
    b = _BARE.match(text)
    if b:
        return PrintedFrame(line, text, None, int(b["addr"], 16), bool(b["q"]))
    f = _FRAME.match(text)
    if not f:
        return None
    return PrintedFrame(line, text, PrintedSymbol.of_match(f), int(f["addr"], 16) if f["addr"] else None,
                        bool(f["q"]))


def parse_rip(text: str) -> PrintedSymbol | None:
    """The pc of an x86 ``RIP: 0010:name+0xoff/0xsize`` line, else ``None``."""
    m = _RIP.match(text)
    return PrintedSymbol.of_match(m) if m else None


class BlockKind(str, Enum):
    """Whose trace a block is, by the line that starts it."""

    TASK = "task"     # sched_show_task(): sysrq-t, a hung task
    NMI = "nmi"       # NMI backtrace for cpu N: sysrq-l, a stall
    CRASH = "crash"   # dump_stack() after a CPU: line: panic, oops, WARN
    TRACE = "trace"   # a Call Trace: nothing names


@dataclass(frozen=True, slots=True)
class RegsPc:
    """An x86 ``RIP:`` line inside a trace: the interrupted pc where the trace crosses a ``pt_regs``."""

    #: how many frames of the walk (no ``? `` guesses) were printed before it
    after: int
    symbol: PrintedSymbol
    line: int


@dataclass(slots=True)
class PrintedTrace:
    """One block of printed trace and whose it is."""

    kind: BlockKind
    #: the number of the line that starts it (from 1)
    line: int
    pid: int | None = None
    comm: str | None = None
    state: str | None = None
    cpu: int | None = None
    frames: list[PrintedFrame] = field(default_factory=list)
    regs_pcs: list[RegsPc] = field(default_factory=list)
    #: its lines without their prefixes, from the one that starts it
    lines: list[str] = field(default_factory=list)
    #: ``(line number, text)`` of each line that holds ``+0x`` but reads as no frame: a damaged console line
    damaged: list[tuple[int, str]] = field(default_factory=list)

    @property
    def reliable(self) -> list[PrintedFrame]:
        """The frames of the kernel's walk (the ``? `` guesses left out)."""
        return [f for f in self.frames if not f.guess]

    def who(self) -> str:
        """``pid 2 (kthreadd)``, ``cpu1 (pid 5 (sh))``, or ``a trace`` when nothing names it."""
        task = f"pid {self.pid} ({self.comm})" if self.pid is not None else None
        if self.kind is BlockKind.TASK or (self.cpu is None and task):
            return task or "a task"
        if self.cpu is not None:
            return f"cpu{self.cpu}" + (f" ({task})" if task else "")
        return "a trace"


def _add_line(block: PrintedTrace, text: str, number: int) -> None:
    """One line inside ``block``: a frame, a ``RIP:`` crossing, a damaged frame, or text."""
    block.lines.append(text)
    fr = parse_frame(text, number)
    if fr is not None:
        block.frames.append(fr)
        return
    rip = parse_rip(text)
    if rip is not None:
        after = len(block.reliable)
        if after:
            block.regs_pcs.append(RegsPc(after, rip, number))
    elif "+0x" in text:
        block.damaged.append((number, text.strip()))


def parse_traces(text: str) -> list[PrintedTrace]:
    """Every block of printed trace in console or dmesg ``text``, in order.

    A block runs from the line that starts it to the next such line, or to a line that ends it
    (``Showing busy workqueues``, ``sysrq:``, ``---[ end ...``); other lines in between are kept as its
    text. A ``CPU:`` line right after ``NMI backtrace for cpu N`` names that block's task.
    """
    out: list[PrintedTrace] = []
    cur: PrintedTrace | None = None
    for number, raw in enumerate(text.replace("\r", "").split("\n"), 1):
        line = strip_prefix(raw)
        m = _TASK.search(line)
        if m:
            cur = PrintedTrace(BlockKind.TASK, number, int(m["pid"]), m["comm"].strip(), m["state"])
            cur.lines.append(line)
            out.append(cur)
            continue
        n = _NMI.search(line)
        if n:
            cur = None if n["skipped"] else PrintedTrace(BlockKind.NMI, number, cpu=int(n["cpu"]), lines=[line])
            if cur is not None:
                out.append(cur)
            continue
        c = _CPU.search(line)
        if c:
            if cur is not None and cur.kind is BlockKind.NMI and cur.cpu == int(c["cpu"]) and not cur.frames:
                cur.pid, cur.comm = int(c["pid"]), c["comm"]
                cur.lines.append(line)
                continue
            cur = PrintedTrace(BlockKind.CRASH, number, int(c["pid"]), c["comm"], cpu=int(c["cpu"]), lines=[line])
            out.append(cur)
            continue
        if _END.search(line):
            cur = None
            continue
        if cur is None:
            if line.strip().lower() != "call trace:":
                continue
            cur = PrintedTrace(BlockKind.TRACE, number)
            out.append(cur)
        _add_line(cur, line, number)
    return out
