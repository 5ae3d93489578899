"""The arm64 kernel unwinder, step for step: ``arch/arm64/kernel/stacktrace.c``.

Two generations are followed:

- **v6.12 and older**: ``struct kunwind_state`` is ``{common, task, graph_idx,
  kr_cur}``; every step reads an ordinary ``{fp, lr}`` record through
  ``unwind_next_frame_record()`` (``asm/stacktrace/common.h``), and the walk
  ends when ``fp == &task_pt_regs(tsk)->stackframe``. An EL1 exception leaves
  an ordinary-looking record ``{x29, ELR}`` in its ``pt_regs``.
- **v6.13 and newer**: the state also carries ``source``, ``flags`` and
  ``regs``; a record with ``fp == lr == 0`` is a ``frame_record_meta``:
  ``FRAME_META_TYPE_FINAL`` ends the walk at ``task_pt_regs(tsk)->stackframe``,
  ``FRAME_META_TYPE_PT_REGS`` continues from the saved ``pc`` and ``x29``.

Each function below mirrors one kernel function and says which. A kernel
``-ENOENT`` is :class:`UnwindStop` with ``END_OF_STACK``; every ``-EINVAL``
is an :class:`UnwindStop` with the reason that caused it.

Complete mode (``--complete``, :mod:`.complete`) adds frames the kernel cannot
prove; it never changes the frames the kernel reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

from unwind.core.frame import FLAGS as _FLAGS
from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.core.memory import Memory, MemoryFault, WordCursor
from unwind.core.stackinfo import Refusal, StackInfo, StackSet
from unwind.core.target import FgraphEntry, KretprobeInstance, Target
from unwind.core.walk import Stop, StopReason, Unwinder, UnwindStop, stop_on_lost_entries

from unwind.kernel.btf import BtfError
from unwind.kernel.fgraph import fgraph_idx, ftrace_graph_ret_addr
from unwind.kernel.generation import KernelGeneration, kernel_generation
from unwind.kernel.kretprobe import kretprobe_find_ret_addr
from unwind.kernel.layout import StructLayout, image_btf, resolve_layout

from .ptrauth import kernel_pac_mask, ptrauth_clear_pac, ptrauth_strip_kernel_insn_pac
from .structs import (FRAME_META_TYPE_FINAL, FRAME_META_TYPE_PT_REGS, FRAME_RECORD_META_SIZE,
                      FRAME_RECORD_SIZE, META_RECORDS_SINCE, PSR_MODE32_BIT, PSR_MODE_EL0T, PSR_MODE_MASK,
                      PT_REGS_MEMBERS, PtRegsLayout, pt_regs_table)

if TYPE_CHECKING:
    from .complete import Completer

# Enum members looked up once: a class attribute lookup costs more than a frame's arithmetic.
_NO_FLAGS = Flag.NONE
_PAC_STRIPPED = Flag.PAC_STRIPPED
_BOUNDARY_V = Flag.BOUNDARY.value
_SRC_FRAME = Source.FRAME
_SRC_REGS_PC = Source.REGS_PC
_SRC_UNKNOWN = Source.UNKNOWN
_SRC_CALLER = Source.CALLER
_SRC_TASK = Source.TASK
_END_OF_STACK = StopReason.END_OF_STACK

#: the first kernel whose unwind() recovers the first pc too (unwind_recover_return_address()) and strips
#: a PAC with ptrauth_strip_kernel_insn_pac(): "arm64: stacktrace: recover return address for first
#: entry" and "arm64: use XPACLRI to strip PAC" (the arm64 pull for v6.4; the v6.4-v6.7 stacktrace.c read)
FIRST_PC_RECOVERED_SINCE = (6, 4)
#: the first kernel whose walk is kunwind_stack_walk(): a failed kretprobe recovery is an error (the
#: kunwind series, "factor out kunwind_stack_walk()", in the arm64 pull for v6.8)
KUNWIND_SINCE = (6, 8)
#: how far below the top of a task stack the FINAL record is looked for: 24 (v6.18+) and 40 (v6.13)
#: bytes in the trees read; members added after ``stackframe`` would have to grow it by 0x50 to escape
_FINAL_SEARCH = 0x80



# ---------------------------------------------------------------------------
# What the walk needs to know about the kernel that was running
# ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Generation(KernelGeneration):
    """Which of the kernel's arm64 walks to follow, and why."""

    #: v6.13+: frame_record_meta, kunwind_source and the printed markers
    meta_records: bool
    #: v6.8+: kunwind_stack_walk() (a kretprobe miss is an error)
    kunwind: bool
    #: v6.4+: the first pc is recovered and PACs are stripped with ptrauth_strip_kernel_insn_pac()
    first_pc_recovered: bool = True

    @property
    def name(self) -> str:
        """``v6.13+``, ``v6.8-v6.12``, ``v6.4-v6.7`` or ``v6.1-v6.3``: the walk followed."""
        if self.meta_records:
            return "v6.13+"
        if self.kunwind:
            return "v6.8-v6.12"
        return "v6.4-v6.7" if self.first_pc_recovered else "v6.1-v6.3"


