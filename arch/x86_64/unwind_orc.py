"""The ORC unwinder: ``arch/x86/kernel/unwind_orc.c`` (v6.12), one function per step.

``struct unwind_state`` is the :class:`OrcUnwinder` itself (``ip sp bp signal
error regs prev_regs full_regs stack_info stack_mask graph_idx kr_cur``). The
kernel's one long ``unwind_next_frame()`` is split into named steps, each
citing the lines it follows; ``goto err`` becomes an :class:`UnwindStop` with
a non-clean reason, ``goto the_end`` a clean one.

The walk reports what ``arch_stack_walk()`` consumes: a running task's
``regs->ip`` first, then every ``unwind_get_return_address()``. After the
frame-pointer guess (no ORC entry) every frame is flagged unreliable, as
``state->error`` makes ``arch_stack_walk_reliable()`` fail.
"""

from __future__ import annotations

import bisect
import struct
import weakref
from functools import partial
from typing import Callable, Mapping, Sequence

from unwind.core.dumpinfo import ModuleInfo, ModuleOrc
from unwind.core.frame import FLAGS as _FLAGS
from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.kernel.symbols import Symbol
from unwind.core.memory import Memory, MemoryFault, WordCursor
from unwind.core.target import Target, Task
from unwind.core.walk import Stop, StopReason, Unwinder, UnwindStop, stop_on_lost_entries
from unwind.kernel.fgraph import fgraph_idx, ftrace_graph_ret_addr
from unwind.kernel.generation import kernel_generation
from unwind.kernel.kretprobe import rethook_find_ret_addr
from unwind.kernel.layout import StructLayout, resolve_layout

from .complete import UndefinedOrc, proven_caller
from .dumpstack import UNKNOWN, StackFinder, StackInfo
from .orc import (ORC_FP_ENTRY, ORC_REG_AX, ORC_REG_BP, ORC_REG_BP_INDIRECT, ORC_REG_DI, ORC_REG_DX,
                  ORC_REG_PREV_SP, ORC_REG_R10, ORC_REG_R13, ORC_REG_SP, ORC_REG_SP_INDIRECT, ORC_REG_UNDEFINED,
                  ORC_TYPE_CALL, ORC_TYPE_END_OF_STACK, ORC_TYPE_REGS, ORC_TYPE_REGS_PARTIAL, ORC_TYPE_UNDEFINED,
                  REG_NAMES, OrcEntry, OrcFormatError, OrcTable)
from .structs import INACTIVE_TASK_FRAME_MEMBERS, INACTIVE_TASK_FRAME_TABLE, PT_REGS_MEMBERS, PT_REGS_TABLE

PAGE_SIZE = 4096
# the per-frame path works on Flag values and takes each frame's Flag from FLAGS (an IntFlag | is slow)
_FGRAPH, _KRETPROBE = Flag.FGRAPH.value, Flag.KRETPROBE.value
_UNRELIABLE, _BOUNDARY = Flag.UNRELIABLE.value, Flag.BOUNDARY.value
# and the members it uses looked up once (an Enum class's attribute lookup costs more than a step's arithmetic)
_SRC_ORC_CALL, _SRC_ORC_REGS, _SRC_ORC_REGS_PARTIAL = Source.ORC_CALL, Source.ORC_REGS, Source.ORC_REGS_PARTIAL
_SRC_TASK, _SRC_REGS_PC = Source.TASK, Source.REGS_PC
_END_OF_STACK = StopReason.END_OF_STACK
#: not looked up yet (``orc_find()`` may answer ``None``)
_UNSEEN = object()
_U64 = struct.Struct("<Q").unpack_from


#: TOP_OF_KERNEL_STACK_PADDING (asm/thread_info.h) of x86-64: 0, or 2 * 8 with CONFIG_X86_FRED (v6.9+)
STACK_PADDINGS = (0, 16)
#: the IRET frame {ip, cs, flags, sp, ss} closes every struct pt_regs (the CPU pushes it)
_IRET_WORDS = 5
#: a struct pt_regs larger than this is not believed (21 words today)
_DERIVE_MAX = 512
#: user pt_regs looked at when the layout is derived
_DERIVE_VOTES = 16


#: the words a user IRET frame may take below a task stack's top, over every padding
_IRET_WINDOW = _IRET_WORDS + STACK_PADDINGS[-1] // 8
_IRET_WINDOW_WORDS = struct.Struct(f"<{_IRET_WINDOW}Q").unpack_from


# task_pt_regs() (asm/processor.h) from the stacks' side: a user IRET frame below the padding
def user_iret_padding(mem: Memory, top: int) -> int | None:
    """TOP_OF_KERNEL_STACK_PADDING of a task stack whose top holds a user-mode IRET frame (cs and ss with
    RPL 3, ip a user address), or None."""
    lo = top - 8 * _IRET_WINDOW
    try:  # the frame's words over every padding, in one read where one segment holds them all
        seg = mem.segment(lo, 8 * _IRET_WINDOW)
        words: Sequence[int | None] = _IRET_WINDOW_WORDS(seg.data, lo - seg.start)
    except MemoryFault:
        words = [_word_or_none(mem, lo + 8 * i) for i in range(_IRET_WINDOW)]
    for pad in STACK_PADDINGS:
        base = _IRET_WINDOW - _IRET_WORDS - pad // 8  # the frame's first word (ip)
        cs = words[base + 1]  # cs first: a kernel thread's zeroed frame fails there
        if cs is not None and cs & 3 == 3 and cs < 0x10000:
            ss, ip = words[base + 4], words[base]
            if ss is not None and ss & 3 == 3 and ss < 0x10000 and ip is not None and ip < 1 << 56:
                return pad
    return None


def _word_or_none(mem: Memory, addr: int) -> int | None:
    try:
        return mem.read_u64(addr)
    except MemoryFault:
        return None