# kunwind_next_frame_record_meta()'s FRAME_META_TYPE_FINAL test, from the stacks' side
def find_final_record(target: Target) -> int | None:
    """Where a ``{0, 0, FRAME_META_TYPE_FINAL}`` record sits below the top of the task stack, if anywhere.

    Every v6.13+ task stack ends in one at ``task_pt_regs(tsk)->stackframe``
    (entry.S for tasks from EL0, copy_thread() for kernel threads, head.S for
    the idle tasks), a fixed distance below the top. The distance, searched
    upward from the top, is returned.
    """
    top = task_stack(target.task.stacks)
    if top is None:
        return None
    for dist in range(FRAME_RECORD_META_SIZE, _FINAL_SEARCH + 1, 8):
        try:
            words = [target.mem.read_u64(top.high - dist + 8 * i) for i in range(3)]
        except MemoryFault:
            return None
        if words == [0, 0, FRAME_META_TYPE_FINAL]:
            return dist
    return None


def _btf_meta_records(target: Target) -> tuple[bool | None, str]:
    """What the image's BTF says: is ``pt_regs.stackframe`` a ``struct frame_record_meta``?"""
    btf = image_btf(target)
    if btf is None:
        return None, ""
    try:
        tid = btf.member("pt_regs", "stackframe").type_id
        kind = btf.kind(tid)
        name = btf.type(btf.resolve(tid)).name
    except BtfError:
        return None, ""
    meta = kind == "struct" and name == "frame_record_meta"
    return meta, f"BTF: pt_regs.stackframe is {btf.type_name(tid)}"


def _generation(version: tuple[int, int] | None, meta: bool, why: str) -> Generation:
    if version is None:
        kunwind, first_pc = True, True
    else:
        kunwind = version >= KUNWIND_SINCE or meta
        first_pc = version >= FIRST_PC_RECOVERED_SINCE or kunwind
    return Generation(version=version, meta_records=meta, kunwind=kunwind, fgraph_idx=fgraph_idx(version) or meta,
                      why=why, first_pc_recovered=first_pc)


def dump_generation(target: Target) -> Generation | None:
    """The walk as ``--generation``, the image's BTF (for meta records) or the release tell it: the same
    for every task of a dump; ``None`` when none of them does (only the task's stack can tell then)."""
    version, why = kernel_generation(target)
    if target.options.generation and version is not None:
        meta = version >= META_RECORDS_SINCE
    else:
        meta_btf, btf_why = _btf_meta_records(target)
        if meta_btf is not None:
            meta, why = meta_btf, f"{why}; {btf_why}" if version is not None else btf_why
        elif version is not None:
            meta = version >= META_RECORDS_SINCE
        else:
            return None
    return _generation(version, meta, why)


def walk_generation(target: Target) -> Generation:
    """The walk to follow: ``--generation`` first, then the image's BTF (for meta records), the release, the stacks."""
    gen = dump_generation(target)
    if gen is not None:
        return gen
    _, why = kernel_generation(target)
    dist = find_final_record(target)
    meta = dist is not None
    why = (f"{why}; FRAME_META_TYPE_FINAL record {dist:#x} below the task stack's top: v6.13+"
           if meta else f"{why}; no FINAL meta record at the task stack's top: assuming v6.8-v6.12")
    return _generation(None, meta, why)