# PUSH_AND_CLEAR_REGS + UNWIND_HINT_REGS (entry_64.S): the entry calls the C handler with sp = the pt_regs
def user_regs_start(mem: Memory, table: OrcTable, iret: int) -> int | None:
    """Where the user pt_regs below ``iret`` begins: just above the return address into the entry code,
    whose ORC entry is REGS at sp+0 (the regs are at the caller's sp)."""
    try:  # the words below iret come from its segment (read_u64() for any below it)
        seg = mem.segment(iret - 8, 8)
    except MemoryFault:
        return None
    start, data = seg.start, seg.data
    for slot in range(iret - 8, max(iret - _DERIVE_MAX, 0), -8):
        if slot >= start:
            ret = _U64(data, slot - start)[0]
        else:
            try:
                ret = mem.read_u64(slot)
            except MemoryFault:
                return None
        if not table.stext <= ret < table.etext:
            continue
        orc = table.orc_find(ret)
        if orc is not None and orc.type == ORC_TYPE_REGS and orc.sp_reg == ORC_REG_SP and orc.sp_offset == 0:
            return slot + 8
    return None


def _task_stack_tops(target: Target) -> list[int]:
    """The tops of the task stacks the dump lists (the same for every task walked)."""
    return list(dict.fromkeys(st.high for st in target.info.stacks if st.kind == "task"))


def derived_pt_regs(target: Target, table: OrcTable) -> StructLayout | None:
    """``struct pt_regs`` from the user pt_regs at the top of the task stacks: it ends at top -
    TOP_OF_KERNEL_STACK_PADDING (the user IRET frame), it begins where the entry's UNWIND_HINT_REGS
    return address says; the most common (size, padding). GPR offsets stay the table's, the IRET
    members are counted from the end."""
    mem = target.mem
    votes: dict[tuple[int, int], int] = {}
    for top in _task_stack_tops(target):
        if sum(votes.values()) >= _DERIVE_VOTES:
            break
        pad = user_iret_padding(mem, top)
        if pad is None:
            continue
        end = top - pad
        start = user_regs_start(mem, table, end - 8 * _IRET_WORDS)
        if start is not None and max(PT_REGS_TABLE[m] for m in ("r10", "r13", "di", "dx", "ax", "bp")) \
                < end - start - 8 * _IRET_WORDS:
            votes[(end - start, pad)] = votes.get((end - start, pad), 0) + 1
    got = None
    if votes:
        (size, pad), n = max(votes.items(), key=lambda kv: kv[1])
        offsets = dict(PT_REGS_TABLE.offsets)
        offsets.update(ip=size - 40, cs=size - 32, sp=size - 16)
        got = StructLayout("pt_regs", size, offsets, "derived",
                           f"{n} of {sum(votes.values())} user pt_regs: UNWIND_HINT_REGS return to a user IRET "
                           f"frame ending at top-{pad} (TOP_OF_KERNEL_STACK_PADDING {pad}), so sizeof = {size} "
                           f"(GPR offsets: {PT_REGS_TABLE.detail})")
    return got


#: [MODULES_VADDR, MODULES_END) with a 1 GiB kernel image (pgtable_64_types.h): module, BPF and
#: trampoline text the replay cannot list, taken as kernel text like __kernel_text_address() does
MODULES_RANGE = (0xFFFFFFFFC0000000, 0xFFFFFFFFFF000000)

#: the table's pt_regs offsets (a walk reads its own: BTF, the dump's offsets, else these)
_OFF: Mapping[str, int] = PT_REGS_TABLE.offsets
#: pt_regs member -> NT_PRSTATUS (user_regs_struct) name, for the CPU's own registers
_PRSTATUS = {"r10": "r10", "r13": "r13", "di": "rdi", "dx": "rdx", "ax": "rax", "bp": "rbp", "ip": "rip",
             "cs": "cs", "sp": "rsp"}
#: sp_reg -> the pt_regs member get_reg() reads, and the kernel's warning name
_SP_REG_MEMBERS = {ORC_REG_R10: ("r10", "R10"), ORC_REG_R13: ("r13", "R13"), ORC_REG_DI: ("di", "RDI"),
                   ORC_REG_DX: ("dx", "DX"), ORC_REG_AX: ("ax", "AX")}


def module_orc(target: Target, ip: int, version: int) -> tuple[str, OrcTable, list[int]] | None:
    """``__module_address(ip)`` and its ``mod->arch.orc_unwind_ip``/``orc_unwind``, decoded once per dump."""
    for m in target.info.modules:
        if m.orc is None or not m.contains(ip):
            continue
        # per dump (not by the module's id, which a later dump may reuse): (module addr, version) -> table
        decoded: dict[tuple[int | None, int], tuple[str, OrcTable, list[int]] | None] = \
            target.per_dump("x86_64 module orc", lambda t: {})
        key = (m.addr, version)
        if key not in decoded:
            decoded[key] = _read_module_orc(target, m, m.orc, version)
        return decoded[key]
    return None


def _read_module_orc(target: Target, m: ModuleInfo, orc: ModuleOrc,
                     version: int) -> tuple[str, OrcTable, list[int]] | None:
    n = orc.num_orcs
    text = next((r for r in m.regions if r.kind == "text"), m.regions[0])
    try:
        table = OrcTable.from_sections(orc.orc_unwind_ip, target.mem.read(orc.orc_unwind_ip, 4 * n),
                                       target.mem.read(orc.orc_unwind, orc.entry_size * n), version,
                                       stext=text.base, etext=text.base + text.size, how=f"module {m.name}")
    except (MemoryFault, OrcFormatError, ValueError, IndexError):
        return None
    return m.name, table, [table.ip(i) for i in range(len(table))]


# orc_module_find() and orc_ftrace_find() as the kernel would answer them, against what the dump holds
def orc_not_in_dump(target: Target, ip: int) -> str | None:
    """Why the dump, not the kernel, lacks the ORC of ``ip`` (a sentence), else ``None``: the module holding
    ``ip`` has ORC tables the dump does not hold, or ``ip`` is in the module area and the dump lists no
    modules (and no BPF program or ftrace trampoline holds it). Where the kernel has no ORC either (no
    module holds ``ip``, or its module has none) its frame-pointer guess is the kernel's own walk."""
    info = target.info
    m = next((m for m in info.modules if m.contains(ip)), None)
    if m is not None:
        if m.orc is None:
            return None
        try:
            for lo, hi in m.orc.ranges():
                target.mem.read(lo, hi - lo)
        except MemoryFault as e:
            return f"module {m.name}'s ORC tables are not in the dump ({e})"
        return None
    if info.modules or not MODULES_RANGE[0] <= ip < MODULES_RANGE[1]:
        return None
    if any(b.start <= ip < b.end for b in info.bpf_symbols) or \
            any(t.addr <= ip < t.addr + t.size for t in info.ftrace_trampolines or ()):
        return None
    return "the dump lists no modules"


# task_on_another_cpu() (asm/unwind.h): task != current && task->on_cpu
def task_on_another_cpu(task: Task) -> bool:
    """A blocked task (the walk runs on another CPU) whose ``on_cpu`` the dump says is set."""
    extra = task.extra
    return task.regs is None and bool(extra.get("on_cpu"))


def on_another_cpu_detail(task: Task) -> str:
    """Why ``__unwind_start()`` refuses ``task``: a CPU is switching to or from it."""
    prev = task.extra.get("switching_from")
    how = (f"cpu{task.cpu} is switching to it from pid {prev} (that CPU's sp is on its stack)" if prev is not None
           else f"no CPU runs it: cpu{task.cpu} is switching to or from it")
    return (f"task->on_cpu is set, {how}: __unwind_start() refuses to walk a task executing on another CPU "
            f"(task_on_another_cpu())")


def orc_end_detail(ip: int) -> str:
    """The stop at an ``ORC_TYPE_END_OF_STACK`` entry for ``ip`` (the ip looked up)."""
    return f"ORC END_OF_STACK at {ip:#x}"


def user_regs_detail(regs: int | None, ip: int, sp: int) -> str:
    """The stop at user-mode registers (``regs``: the ``pt_regs`` address, ``None``: the CPU's) after a REGS step."""
    where = "CPU registers" if regs is None else f"pt_regs at {regs:#x}"
    return f"user-mode {where}: ip {ip:#x}, sp {sp:#x}"


def orc_rule(ip: int, which: str, orc: OrcEntry) -> str:
    """The provenance rule of a frame whose caller the ORC entry ``orc`` of ``ip`` (``which``) gives."""
    return f"ORC at {ip:#x} ({which}): {orc}"


class Regs:
    """A ``struct pt_regs *``: one in memory at ``addr``, or the CPU's registers (``addr`` is ``None``)."""

    __slots__ = ("addr", "cpu", "off")

    def __init__(self, addr: int | None, cpu: dict[str, int] | None = None,
                 off: Mapping[str, int] = _OFF) -> None:
        self.addr = addr
        self.cpu = cpu
        self.off = off

    def get(self, mem_read: Callable[[int], int], member: str) -> int:
        """``((unsigned long *)regs)[member]`` (READ_ONCE_NOCHECK: no stack check)."""
        if self.addr is None:
            return (self.cpu or {})[_PRSTATUS[member]]
        return mem_read(self.addr + self.off[member])

    def user_mode(self, mem_read: Callable[[int], int]) -> bool:
        """``user_mode()``: ``regs->cs & 3`` (64-bit)."""
        return bool(self.get(mem_read, "cs") & 3)


def ftrace_trampolines(target: Target) -> tuple[list[tuple[int, int, bool]], int | None, int | None]:
    """The dump's dynamic ftrace trampolines as ``(ops->trampoline, trampoline_size, SAVE_REGS)``, with
    ``ftrace_caller`` and ``ftrace_regs_caller`` (the code they copy)."""
    found = [(t.addr, t.size, t.save_regs) for t in target.info.ftrace_trampolines or ()]
    return found, target.symbol_address("ftrace_caller"), target.symbol_address("ftrace_regs_caller")


class DumpConstants:
    """What every ORC walk of one dump (with the same options) reads alike, worked out once. ``struct
    pt_regs`` is resolved when first read (a walk of CALL frames never reads it; deriving it reads the
    dump's task stacks): from the first walk's view of the dump, as if resolved with the rest."""

    __slots__ = ("_pt", "_view", "_table", "itf", "itf_bp", "itf_ret_addr", "return_to_handler",
                 "rethook_trampoline", "ret_from_fork_asm", "fgraph_idx")

    def __init__(self, target: Target, table: OrcTable) -> None:
        # struct pt_regs: BTF, the dump's offsets, derived, the table; read through a copy of the target
        # with a shared dict of its own (the one holding these constants would make a reference cycle)
        self._pt: tuple[StructLayout, dict[str, int], int, int, int] | None = None
        self._view: Target | None = target.replace(shared={})
        self._table: OrcTable | None = table
        # struct inactive_task_frame: BTF, the dump's offsets, the table
        self.itf = resolve_layout(target, "inactive_task_frame", INACTIVE_TASK_FRAME_MEMBERS,
                                  INACTIVE_TASK_FRAME_TABLE)
        self.itf_bp, self.itf_ret_addr = self.itf["bp"], self.itf["ret_addr"]
        sym = target.symbol_address
        self.return_to_handler = sym("return_to_handler")
        self.rethook_trampoline = sym("arch_rethook_trampoline")
        # __unwind_start()'s signal test: the entry a new task first runs, ret_from_fork_asm (6.5+); before
        # "x86: Rewrite ret_from_fork() in C" (6.1) the assembly entry was ret_from_fork itself
        self.ret_from_fork_asm = sym("ret_from_fork_asm") or sym("ret_from_fork")
        #: ftrace_graph_ret_addr() of the dumped kernel walks its shadow stack down from *idx (v6.11+)
        self.fgraph_idx = fgraph_idx(kernel_generation(target)[0])

    def _pt_regs(self) -> tuple[StructLayout, dict[str, int], int, int, int]:
        """``struct pt_regs``, its offsets, size, IRET frame offset and size: resolved on the first call."""
        if self._pt is None:
            view, table = self._view, self._table
            assert view is not None and table is not None
            pt = resolve_layout(view, "pt_regs", PT_REGS_MEMBERS, PT_REGS_TABLE, lambda: derived_pt_regs(view, table))
            self._pt = (pt, dict(pt.offsets), pt.size, pt["ip"], pt.size - pt["ip"])
            self._view = self._table = None
        return self._pt

    @property
    def pt(self) -> StructLayout:
        """``struct pt_regs``."""
        return self._pt_regs()[0]

    @property
    def off(self) -> dict[str, int]:
        """``struct pt_regs``'s member offsets."""
        return self._pt_regs()[1]

    @property
    def pt_size(self) -> int:
        """``sizeof(struct pt_regs)``."""
        return self._pt_regs()[2]

    @property
    def iret_offset(self) -> int:
        """Where the IRET frame (``ip``) starts in ``struct pt_regs``."""
        return self._pt_regs()[3]

    @property
    def iret_size(self) -> int:
        """The IRET frame's size: ``sizeof(struct pt_regs)`` less :attr:`iret_offset`."""
        return self._pt_regs()[4]