def _derived_pt_regs(target: Target, table: StructLayout) -> StructLayout | None:
    """``sizeof(struct pt_regs)`` from where the FINAL record sits: the table's other offsets, a new size."""
    dist = find_final_record(target)
    if dist is None:
        return None
    sf = table["stackframe"]
    return StructLayout("pt_regs", sf + dist, dict(table.offsets), "derived",
                        f"FRAME_META_TYPE_FINAL at top-{dist:#x}, so sizeof = offsetof(stackframe) {sf} + {dist}"
                        f" (other offsets: {table.detail})")


def pt_regs_layout(target: Target, gen: Generation) -> PtRegsLayout:
    """``struct pt_regs`` for this walk: BTF, the dump's offsets, the FINAL record's place, the table."""
    table = pt_regs_table(gen.version, gen.meta_records)
    derive = (lambda: _derived_pt_regs(target, table)) if gen.meta_records else None
    return PtRegsLayout.of(resolve_layout(target, "pt_regs", PT_REGS_MEMBERS, table, derive))


# user_mode() in asm/ptrace.h (plus compat_user_mode())
def user_mode(pstate: int) -> bool:
    """True for EL0 (AArch64 EL0t or any AArch32) register state."""
    return (pstate & PSR_MODE_MASK) == PSR_MODE_EL0T or bool(pstate & PSR_MODE32_BIT)


# stackinfo_get_task() in asm/stacktrace.h
def task_stack(stacks: Sequence[StackInfo]) -> StackInfo | None:
    """``stackinfo_get_task(tsk)``: the task's own stack among the usable ones."""
    for info in stacks:
        if info.kind == "task":
            return info
    return None


# task_pt_regs(tsk)->stackframe
def task_pt_regs_stackframe(task_stack_info: StackInfo | None, layout: PtRegsLayout) -> int | None:
    """Address of the final frame record: ``task_pt_regs(tsk)`` sits at the top of the
    task stack (``THREAD_SIZE + task_stack_page(tsk) - sizeof(pt_regs)``)."""
    if task_stack_info is None:
        return None
    return task_stack_info.high - layout.size + layout.stackframe


@dataclass(frozen=True, slots=True)
class DumpConstants:
    """What every walk of one dump (with the same options) reads alike, worked out once.

    ``generation`` and ``layout`` are ``None`` where the task's own stack decides them (no
    ``--generation``, BTF or release; a v6.13+ ``pt_regs`` derived from the FINAL record).
    """

    generation: Generation | None
    layout: PtRegsLayout | None
    pac_mask: int
    pac_why: str
    return_to_handler: int | None
    kretprobe_trampoline: int | None
    #: :meth:`Arm64Unwinder.basis` of every walk, when ``generation`` and ``layout`` are the dump's
    basis: dict[str, str] | None = None

    @classmethod
    def of(cls, target: Target) -> "DumpConstants":
        """The constants of ``target``'s dump, image and options."""
        gen = dump_generation(target)
        layout = None
        if gen is not None:
            layout = pt_regs_layout(target, gen)
            if gen.meta_records and not layout.source.startswith(("btf", "dump")):
                layout = None  # the FINAL record of each task may give its size
        pac_mask, pac_why = kernel_pac_mask(target.vmcoreinfo)
        # is_kretprobe_trampoline(): __kretprobe_trampoline, or the rethook trampoline with KRETPROBE_ON_RETHOOK
        tramp = target.symbol_address("__kretprobe_trampoline") or target.symbol_address("arch_rethook_trampoline")
        basis = walk_basis(gen, layout) if gen is not None and layout is not None else None
        return cls(gen, layout, pac_mask, pac_why, target.symbol_address("return_to_handler"), tramp, basis)


def walk_constants(target: Target) -> tuple[DumpConstants, Generation, PtRegsLayout]:
    """The dump's constants, and the generation and ``struct pt_regs`` the walk of ``target.task`` follows."""
    consts = target.per_dump("arm64", DumpConstants.of)
    gen = consts.generation or walk_generation(target)
    return consts, gen, consts.layout or pt_regs_layout(target, gen)


def walk_basis(gen: Generation, layout: PtRegsLayout) -> dict[str, str]:
    """The generation followed and the layouts read, and why (``--explain``, the JSON)."""
    return {"generation": gen.name, "generation_why": gen.why, "pt_regs": layout.describe()}