#: per ORC table (one image): ``orc_find()``'s answer for each ip looked up so far, by every walk of
#: every dump over it (the answer depends on the table alone)
_FOUND: "weakref.WeakKeyDictionary[OrcTable, dict[int, OrcEntry | None]]" = weakref.WeakKeyDictionary()
#: ips kept per table at most (a fuzz campaign walks ever new garbage ips over one image)
_FOUND_MAX = 1 << 16


def found_per_table(table: OrcTable) -> dict[int, OrcEntry | None]:
    """The dict of ``orc_find()`` answers kept for ``table`` (emptied when it grows past :data:`_FOUND_MAX`)."""
    found = _FOUND.get(table)
    if found is None:
        found = _FOUND[table] = {}
    elif len(found) >= _FOUND_MAX:
        found.clear()
    return found


class TableConstants:
    """What every walk of one dump over one ORC table reads alike: the dump's constants, the kernel text,
    the basis, and ``orc_find()``'s answers kept for the table (:func:`found_per_table`). A walk reads
    them through this one object (:attr:`OrcUnwinder.c`), not copied per walk."""

    __slots__ = ("table", "consts", "text", "stext", "etext", "_basis", "found")

    def __init__(self, table: OrcTable, consts: DumpConstants) -> None:
        self.table = table
        self.consts = consts
        # __kernel_text_address(): core (and init) text, and the module area
        self.text = ((table.stext, table.etext), MODULES_RANGE) + ((table.inittext,) if table.inittext else ())
        self.stext, self.etext = table.stext, table.etext
        self._basis: dict[str, str] | None = None
        self.found = found_per_table(table)

    @property
    def basis(self) -> dict[str, str]:
        """What the walks followed (:meth:`OrcUnwinder.basis`), made when first read (it names ``pt_regs``)."""
        if self._basis is None:
            table, consts = self.table, self.consts
            self._basis = {"generation": f"ORC v{table.version}", "generation_why": table.how,
                           "pt_regs": consts.pt.describe(), "inactive_task_frame": consts.itf.describe()}
        return self._basis

    def basis_copy(self) -> dict[str, str]:
        """A copy of :attr:`basis` (what :meth:`OrcUnwinder.basis_maker` hands a replay: a bound method, cheap
        to make for each, which reads the basis only when called)."""
        return dict(self.basis)


def table_constants(target: Target, table: OrcTable) -> TableConstants:
    """What every walk of ``target``'s dump over ``table`` reads alike, made once and kept in ``target.shared``."""
    c = target.shared.get("x86_64 table")
    if c is None or c.table is not table:
        c = target.shared["x86_64 table"] = TableConstants(
            table, target.per_dump("x86_64", partial(DumpConstants, table=table)))
    return c