def record_rule(fp: int, which: str) -> str:
    """The provenance rule of a frame taken from the record at ``fp`` by ``which`` step."""
    return f"frame record {{fp, lr}} at fp {fp:#x} ({which})"


def record_note(fp: int, stack: str | None) -> str:
    """The provenance note naming the stack the record at ``fp`` lies on."""
    return f"record at {fp:#x} on the {stack} stack"


# ---------------------------------------------------------------------------
# struct kunwind_state
# ---------------------------------------------------------------------------

class KunwindState:
    """``struct kunwind_state`` plus what it reaches through ``task`` in the kernel.

    ``regs`` keeps the address of the last ``pt_regs`` crossed (the kernel clears it once the step
    is done); complete mode reads the interrupted x30 there.
    """

    __slots__ = ("fp", "pc", "stacks", "graph_idx", "kr_cur", "source", "flags", "regs",
                 "mem", "meta_records", "kunwind", "first_pc_recovered", "fgraph_idx", "layout", "final_fp",
                 "pac_mask", "return_to_handler", "kretprobe_trampoline", "fgraph", "kretprobes", "prov", "record",
                 "fgraph_lacks", "kretprobes_lacks", "cursor")

    def __init__(self, target: Target, gen: Generation, layout: PtRegsLayout, consts: DumpConstants) -> None:
        task = target.task
        self.mem: Memory = target.mem
        self.meta_records = gen.meta_records
        self.kunwind = gen.kunwind
        self.first_pc_recovered = gen.first_pc_recovered
        self.fgraph_idx = gen.fgraph_idx
        self.layout = layout
        stacks = task.stacks
        self.stacks = StackSet(stacks)
        self.final_fp = task_pt_regs_stackframe(task_stack(stacks), layout)
        self.pac_mask = consts.pac_mask
        self.return_to_handler = consts.return_to_handler
        self.kretprobe_trampoline = consts.kretprobe_trampoline
        self.fgraph: list[FgraphEntry] = task.fgraph
        self.kretprobes: list[KretprobeInstance] = task.kretprobes
        self.fgraph_lacks, self.kretprobes_lacks = task.fgraph_lacks, task.kretprobes_lacks
        self.record = target.options.record
        self.fp = 0
        self.pc = 0
        self.graph_idx = 0
        self.kr_cur = -1  # NULL: the list's head
        self.source = _SRC_UNKNOWN
        self.flags = _NO_FLAGS
        self.regs: int | None = None
        self.prov: Provenance | None = None
        # the records are read from the words of the captured segment the last one came from
        self.cursor = WordCursor(self.mem)

    def read_u64(self, addr: int, what: str) -> int:
        """``READ_ONCE()`` of a captured word; a missing word ends the walk."""
        try:
            value = self.mem.read_u64(addr)
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, f"{what}: {e}") from None
        if self.prov is not None:
            self.prov.read(addr, 8, value, what)
        return value

    def note(self, text: str) -> None:
        """Add a provenance note to the frame being built (record mode only)."""
        if self.prov is not None:
            self.prov.note(text)


# kunwind_init()
def kunwind_init(state: KunwindState) -> None:
    """Start on no stack, with no source, no flags and no regs."""
    state.source = _SRC_UNKNOWN
    state.flags = _NO_FLAGS
    state.regs = None


# kunwind_init_from_regs()
def kunwind_init_from_regs(state: KunwindState, regs: dict[str, int]) -> None:
    """Start at the pc of exception registers, with their x29."""
    kunwind_init(state)
    state.fp = regs["x29"]
    state.pc = regs["pc"]
    state.source = _SRC_REGS_PC


# kunwind_init_from_caller()
def kunwind_init_from_caller(state: KunwindState, context: dict[str, int]) -> None:
    """Start at a caller: ``__builtin_frame_address(1)`` and ``__builtin_return_address(0)``."""
    kunwind_init(state)
    state.fp = context["fp"]
    state.pc = context["pc"]
    state.source = _SRC_CALLER


# kunwind_init_from_task()
def kunwind_init_from_task(state: KunwindState, context: dict[str, int]) -> None:
    """Start at a blocked task's ``thread.cpu_context`` fp and pc (the caller of cpu_switch_to())."""
    kunwind_init(state)
    state.fp = context["fp"]
    state.pc = context["pc"]
    state.source = _SRC_TASK


# ---------------------------------------------------------------------------
# Return-address recovery
# ---------------------------------------------------------------------------

# kunwind_recover_return_address()
def kunwind_recover_return_address(state: KunwindState) -> None:
    """Resolve ``return_to_handler`` (fgraph) and ``__kretprobe_trampoline`` (kretprobes)."""
    pc = state.pc
    if pc == state.return_to_handler:
        orig, state.graph_idx, at = ftrace_graph_ret_addr(state.fgraph, state.graph_idx, pc, state.fp, pc,
                                                          state.fgraph_idx)
        if orig == pc:
            stop_on_lost_entries(state.fgraph_lacks, f"return_to_handler at fp {state.fp:#x}")
            raise UnwindStop(StopReason.RECOVERY_FAILED,
                             f"return_to_handler at fp {state.fp:#x}: no function-graph return-stack entry "
                             f"with retp {state.fp:#x} (of {len(state.fgraph)} captured)")
        state.pc = pc = orig
        state.flags |= Flag.FGRAPH
        state.note(f"recovered: return_to_handler -> {orig:#x} from fgraph ret_stack entry {at} "
                   f"(retp {state.fp:#x})")
    if pc == state.kretprobe_trampoline:
        orig, state.kr_cur = kretprobe_find_ret_addr(state.kretprobes, state.fp, state.kr_cur, pc)
        if not orig:
            stop_on_lost_entries(state.kretprobes_lacks, f"__kretprobe_trampoline at fp {state.fp:#x}")
        if not orig and not state.kunwind:  # v6.1-v6.7: the pc becomes 0 and the walk goes on
            state.pc = 0
            state.note(f"__kretprobe_trampoline at fp {state.fp:#x}: no kretprobe instance; v6.1 goes on with pc 0")
            return
        if not orig:
            raise UnwindStop(StopReason.RECOVERY_FAILED,
                             f"__kretprobe_trampoline at fp {state.fp:#x}: no kretprobe instance with fp "
                             f"{state.fp:#x} (of {len(state.kretprobes)} captured)")
        state.pc = orig
        state.flags |= Flag.KRETPROBE
        state.note(f"recovered: __kretprobe_trampoline -> {orig:#x} from kretprobe instance {state.kr_cur} "
                   f"(fp {state.fp:#x})")


# ---------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------

def _refuse(state: KunwindState, addr: int, size: int, what: str) -> UnwindStop:
    """The -EINVAL of a failed unwind_find_stack()/unwind_consume_stack(), with its reason."""
    why = state.stacks.why_not(addr, size)
    reason = StopReason.OUTSIDE_STACK if why is Refusal.OUTSIDE else StopReason.TRANSITION_REFUSED
    return UnwindStop(reason, f"{what} at {addr:#x} (+{size}): {why.value}")


# unwind_find_stack() in asm/stacktrace/common.h
def unwind_find_stack(state: KunwindState, sp: int, size: int, what: str) -> StackInfo:
    """The stack holding ``[sp, sp + size)``, the current one first; none is an error."""
    cur = state.stacks.stack
    low = cur.low
    if low and low <= sp and sp + size <= cur.high:  # stackinfo_on_stack(&state->stack, ...)
        return cur
    info = state.stacks.find(sp, size)
    if info is None:
        raise _refuse(state, sp, size, what)
    return info


# unwind_consume_stack() in asm/stacktrace/common.h
def unwind_consume_stack(state: KunwindState, info: StackInfo, sp: int, size: int) -> None:
    """Consume ``[sp, sp + size)``: the stack's low bound moves above it; a transition is one-way."""
    stacks = state.stacks
    if info is stacks.stack:
        info.low = sp + size
        return
    left = stacks.consume(info, sp, size)
    if state.prov is not None and left is not None:
        state.prov.note(f"stack transition: {left} -> {stacks.stack.label()} (one-way)")


# READ_ONCE(record->fp), READ_ONCE(record->lr)
def _read_record(state: KunwindState, fp: int) -> tuple[int, int]:
    """``record->fp`` and ``record->lr`` of the aligned record at ``fp``; a missing word ends the walk."""
    try:
        record = state.cursor.pair(fp)
    except MemoryFault as e:
        raise UnwindStop(StopReason.MEMORY_FAULT, f"frame record at {fp:#x}: {e}") from None
    if state.prov is not None:
        state.prov.read(fp, 8, record[0], "record.fp")
        state.prov.read(fp + 8, 8, record[1], "record.lr (raw)")
    return record