class OrcUnwinder(Unwinder):
    """One ORC walk of ``target.task`` over ``table``."""

    #: arch_stack_walk_reliable() accepts kernel-mode pt_regs frames under ORC
    reliable_refuses_boundary = False

    def basis_maker(self) -> Callable[[], dict[str, str]]:
        """What makes the basis: the ORC format generation followed and the layouts read, and why."""
        return self.c.basis_copy

    def __init__(self, target: Target, table: OrcTable) -> None:
        # struct unwind_state as __unwind_start() zeroes it (memset)
        self.ip = self.sp = self.bp = 0
        self.signal = self.error = self.full_regs = False
        self.regs: Regs | None = None
        self.prev_regs: Regs | None = None
        self.stack_info: StackInfo = UNKNOWN
        self.graph_idx = 0
        self.kr_cur = -1
        #: the FGRAPH/KRETPROBE bits (``Flag`` values) when this step's ip was recovered
        self.recovered = 0
        self.last: Frame | None = None
        self.target = target
        task = self.task = target.task
        mem = self.mem = target.mem
        #: the words are read from the captured segment of the last read
        self.cursor = WordCursor(mem)
        self.record = target.options.record
        c = table_constants(target, table)
        #: what every walk of the dump over ``table`` reads alike
        self.c: TableConstants = c
        # the per-frame path's own copies
        self.found = c.found
        self.stext, self.etext = c.stext, c.etext
        consts = c.consts
        self.return_to_handler, self.rethook_trampoline = consts.return_to_handler, consts.rethook_trampoline
        self.stacks = StackFinder(task.stacks, mem)
        self.stack_mask = [0]

    # the dump's constants by their unwind_state names (read once per walk or less)
    @property
    def table(self) -> OrcTable:
        """The ORC table walked."""
        return self.c.table

    @property
    def text(self) -> tuple[tuple[int, int], ...]:
        """``__kernel_text_address()``'s ranges."""
        return self.c.text

    @property
    def itf(self) -> StructLayout:
        """``struct inactive_task_frame``."""
        return self.c.consts.itf

    @property
    def pt(self) -> StructLayout:
        """``struct pt_regs``."""
        return self.c.consts.pt

    @property
    def ret_from_fork_asm(self) -> int | None:
        """The address of the entry a new task first runs (``ret_from_fork_asm``; 6.1: ``ret_from_fork``)."""
        return self.c.consts.ret_from_fork_asm

    # READ_ONCE_NOCHECK(): a word of captured memory (the segment of the last read is kept)
    def read_word(self, addr: int) -> int:
        """The 64-bit word at ``addr``; :class:`MemoryFault` when it was not captured."""
        return self.cursor.word(addr)

    #: the reader handed to :class:`Regs` (a class attribute: a bound method kept on the walk would make a
    #: reference cycle, and every walk garbage for the cyclic collector)
    read = read_word

    # --- stack access (unwind_orc.c:387-437) ---

    # stack_access_ok() (unwind_orc.c:387-398)
    def stack_access_ok(self, addr: int, length: int) -> bool:
        """Is ``[addr, addr+length)`` on the current stack, or on a stack the walk may move to?"""
        info = self.stack_info  # the unknown stack has begin == end == 0: nothing is on it
        if info.begin <= addr and addr + length <= info.end:
            return True
        new = self.stacks.get_stack_info(addr, self.stack_mask)
        self.stack_info = new if new is not None else UNKNOWN
        return new is not None and new.on_stack(addr, length)

    # deref_stack_reg() (unwind_orc.c:400-408)
    def deref_stack_reg(self, addr: int, what: str, prov: Provenance | None) -> int:
        """The stack word at ``addr``; an error stop when it is on no usable stack."""
        info = self.stack_info
        if not (info.begin <= addr and addr + 8 <= info.end) and not self.stack_access_ok(addr, 8):
            self.fail_access(addr, 8, what)
        val = self.read_word(addr)
        if prov is not None:
            prov.read(addr, 8, val, what)
        return val

    def fail_access(self, addr: int, length: int, what: str) -> None:
        """``goto err`` after a failed stack access, with the reason as the stop."""
        why = self.stacks.why or f"[{addr:#x}, +{length}) crosses the end of its stack"
        reason = StopReason.TRANSITION_REFUSED if "recursion" in why else StopReason.OUTSIDE_STACK
        self.stacks.why = ""
        raise UnwindStop(reason, f"{what} at {addr:#x}: {why}")

    # get_reg() (unwind_orc.c:447-466)
    def get_reg(self, member: str) -> int | None:
        """A register from full regs, or from the previous full regs under an IRET frame; else ``None``."""
        if self.regs is None:
            return None
        if self.full_regs:
            return self.regs.get(self.read, member)
        if self.prev_regs is not None:
            return self.prev_regs.get(self.read, member)
        return None

    # --- start ---

    # __unwind_start() (unwind_orc.c:685-768)
    def start(self) -> Frame:
        """The first frame: the CPU's ``regs->ip``, or a blocked task's ``inactive_task_frame``."""
        try:
            return self._start()
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, str(e)) from None

    def _start(self) -> Frame:
        task = self.task
        if task_on_another_cpu(task):  # unwind_orc.c:694-700: goto err
            raise UnwindStop(StopReason.KERNEL_LIMIT, on_another_cpu_detail(task))
        prov = Provenance("") if self.record else None
        if task.regs is not None:  # unwind_orc.c:702-711
            regs = Regs(None, task.regs, self.c.consts.off)
            if regs.user_mode(self.read):
                raise UnwindStop(StopReason.USER_MODE, f"cs {task.regs.get('cs', 0):#x}: the CPU is in user mode")
            self.ip, self.sp, self.bp = task.regs["rip"], task.regs["rsp"], task.regs["rbp"]
            self.regs, self.full_regs, self.signal = regs, True, True
            source, flags = _SRC_REGS_PC, _BOUNDARY
            if prov is not None:
                prov.rule = "the CPU's registers (rip, rsp, rbp); signal frame"
        elif task.context is not None and "sp" in task.context:  # unwind_orc.c:720-727
            tsp = task.context["sp"]
            consts = self.c.consts
            self.sp = tsp + consts.itf.size
            self.bp = self.read_word(tsp + consts.itf_bp)
            self.ip = self.read_word(tsp + consts.itf_ret_addr)
            self.signal = self.ip == consts.ret_from_fork_asm
            source, flags = _SRC_TASK, 0
            if prov is not None:
                prov.rule = f"inactive_task_frame at thread.sp {tsp:#x}"
                prov.read(tsp + consts.itf_bp, 8, self.bp, "frame->bp")
                prov.read(tsp + consts.itf_ret_addr, 8, self.ip, "frame->ret_addr")
                if self.signal:
                    prov.note("ret_from_fork_asm: a signal frame (look up ip, not ip-1)")
        else:
            raise UnwindStop(StopReason.MISSING_REGISTER, "the task has neither CPU registers nor thread.sp")
        # unwind_orc.c:729-742: find the stack; past a guard page, retry one page up
        info = self.stacks.get_stack_info(self.sp, self.stack_mask)
        if info is None:
            self.error = True
            up = (self.sp + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
            info = self.stacks.get_stack_info(up, self.stack_mask)
            if info is None:
                raise self.off_stack_stop()
            if prov is not None:
                prov.note(f"sp {self.sp:#x} is on no stack: guard-page retry at {up:#x}; unreliable")
        self.stack_info = info
        if self.error:
            flags |= _UNRELIABLE
        if source is _SRC_TASK:
            self.check_text(self.ip)
        frame = Frame(self.ip, self.sp, self.bp, source, info.kind, _FLAGS[flags], prov)
        self.last = frame
        return frame

    # unwind_orc.c:729-742 with no stack found: the walk ends with no frame
    def off_stack_stop(self) -> UnwindStop:
        """The stop where the start's sp is on no stack: the kernel's own end when the CPU is switching to the
        task whose stack holds it (the dump's ``switching_to``), else an error."""
        nxt = self.task.extra.get("switching_to")
        if nxt is None:
            return UnwindStop(StopReason.OUTSIDE_STACK, f"sp {self.sp:#x}: {self.stacks.why}")
        return UnwindStop(StopReason.KERNEL_LIMIT,
                          f"sp {self.sp:#x} is on the stack of pid {nxt}, to which cpu{self.task.cpu} is switching "
                          f"(__switch_to_asm() has loaded its sp, __switch_to() has not yet made it current): "
                          f"get_stack_info() finds no stack of current there, and the kernel's walk ends with no frame")

    # --- one step: unwind_next_frame() ---

    # unwind_next_frame() (unwind_orc.c:472-681)
    def unwind_next_frame(self) -> Frame | Stop:
        """The caller's frame: ``unwind_next_frame()`` in the kernel's order (the rule, the previous
        sp by ``sp_reg``, ip/sp/regs by ``type``, bp by ``bp_reg``, the direction check), then
        ``unwind_get_return_address()``. This is :meth:`next`; the walk's clean ends (``the_end``)
        are returned, its errors raised."""
        try:
            info = self.stack_info
            if not info.type:  # unwind_done(): STACK_TYPE_UNKNOWN is 0
                return Stop(_END_OF_STACK, "the walk is done")
            prev_sp, prev_type, orig_ip = self.sp, info.type, self.ip
            prov = Provenance("") if self.record else None
            self.recovered = 0
            error = self.error
            # unwind_orc.c:485-510: orc_find(signal ? ip : ip - 1); the rare outcomes in find_orc()
            ip = orig_ip if self.signal else orig_ip - 1
            found = self.found.get(ip, _UNSEEN)
            if found is _UNSEEN:  # each ip's answer is kept for the table's other walks
                found = self.found[ip] = self.c.table.orc_find(ip)
            orc = found
            if orc is not None and orc.type >= ORC_TYPE_CALL and prov is None:
                source = _SRC_ORC_CALL
            else:
                try:
                    found = self.find_orc(ip, orc, prov)
                except UndefinedOrc as stop:
                    if not self.target.options.complete:
                        raise  # re-raised here: a function holding the stop while raising it makes a cycle
                    return self.complete_undefined(stop, error, prov)
                if type(found) is Stop:  # ORC_TYPE_END_OF_STACK: the_end
                    return found  # type: ignore[return-value]
                orc, source = found  # type: ignore[misc]
            self.signal = orc.signal  # unwind_orc.c:512
            # unwind_orc.c:514-578: the previous frame's stack pointer (the CFA) by sp_reg
            reg = orc.sp_reg
            if reg == ORC_REG_SP:
                sp = self.sp + orc.sp_offset
            elif reg == ORC_REG_BP:
                sp = self.bp + orc.sp_offset
            else:
                sp = self.prev_sp_reg(orc, prov)
            # unwind_orc.c:580-637: ip, sp and regs by type
            typ = orc.type
            if typ == ORC_TYPE_CALL:  # unwind_orc.c:582-593: the return address is the word below the CFA
                ip_p = sp - 8
                ip = self.deref_stack_reg(ip_p, "return address", prov)
                stack = self.stack_info.kind
                if ip == self.return_to_handler or ip == self.rethook_trampoline:
                    ip = self.unwind_recover_ret_addr(ip, ip_p, prov)
                self.ip, self.sp = ip, sp
                self.regs = self.prev_regs = None
            elif typ == ORC_TYPE_REGS:
                stack = self.step_regs(sp, orig_ip, prov)
            elif typ == ORC_TYPE_REGS_PARTIAL:
                stack = self.step_regs_partial(sp, orig_ip, prov)
            else:  # unwind_orc.c:634-637
                raise UnwindStop(StopReason.UNKNOWN_METADATA,
                                 f"unknown .orc_unwind entry type {typ} at {orig_ip:#x}")
            # unwind_orc.c:640-661: the previous frame's bp by bp_reg
            reg = orc.bp_reg
            if reg == ORC_REG_UNDEFINED:
                if self.regs is not None:
                    val = self.get_reg("bp")
                    if val is not None:
                        self.bp = val
            elif reg == ORC_REG_PREV_SP:
                self.bp = self.deref_stack_reg(sp + orc.bp_offset, "saved bp at prevsp+offset", prov)
            elif reg == ORC_REG_BP:
                self.bp = self.deref_stack_reg(self.bp + orc.bp_offset, "saved bp at bp+offset", prov)
            else:
                self.error = True
                raise UnwindStop(StopReason.UNKNOWN_METADATA, f"unknown BP base reg {reg} for ip {self.ip:#x}")
            # unwind_orc.c:663-670: same stack and the sp did not grow: bad ORC data would loop
            info, sp = self.stack_info, self.sp
            if info.type == prev_type and info.begin <= sp and sp + 8 <= info.end and sp <= prev_sp:  # on_stack()
                self.error = True
                raise UnwindStop(StopReason.TRANSITION_REFUSED,
                                 f"stack going in the wrong direction? at {orig_ip:#x} (sp {prev_sp:#x} -> {sp:#x})")
            flags = self.recovered | _UNRELIABLE if self.error else self.recovered
            if typ != ORC_TYPE_CALL:
                return self.regs_frame(typ, source, stack, flags, prov)
            if not self.stext <= self.ip < self.etext:
                self.check_text(self.ip)
            frame = self.last = Frame(self.ip, sp, self.bp, source, stack, _FLAGS[flags], prov)
            return frame
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, str(e)) from None

    def next(self) -> Frame | Stop:
        """The walk's step: :meth:`unwind_next_frame`."""
        return self.unwind_next_frame()

    # unwind_orc.c:476-483 (the next call's user_mode() test) and the frame of a pc from pt_regs
    def regs_frame(self, typ: int, source: Source, stack: str, flags: int,
                   prov: Provenance | None) -> Frame | Stop:
        """The frame after a REGS or REGS_PARTIAL step: a boundary; user-mode regs end the walk (the_end,
        the stop returned)."""
        regs = self.regs
        if regs is not None:  # a pc from pt_regs: not a return address
            source = _SRC_ORC_REGS if typ == ORC_TYPE_REGS else _SRC_ORC_REGS_PARTIAL
            flags |= _BOUNDARY
            if regs.user_mode(self.read):  # unwind_orc.c:481-483 on the next call: the_end
                if self.last is not None:
                    self.last.extra = {**(self.last.extra or {}), "user_regs": regs.addr}
                return Stop(StopReason.USER_MODE, user_regs_detail(regs.addr, self.ip, self.sp))
        if not self.stext <= self.ip < self.etext:
            self.check_text(self.ip)
        frame = self.last = Frame(self.ip, self.sp, self.bp, source, stack, _FLAGS[flags], prov,
                                  pt_regs=regs.addr if regs is not None else None)
        return frame

    # unwind_orc.c:485-510, past orc_find(): modules, ftrace trampolines, the frame-pointer guess, the ends
    def find_orc(self, ip: int, orc: OrcEntry | None,
                 prov: Provenance | None) -> tuple[OrcEntry, Source] | Stop:
        """The rule for ``ip`` when ``orc_find()`` gave ``orc`` (``None``: no entry), and its source; at an
        ``ORC_TYPE_END_OF_STACK`` entry the walk's end (returned)."""
        if orc is None and self.target.info.modules:
            orc = self.orc_module_find(ip, prov)
        if orc is None and self.target.info.ftrace_trampolines:
            orc = self.orc_ftrace_find(ip, prov)
        if orc is None:
            lacking = orc_not_in_dump(self.target, ip)
            if lacking is not None:  # the kernel has this ORC: its walk goes on where the dump cannot follow
                raise UnwindStop(StopReason.MEMORY_FAULT, f"no ORC for {self.ip:#x}: {lacking}")
            self.error = True
            if prov is not None:
                prov.rule = f"no ORC entry for {ip:#x}: orc_fp_entry {ORC_FP_ENTRY} (a guess; unreliable)"
            return ORC_FP_ENTRY, Source.FP_GUESS
        if orc.type == ORC_TYPE_UNDEFINED:  # goto err: the walk ends, unwind_error() set
            self.error = True
            skipped = self.stack_frame_non_standard(ip)
            # a function objtool was told to skip is where the kernel's own walk ends; elsewhere the ip is wrong
            reason = StopReason.KERNEL_LIMIT if skipped is not None else StopReason.UNKNOWN_METADATA
            raise UndefinedOrc(reason, f"ORC entry for {ip:#x} is UNDEFINED{self.undefined_why(skipped)}", ip)
        if orc.type == ORC_TYPE_END_OF_STACK:  # every walk of a blocked task ends here: the detail is made when read
            return Stop(_END_OF_STACK, partial(orc_end_detail, ip))
        if prov is not None:  # the rule is written when read
            prov.rule = partial(orc_rule, ip, "ip" if self.signal else "ip-1", orc)
        return orc, _SRC_ORC_CALL

    # objtool's STACK_FRAME_NON_STANDARD(): the function's whole range is one UNDEFINED entry
    def stack_frame_non_standard(self, ip: int) -> Symbol | None:
        """The function holding ``ip`` when it has no ORC at all (objtool skipped it), else ``None``."""
        sym = self.target.symbols.lookup(ip) if self.target.symbols is not None else None
        i = self.table.find_index(ip)
        if sym is None or sym.offset >= sym.size or i < 0 or not self.stext <= ip < self.etext:
            return None
        end = self.table.ip(i + 1) if i + 1 < len(self.table) else self.etext
        return sym if self.table.ip(i) <= sym.addr and sym.addr + sym.size <= end else None

    def undefined_why(self, skipped: Symbol | None) -> str:
        """Why an ip has an UNDEFINED entry: ``skipped``, its function, has no ORC at all (objtool skipped
        it), and the kernel's walk ends there with an error."""
        hint = "; --complete looks for the caller" if not self.target.options.complete else ""
        if skipped is None:
            return f" ({hint[2:]})" if hint else ""
        return (f" ({skipped.name} has no ORC at all: objtool skipped it, as STACK_FRAME_NON_STANDARD asks, "
                f"and unwind_next_frame() ends the walk there with unwind_error() set{hint})")

    def complete_undefined(self, stop: UndefinedOrc, error: bool, prov: Provenance | None) -> Frame:
        """Complete mode past an UNDEFINED entry: the caller proven by its call (:mod:`.complete`)."""
        frame = proven_caller(self, stop.ip, prov)
        if frame is None:
            why = "no return address above sp follows a call to the function holding it" \
                if self.target.image is not None and self.target.image.has_text else \
                "--complete needs the image's text to prove a caller (a slim image made --with-text)"
            raise UnwindStop(stop.reason, f"{stop.detail}; {why}")
        self.error = error  # the frames after it are ORC's own
        self.check_text(frame.pc)
        self.last = frame
        return frame

    # orc_module_find() (unwind_orc.c:125-136)
    def orc_module_find(self, ip: int, prov: Provenance | None) -> OrcEntry | None:
        """An ip in a module takes ``__orc_find()`` over the module's own tables, read from memory."""
        found = module_orc(self.target, ip, self.table.version)
        if found is None:
            return None
        name, table, ips = found
        i = bisect.bisect_right(ips, ip) - 1  # __orc_find(): the rightmost entry <= ip, else the first
        if prov is not None:
            prov.note(f"{ip:#x} is in module {name}: its ORC table ({len(ips)} entries, from memory)")
        return table.entry(max(i, 0))

    # orc_ftrace_find() (unwind_orc.c:143-167)
    def orc_ftrace_find(self, ip: int, prov: Provenance | None) -> OrcEntry | None:
        """An ip in a dynamic ftrace trampoline takes the entry of the code it copies."""
        # read at the first ORC miss of the dump's walks
        trampolines, ftrace_caller, ftrace_regs_caller = self.target.per_dump("x86_64 ftrace", ftrace_trampolines)
        for start, size, save_regs in trampolines:
            if start <= ip < start + size:  # ftrace_ops_trampoline()
                base = ftrace_regs_caller if save_regs else ftrace_caller
                if base is None or base + (ip - start) == ip:
                    return None
                if prov is not None:
                    prov.note(f"{ip:#x} is in the ftrace trampoline at {start:#x}: the entry of "
                              f"{'ftrace_regs_caller' if save_regs else 'ftrace_caller'}+{ip - start:#x}")
                return self.c.table.orc_find(base + (ip - start))
        return None

    # unwind_orc.c:514-578: the sp_reg cases past SP and BP
    def prev_sp_reg(self, orc: OrcEntry, prov: Provenance | None) -> int:
        """The previous frame's stack pointer through memory (``call_on_stack()``) or a register of pt_regs."""
        reg = orc.sp_reg
        if reg == ORC_REG_SP_INDIRECT:  # call_on_stack(): dereference first, then add the offset
            return self.deref_stack_reg(self.sp, "sp(ind) *sp", prov) + orc.sp_offset
        if reg == ORC_REG_BP_INDIRECT:  # offset first, then dereference
            return self.deref_stack_reg(self.bp + orc.sp_offset, "bp(ind) *(bp+offset)", prov)
        member = _SP_REG_MEMBERS.get(reg)
        if member is None:
            self.error = True
            raise UnwindStop(StopReason.UNKNOWN_METADATA, f"unknown SP base reg {reg} at {self.ip:#x}")
        val = self.get_reg(member[0])
        if val is None:
            self.error = True
            raise UnwindStop(StopReason.MISSING_REGISTER, f"missing {member[1]} value at {self.ip:#x}")
        if prov is not None:
            prov.note(f"sp = {REG_NAMES[reg]} = {val:#x} from the {'' if self.full_regs else 'previous '}regs")
        return val

    # unwind_orc.c:595-616
    def step_regs(self, sp: int, orig_ip: int, prov: Provenance | None) -> str:
        """REGS: ``sp`` points to a full ``struct pt_regs``."""
        consts = self.c.consts
        if not self.stack_access_ok(sp, consts.pt_size):
            self.fail_access(sp, consts.pt_size, f"can't access registers at {orig_ip:#x}: pt_regs")
        stack = self.stack_info.kind
        off = consts.off
        ip, new_sp = self.read_word(sp + off["ip"]), self.read_word(sp + off["sp"])
        if prov is not None:
            prov.read(sp + off["ip"], 8, ip, "pt_regs->ip")
            prov.read(sp + off["sp"], 8, new_sp, "pt_regs->sp")
        self.sp = new_sp
        self.ip = self.unwind_recover_rethook(ip, new_sp - 8, prov)
        self.regs, self.prev_regs, self.full_regs = Regs(sp, None, off), None, True
        return stack

    # unwind_orc.c:618-632
    def step_regs_partial(self, sp: int, orig_ip: int, prov: Provenance | None) -> str:
        """REGS_PARTIAL: ``sp`` points to an IRET frame (``pt_regs`` from ``ip`` on)."""
        consts = self.c.consts
        if not self.stack_access_ok(sp, consts.iret_size):
            self.fail_access(sp, consts.iret_size, f"can't access iret registers at {orig_ip:#x}: iret frame")
        stack = self.stack_info.kind
        base = sp - consts.iret_offset
        off = consts.off
        ip, new_sp = self.read_word(base + off["ip"]), self.read_word(base + off["sp"])
        if prov is not None:
            prov.read(base + off["ip"], 8, ip, "iret->ip")
            prov.read(base + off["sp"], 8, new_sp, "iret->sp")
        self.sp = new_sp
        self.ip = self.unwind_recover_rethook(ip, new_sp - 8, prov)
        if self.full_regs:
            self.prev_regs = self.regs
        self.regs, self.full_regs = Regs(base, None, off), False
        return stack

    # --- return-address recovery (asm/unwind.h) ---

    # unwind_recover_ret_addr() (asm/unwind.h:118-128): ftrace_graph_ret_addr(), then unwind_recover_rethook()
    def unwind_recover_ret_addr(self, ip: int, ip_p: int, prov: Provenance | None) -> int:
        """A return address through the fgraph return stack and rethook instances."""
        if ip == self.return_to_handler and self.return_to_handler is not None:
            ip = self.recover_fgraph(ip, ip_p, prov)
        return self.unwind_recover_rethook(ip, ip_p, prov)

    # unwind_recover_ret_addr()'s ftrace_graph_ret_addr(state->task, &state->graph_idx, addr, addr_p)
    def recover_fgraph(self, ret: int, retp: int, prov: Provenance | None) -> int:
        """The original return address of a ``return_to_handler`` hijack, keyed by the stack slot ``retp``."""
        ret, self.graph_idx, at = ftrace_graph_ret_addr(self.task.fgraph, self.graph_idx, ret, retp, ret,
                                                        self.c.consts.fgraph_idx)
        if at >= 0:
            self.recovered |= _FGRAPH
            if prov is not None:
                prov.note(f"return_to_handler at {retp:#x}: fgraph entry {at} gives {ret:#x}")
        else:
            stop_on_lost_entries(self.task.fgraph_lacks, f"return_to_handler at {retp:#x}")
            if prov is not None:
                prov.note(f"return_to_handler at {retp:#x}: no fgraph entry for it (left as is)")
        return ret

    # unwind_recover_rethook() (asm/unwind.h:106-116): rethook_find_ret_addr(state->task, addr_p, &state->kr_cur)
    def unwind_recover_rethook(self, ip: int, ip_p: int, prov: Provenance | None) -> int:
        """The original return address of an ``arch_rethook_trampoline`` hijack, keyed by ``frame``."""
        tramp = self.rethook_trampoline
        if ip != tramp or tramp is None:
            return ip
        ret, self.kr_cur = rethook_find_ret_addr(self.task.kretprobes, ip_p, self.kr_cur, tramp)
        if not ret:
            stop_on_lost_entries(self.task.kretprobes_lacks, f"arch_rethook_trampoline at {ip_p:#x}")
            raise UnwindStop(StopReason.RECOVERY_FAILED,
                             f"arch_rethook_trampoline at {ip_p:#x}: no rethook instance for that frame")
        self.recovered |= _KRETPROBE
        if prov is not None:
            prov.note(f"arch_rethook_trampoline at {ip_p:#x}: rethook instance {self.kr_cur} gives {ret:#x}")
        return ret

    # unwind_get_return_address() (unwind_orc.c:364-370): not kernel text -> arch_stack_walk() stops
    def check_text(self, ip: int) -> None:
        """Stop where ``arch_stack_walk()`` would: an ip that is not kernel text."""
        for lo, hi in self.text:
            if lo <= ip < hi:
                return
        self.error = True
        raise UnwindStop(StopReason.BAD_PC, f"{ip:#x} is not kernel text")

    def bpf_args(self, frame: Frame) -> tuple[int, int, int]:
        """``arch_bpf_stack_walk()`` passes ``(ip, state.sp, state.bp)``."""
        return frame.pc, frame.sp or 0, frame.fp or 0