# unwind_next_frame_record() in asm/stacktrace/common.h (v6.12)
def unwind_next_frame_record(state: KunwindState) -> None:
    """v6.12: check alignment, consume the 16-byte record at fp, read ``{fp, lr}``."""
    fp = state.fp
    if fp & 0x7:
        raise UnwindStop(StopReason.MISALIGNED_FP, f"fp {fp:#x} is not 8-byte aligned")
    info = unwind_find_stack(state, fp, FRAME_RECORD_SIZE, "frame record")
    unwind_consume_stack(state, info, fp, FRAME_RECORD_SIZE)
    state.fp, state.pc = _read_record(state, fp)
    state.source = _SRC_FRAME


def final_frame_detail(fp: int) -> str:
    """The stop at the final frame record, up to v6.12 (``fp`` is ``task_pt_regs(tsk)->stackframe``)."""
    return f"fp {fp:#x} is task_pt_regs(tsk)->stackframe (final frame)"


def final_record_detail(fp: int) -> str:
    """The stop at the ``FRAME_META_TYPE_FINAL`` record, v6.13+."""
    return f"FRAME_META_TYPE_FINAL at task_pt_regs(tsk)->stackframe {fp:#x}"


# kunwind_next_regs_pc() (v6.13+)
def kunwind_next_regs_pc(state: KunwindState) -> None:
    """Continue from the ``pt_regs`` holding the meta record: its pc and x29 (never its LR)."""
    layout = state.layout
    regs = state.fp - layout.stackframe  # container_of(fp, struct pt_regs, stackframe.record.fp)
    info = unwind_find_stack(state, regs, layout.size, "pt_regs")
    unwind_consume_stack(state, info, regs, layout.size)
    state.regs = regs
    state.pc = state.read_u64(regs + layout.pc, "pt_regs.pc")
    state.fp = state.read_u64(regs + layout.reg(29), "pt_regs.regs[29]")
    state.source = _SRC_REGS_PC


# kunwind_next_frame_record_meta() (v6.13+)
def kunwind_next_frame_record_meta(state: KunwindState) -> Stop | None:
    """A ``{0, 0}`` record is metadata: FINAL ends the walk (``-ENOENT``, returned), PT_REGS crosses an
    exception."""
    fp = state.fp
    unwind_find_stack(state, fp, FRAME_RECORD_META_SIZE, "frame_record_meta")
    kind = state.read_u64(fp + 16, "frame_record_meta.type")
    if kind == FRAME_META_TYPE_FINAL:
        if fp == state.final_fp:
            return Stop(_END_OF_STACK, partial(final_record_detail, fp))  # made when read
        raise UnwindStop(StopReason.UNKNOWN_METADATA,
                         f"FRAME_META_TYPE_FINAL at {fp:#x}, not at task_pt_regs(tsk)->stackframe "
                         f"{state.final_fp:#x}" if state.final_fp is not None else
                         f"FRAME_META_TYPE_FINAL at {fp:#x} and no task stack is known")
    if kind == FRAME_META_TYPE_PT_REGS:
        state.note(f"meta record FRAME_META_TYPE_PT_REGS at {fp:#x}: pt_regs at {fp - state.layout.stackframe:#x} "
                   f"({state.layout.source})")
        kunwind_next_regs_pc(state)
        return None
    raise UnwindStop(StopReason.UNKNOWN_METADATA, f"frame_record_meta at {fp:#x} has type {kind:#x}")


# kunwind_next_frame_record() (v6.13+)
def kunwind_next_frame_record(state: KunwindState) -> Stop | None:
    """v6.13: find the record's stack, read it, hand ``{0, 0}`` to the meta step, else consume it."""
    fp = state.fp
    if fp & 0x7:
        raise UnwindStop(StopReason.MISALIGNED_FP, f"fp {fp:#x} is not 8-byte aligned")
    info = unwind_find_stack(state, fp, FRAME_RECORD_SIZE, "frame record")
    new_fp, new_pc = _read_record(state, fp)
    if not new_fp and not new_pc:
        return kunwind_next_frame_record_meta(state)
    unwind_consume_stack(state, info, fp, FRAME_RECORD_SIZE)
    state.fp = new_fp
    state.pc = new_pc
    state.source = _SRC_FRAME
    return None


# kunwind_next()
def kunwind_next(state: KunwindState) -> Stop | None:
    """One step: the next record (or exception boundary), PAC strip, return-address recovery. The walk's
    end (``-ENOENT``) is returned, its errors raised."""
    state.flags = _NO_FLAGS
    if state.meta_records:
        if state.source is _SRC_UNKNOWN:
            raise UnwindStop(StopReason.UNKNOWN_METADATA, "unwind state has no source")
        end = kunwind_next_frame_record(state)
        if end is not None:
            return end
    else:
        if state.fp == state.final_fp:
            # every walk of a blocked task ends here: the detail is made when read
            return Stop(_END_OF_STACK, partial(final_frame_detail, state.fp))
        unwind_next_frame_record(state)
    raw = state.pc
    pc = state.pc = (ptrauth_strip_kernel_insn_pac(raw, state.pac_mask) if state.first_pc_recovered
                     else ptrauth_clear_pac(raw, state.pac_mask))
    if pc != raw:
        state.flags = _PAC_STRIPPED
    if state.prov is not None:
        what = "lr" if state.source is _SRC_FRAME else "pt_regs.pc"
        state.prov.note(f"{what} raw {raw:#x} -> stripped {pc:#x} (PAC removed)" if pc != raw
                        else f"{what} {raw:#x} (unsigned: stripping changes nothing)")
    if pc == state.return_to_handler or pc == state.kretprobe_trampoline:
        kunwind_recover_return_address(state)
    return None


# ---------------------------------------------------------------------------
# The Unwinder the core drives (kunwind_stack_walk() + do_kunwind())
# ---------------------------------------------------------------------------

_RULES = {
    Source.TASK: "kunwind_init_from_task: thread.cpu_context {fp, pc}",
    Source.CALLER: "kunwind_init_from_caller: caller's frame address and return address",
    Source.REGS_PC: "kunwind_init_from_regs: pt_regs pc and x29",
}


def _first_provenance(state: KunwindState, gen: Generation, pac_why: str) -> Provenance:
    """The first frame's provenance (record mode): its rule, the generation, the PAC mask and the final
    record expected; the notes are written when read."""
    prov = Provenance(_RULES[state.source])
    mask, final, layout = state.pac_mask, state.final_fp, state.layout
    prov.note(lambda: f"generation: {gen.name} ({gen.why})")
    prov.note(lambda: f"PAC mask {mask:#x} from {pac_why}")
    if final is not None:
        prov.note(lambda: f"final record expected at {final:#x} (task_pt_regs(tsk)->stackframe, {layout.source})")
    return prov


class Arm64Unwinder(Unwinder):
    """``kunwind_stack_walk()`` for one task of a dump, faithful to its kernel generation."""

    reliable_refuses_boundary = True

    def __init__(self, target: Target) -> None:
        self.target = target
        self.consts, self.generation, layout = walk_constants(target)
        self.state = KunwindState(target, self.generation, layout, self.consts)
        # read on every step: set here (an instance attribute reads faster than a class-level default)
        self.completer: Completer | None = None
        #: frames to report before the next step (complete mode; an empty tuple in a faithful walk)
        self._pending: list[Frame] | tuple[()] = ()
        if target.options.complete:
            from . import complete
            self.completer = complete.Completer(target, self.state)
            self._pending = []
        self._deferred: UnwindStop | None = None
        self._stack_obj: object = None
        self._stack_label: str | None = None

    @property
    def meta_records(self) -> bool:
        """True when the walk follows v6.13+ (meta records, sources, flags)."""
        return self.state.meta_records

    def basis_maker(self) -> Callable[[], dict[str, str]]:
        """What makes the basis: the generation followed and the layouts read, and why (``--explain``, the
        JSON)."""
        basis = self.consts.basis
        # the dump's basis copied (its dict's own copy method: made for each replay, cheaper than a partial)
        return basis.copy if basis is not None else partial(walk_basis, self.generation, self.state.layout)

    # kunwind_stack_walk() and dump_backtrace()'s user_mode() check
    def _begin(self) -> None:
        """Pick the start: exception registers, a caller, or a blocked task's saved context."""
        state = self.state
        task = self.target.task
        try:
            if task.regs is not None:
                if user_mode(task.regs.get("pstate", 0)):
                    raise UnwindStop(StopReason.USER_MODE,
                                     f"cpu{task.cpu} is at EL0 (pstate {task.regs.get('pstate', 0):#x}): "
                                     "dump_backtrace() prints nothing for user regs")
                kunwind_init_from_regs(state, task.regs)
            elif task.context is not None and task.context.get("caller"):
                kunwind_init_from_caller(state, task.context)
            elif task.context is not None:
                kunwind_init_from_task(state, task.context)
            else:
                raise UnwindStop(StopReason.MISSING_REGISTER,
                                 f"{task.describe()} has neither registers nor a saved context")
        except KeyError as e:
            raise UnwindStop(StopReason.MISSING_REGISTER, f"{task.describe()}: no {e.args[0]}") from None

    # do_kunwind(): kunwind_recover_return_address() on the first pc, then consume it
    def _first_frame(self) -> Frame:
        """do_kunwind(): recover the first pc, then report it."""
        state = self.state
        task = self.target.task
        self._begin()
        if state.record:
            state.prov = _first_provenance(state, self.generation, self.consts.pac_why)
        if state.first_pc_recovered:  # v6.1-v6.3's unwind() hands the first pc over as it is
            kunwind_recover_return_address(state)
        regs = task.regs if task.regs is not None else task.context or {}
        sp = regs.get("sp")
        where = state.stacks.kind_of(sp if sp is not None else state.fp)
        flags = _FLAGS[state.flags._value_ | _BOUNDARY_V] if state.source is _SRC_REGS_PC else state.flags
        frame = Frame(state.pc, sp, state.fp, state.source, where.kind if where else None, flags, state.prov)
        state.prov = None
        return frame

    def start(self) -> Frame:  # kunwind_stack_walk()
        """The first frame; in complete mode a vector pseudo-frame and a live-LR frame may come first/next."""
        if self.completer is None:
            return self._first_frame()
        vector = self.completer.vector_frame()
        try:
            first = self._first_frame()
        except UnwindStop as stop:
            if vector is None:
                raise
            self._deferred = stop
            return vector
        extra = self.completer.after_boundary(first, self.target.task.regs) if first.flags & Flag.BOUNDARY else None
        if vector is not None:
            self._pending = [first] + ([extra] if extra else [])
            return vector
        if extra is not None:
            self._pending = [extra]
        return first

    # kunwind_next(), then consume_state() of do_kunwind()'s loop
    def next(self) -> Frame | Stop:
        """kunwind_next(), reported as the frame the consumer sees (or the walk's end, returned)."""
        if self._pending:
            return self._pending.pop(0)
        if self._deferred is not None:
            try:  # no local names the stop: its traceback holds this frame, which would make a cycle
                raise self._deferred
            finally:
                self._deferred = None
        state = self.state
        record_at = state.fp
        if state.record:  # the rule and the note are written when read
            which = "kunwind_next_frame_record" if state.meta_records else "unwind_next_frame_record"
            state.prov = Provenance(partial(record_rule, record_at, which))
        end = kunwind_next(state)
        if end is not None:
            return end
        flags = state.flags
        source = state.source
        if source is _SRC_REGS_PC:
            flags = _FLAGS[flags._value_ | _BOUNDARY_V]
        cur = state.stacks.stack
        if cur is not self._stack_obj:
            self._stack_obj = cur
            self._stack_label = cur.kind
        frame = Frame(state.pc, None, state.fp, source, self._stack_label, flags, state.prov, None, None,
                      state.regs if source is _SRC_REGS_PC else None)  # positional: a keyword costs ~0.1 µs
        if state.prov is not None:
            state.prov.note(partial(record_note, record_at, frame.stack))
            state.prov = None
        if self.completer is not None:
            extra = self.completer.after_record(frame, record_at)
            if extra is not None:
                self._pending.append(extra)
        return frame

    # arch_bpf_unwind_consume_entry()
    def bpf_args(self, frame: Frame) -> tuple[int, int, int]:
        """``arch_bpf_unwind_consume_entry()``: ``(pc, 0, fp)``."""
        return frame.pc, 0, frame.fp or 0
