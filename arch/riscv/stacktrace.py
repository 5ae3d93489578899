"""RISC-V: ``walk_stackframe()`` of v6.12 ``arch/riscv/kernel/stacktrace.c`` (CONFIG_FRAME_POINTER).

The kernel loop, for ``(pc, fp, sp)``::

    for (;;) {
        if (!__kernel_text_address(pc) || (level++ >= 0 && !fn(arg, pc))) break;
        if (!fp_is_valid(fp, sp)) break;
        frame = (struct stackframe *)fp - 1;  sp = fp;
        if (regs && regs->epc == pc && fp_is_valid(frame->ra, sp)) {   /* the leaf rule */
            fp = frame->ra;  pc = regs->ra;
        } else {
            fp = frame->fp;  pc = ftrace_graph_ret_addr(current, &graph_idx, frame->ra, &frame->ra);
            if (handle_exception <= pc < ret_from_exception_end) {       /* exception frame */
                fn(arg, pc);  pc = ((struct pt_regs *)sp)->epc;  fp = ((struct pt_regs *)sp)->s0;
            }
        }
    }

:class:`RiscvUnwinder` runs that loop one printed pc at a time, one method per
step. Faithful mode (the default) reproduces it exactly, including what it
misses: it never crosses from the IRQ stack back to the task stack (the walk
ends at ``call_on_irq_stack``), never prints a caller whose return address is
only in ``ra``, and recovers fgraph returns only for ``current`` (the kernel
passes ``current``, not the task walked). Complete mode (``--complete``) adds
what the dump proves, each such frame flagged ``COMPLETE`` with its own
source and provenance.

:class:`UserUnwinder` is ``arch_stack_walk_user()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.core.memory import MemoryFault, WordCursor
from unwind.core.stackinfo import StackInfo, StackSet
from unwind.core.target import FgraphEntry, Target
from unwind.formats.vmcore.vmcoreinfo import vmcoreinfo_number
from unwind.core.walk import Stop, StopReason, Unwinder, UnwindStop, stop_on_lost_entries

from unwind.kernel.fgraph import fgraph_idx, ftrace_graph_ret_addr
from unwind.kernel.generation import KernelGeneration, kernel_generation
from unwind.kernel.kretprobe import rethook_find_ret_addr
from unwind.kernel.layout import StructLayout, resolve_layout

from .liveness import LiveRaProver, Proof
from .ptregs import derived_pt_regs
from .structs import (PT_REGS_MEMBERS, PT_REGS_TABLE, SR_SPP, STACK_ALIGN, UPPER_HALF, STACKFRAME_FP, STACKFRAME_RA,
                      STACKFRAME_SIZE)

MASK64 = (1 << 64) - 1

#: walk_stackframe() passes the walked task, not current, to ftrace_graph_ret_addr(): 6.12 passes
#: current, 7.2 the task (the release in between that changed it is not pinned down here)
FGRAPH_OF_TASK_SINCE = (7, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation(KernelGeneration):
    """What of the kernel's walk changes between the trees read (6.1, 6.12, 7.2), and why."""

    #: ftrace_graph_ret_addr(task, ...) (7.x) rather than (current, ...)
    fgraph_of_task: bool

    @property
    def name(self) -> str:
        """``v7.x``, ``v6.11-v6.x`` or ``v6.1-v6.10``: the walk followed."""
        if self.fgraph_of_task:
            return "v7.x"
        return "v6.11-v6.x" if self.fgraph_idx else "v6.1-v6.10"


def walk_generation(target: Target) -> Generation:
    """``--generation`` first, then the kernel release; with neither, the newest walk."""
    v, why = kernel_generation(target)
    if v is None:
        return Generation(version=None, fgraph_of_task=True, fgraph_idx=True,
                          why="no kernel release: the newest walk (7.x)")
    return Generation(version=v, fgraph_of_task=v >= FGRAPH_OF_TASK_SINCE, fgraph_idx=fgraph_idx(v), why=why)


_BOUNDARY = Flag.BOUNDARY
_COMPLETE = Flag.COMPLETE
_NONE = Flag.NONE
#: looked up once: an Enum member's class-attribute lookup costs more than a frame's arithmetic
_SRC_FRAME = Source.FRAME
_SRC_TASK = Source.TASK
_SRC_REGS_PC = Source.REGS_PC
_SRC_LIVE_LR = Source.LIVE_LR
_SRC_EXCEPTION_FRAME = Source.EXCEPTION_FRAME
_END_OF_STACK = StopReason.END_OF_STACK
_USER_MODE = StopReason.USER_MODE


class KernelLayout:
    """The kernel addresses one walk compares against, resolved once per target."""

    __slots__ = ("text", "thread_size", "handle_exception", "ret_from_exception_end", "return_to_handler",
                 "rethook_trampolines", "call_on_irq_stack", "ret_from_exception", "pt_regs", "generation", "basis",
                 "text0", "exc_frame", "pt_regs_space", "head_text", "fgraph_of_task", "pt_epc", "pt_s0",
                 "pt_status", "pt_ra", "align_less1", "align_mask", "align_kept")

    def __init__(self, *, text: tuple[tuple[int, int], ...], thread_size: int, handle_exception: int,
                 ret_from_exception_end: int, return_to_handler: int, rethook_trampolines: frozenset[int],
                 call_on_irq_stack: tuple[int, int], ret_from_exception: int, pt_regs: StructLayout,
                 generation: Generation, basis: dict[str, str], text0: tuple[int, int], exc_frame: tuple[int, int],
                 pt_regs_space: int, head_text: tuple[int, int]) -> None:
        self.text = text
        self.thread_size = thread_size
        self.handle_exception = handle_exception
        self.ret_from_exception_end = ret_from_exception_end
        self.return_to_handler = return_to_handler
        self.rethook_trampolines = rethook_trampolines
        self.call_on_irq_stack = call_on_irq_stack
        #: v6.1 tests ``pc == ret_from_exception`` (no ret_from_exception_end): the exact address, else -1
        self.ret_from_exception = ret_from_exception
        self.pt_regs = pt_regs
        self.generation = generation
        #: :meth:`RiscvUnwinder.basis` of every walk
        self.basis = basis
        #: the first text range (core text), tested before the others
        self.text0 = text0
        #: the exception-frame test: [handle_exception, ret_from_exception_end), or v6.1's pc == ret_from_exception
        self.exc_frame = exc_frame
        #: task_pt_regs(tsk) below the task stack's top: sizeof(struct pt_regs) aligned to STACK_ALIGN
        self.pt_regs_space = pt_regs_space
        #: ``.head.text``, ``[_start, _stext)``: head.S's boot code (``_start_kernel``), not kernel text
        self.head_text = head_text
        #: the generation's ftrace_graph_ret_addr(task, ...), read per walk
        self.fgraph_of_task = generation.fgraph_of_task
        #: offsetof(struct pt_regs, epc / s0 / status / ra)
        self.pt_epc, self.pt_s0, self.pt_status, self.pt_ra = (pt_regs["epc"], pt_regs["s0"], pt_regs["status"],
                                                               pt_regs["ra"])
        #: fp_is_valid()'s ALIGN(sp, THREAD_SIZE) is (sp + align_less1) & align_mask; with a THREAD_SIZE that is a
        #: power of two (align_kept) it is the same for every sp of a (top - THREAD_SIZE, top] block
        self.align_less1 = thread_size - 1
        self.align_mask = ~(thread_size - 1)
        self.align_kept = thread_size > 0 and not thread_size & (thread_size - 1)

    @classmethod
    def of(cls, target: Target) -> "KernelLayout":
        """Symbols from the image (or the dump's hints); THREAD_SIZE from the dump's task stack.

        Resolved once per dump, image and options (:meth:`Target.per_dump`) and THREAD_SIZE: short
        real traces would otherwise spend most of their time here.
        """
        return target.per_dump(("riscv THREAD_SIZE", thread_size(target)), resolve_kernel_layout)


def resolve_kernel_layout(target: Target) -> KernelLayout:
    """The :class:`KernelLayout` of a target (:meth:`KernelLayout.of` keeps it per dump)."""
    sym = target.symbol_address
    text = []
    for lo, hi in (("_stext", "_etext"), ("_sinittext", "_einittext")):
        a, b = sym(lo), sym(hi)
        if a is not None and b is not None:
            text.append((a, b))
    mods = [vmcoreinfo_number(target.vmcoreinfo, f"NUMBER({k})") for k in ("MODULES_VADDR", "MODULES_END")]
    if text and mods[0] is not None and mods[1] is not None and mods[0] < mods[1]:
        # is_module_text_address(): module text lies in the module area VMCOREINFO names
        text.append((mods[0], mods[1]))
    tramps = frozenset(a for a in (sym("arch_rethook_trampoline"), sym("__kretprobe_trampoline"))
                       if a is not None)
    exc = sym("handle_exception")
    exc_end = sym("ret_from_exception_end")
    pt_regs = resolve_layout(target, "pt_regs", PT_REGS_MEMBERS, PT_REGS_TABLE,
                             lambda: derived_pt_regs(target, PT_REGS_TABLE, fp_is_valid))
    gen = walk_generation(target)
    rfe = _or_none(sym("ret_from_exception")) if exc_end is None else -1
    return KernelLayout(
        text=tuple(text),
        thread_size=thread_size(target),
        handle_exception=exc if exc is not None else -1,
        ret_from_exception_end=exc_end if exc_end is not None else -1,
        return_to_handler=_or_none(sym("return_to_handler")),
        rethook_trampolines=tramps,
        call_on_irq_stack=_symbol_range(target, "call_on_irq_stack"),
        ret_from_exception=rfe,
        pt_regs=pt_regs,
        generation=gen,
        basis={"generation": gen.name, "generation_why": gen.why, "pt_regs": pt_regs.describe()},
        text0=text[0] if text else (0, 0),
        exc_frame=(rfe, rfe + 1) if rfe >= 0 else (exc if exc is not None else -1,
                                                   exc_end if exc_end is not None else -1),
        pt_regs_space=align(pt_regs.size, STACK_ALIGN),
        head_text=(_or_none(sym("_start")), _or_none(sym("_stext"))),
    )


def _or_none(addr: int | None) -> int:
    return addr if addr is not None else -1


def _symbol_range(target: Target, name: str) -> tuple[int, int]:
    """``[start, end)`` of a function, or an empty range when the table does not know it."""
    addr = target.symbol_address(name)
    if addr is None or target.symbols is None:
        return (0, 0)
    s = target.symbols.lookup(addr)
    return (addr, addr + s.size) if s is not None and s.addr == addr else (0, 0)


def thread_size(target: Target) -> int:
    """THREAD_SIZE: the size of the task stack the dump records (IRQ_STACK_SIZE is the same); 0 if none."""
    for kind in ("task", "irq"):
        for s in target.task.stacks:
            if s.kind == kind and s.high > s.low:
                return s.high - s.low
    return 0


# arch/riscv/include/asm/processor.h: task_pt_regs(tsk)
def task_pt_regs(stacks: tuple[StackInfo, ...], pt_regs_space: int) -> int | None:
    """The ``struct pt_regs`` at the top of the task stack, the frame pointer of the task's first kernel
    frame; ``None`` when the walk has no task stack."""
    for st in stacks:
        if st.kind == "task":
            return st.high - pt_regs_space
    return None


# include/linux/align.h: ALIGN()
def align(x: int, a: int) -> int:
    """Round ``x`` up to a multiple of ``a`` (a power of two), wrapping as unsigned long does."""
    return ((x + a - 1) & ~(a - 1)) & MASK64


# arch/riscv/kernel/stacktrace.c:38-46 fp_is_valid()
def fp_is_valid(fp: int, sp: int, thread_size: int) -> bool:
    """``sp + 16 <= fp <= ALIGN(sp, THREAD_SIZE)`` and 8-byte aligned."""
    low = (sp + STACKFRAME_SIZE) & MASK64
    high = ((sp + thread_size - 1) & ~(thread_size - 1)) & MASK64
    return not (fp < low or fp > high or fp & 7)


def fp_bounds(sp: int, thread_size: int) -> tuple[int, int]:
    """The ``[low, high]`` window :func:`fp_is_valid` tests against."""
    return (sp + STACKFRAME_SIZE) & MASK64, align(sp, thread_size)


# kernel/extable.c:77 __kernel_text_address(): core text, init text, the module area
def kernel_text_address(addr: int, text: tuple[tuple[int, int], ...]) -> bool:
    """Is ``addr`` in ``[_stext, _etext)``, ``[_sinittext, _einittext)`` or the module area?"""
    if not text:
        return addr >= UPPER_HALF
    for lo, hi in text:
        if lo <= addr < hi:
            return True
    return False


class RiscvUnwinder(Unwinder):
    """One ``walk_stackframe()`` of a task: from its CPU's registers or its saved context."""

    def basis_maker(self) -> Callable[[], dict[str, str]]:
        """What makes the basis: the generation followed and the pt_regs layout read, and why."""
        return self.k.basis.copy  # the dump's basis copied (cheaper to make for each replay than a partial)

    def __init__(self, target: Target, layout: KernelLayout, prover: LiveRaProver | None) -> None:
        # the walk's state as it starts
        self.pc = self.fp = self.sp = 0
        #: sp is the fp of a record the walk read (not the registers' or the saved context's sp)
        self.sp_from_record = False
        #: regs->epc/ra of the starting pt_regs (the leaf rule), None for a blocked task
        self.regs_epc: int | None = None
        self.regs_ra = 0
        self.graph_idx = 0
        #: pt_regs whose epc is the next pc to print (after an exception frame)
        self.pending_regs: int | None = None
        #: complete mode: (pc, ra, what) of a pc taken from registers whose caller may sit in ra
        self.live: tuple[int, int, str] | None = None
        #: complete mode: a frame to print next, and a hijacked return in flight found on the way
        self.pending_frame: Frame | None = None
        self.inflight = 0
        #: complete mode: (sepc, sstatus) of a CPU stopped in the trap entry, printed after its pc
        self.trap_entry: tuple[int, int] | None = None
        #: complete mode: flags every frame beyond what the kernel prints carries
        self.beyond = _NONE
        #: complete mode, a CPU in firmware: the ra the walk started from (its record may repeat it)
        self.firmware_ra: int | None = None
        #: complete mode: rethook_find_ret_addr()'s ``*cur`` (-1: NULL, the list's head)
        self.kr_cur = -1
        #: ``(low, high, kind)`` of the stack the last label came from
        self._kind_cache: tuple[int, int, str | None] = (0, 0, None)
        #: ``(top - THREAD_SIZE, top]``: the block of sps whose ALIGN(sp, THREAD_SIZE) is ``top``, the last found
        self.block_low = self.block_top = 0
        self.t, self.k = target, layout
        t, k = self.t, self.k  # read through the typed fields: C fields compiled
        task = t.task
        self.mem = t.mem
        #: the records are read from the words of the captured segment the last one came from
        self.cursor = WordCursor(t.mem)
        self.ts = k.thread_size
        options = t.options
        self.record = options.record
        self.complete = options.complete
        self.prover = prover
        self.stacks = StackSet(task.stacks)
        #: complete mode: the next ret_stack entry to take in order (None: the top, none taken yet)
        self.fg_cursor: int | None = None

    # the layout's values by the names the steps use
    @property
    def generation(self) -> Generation:
        """The kernel generation followed."""
        return self.k.generation

    @property
    def pt(self) -> StructLayout:
        """``struct pt_regs``."""
        return self.k.pt_regs

    # --- labels -----------------------------------------------------------------------------

    def _kind(self, addr: int) -> str | None:
        """The kind of stack ``addr`` lies on (``StackSet.kind_of``), cached per stack."""
        lo, hi, kind = self._kind_cache
        if lo <= addr < hi:
            return kind
        info = self.stacks.kind_of(addr)
        if info is None:
            return None
        self._kind_cache = (info.low, info.high, info.kind)
        return info.kind

    def _read(self, addr: int, what: str) -> int:
        """The word at ``addr``, read through the walk's cursor (:meth:`Memory.read_u64`'s word and fault)."""
        try:
            return self.cursor.word(addr)
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, f"{what}: {e}") from None

    def _bounds_note(self, fp: int, sp: int) -> str:
        low, high = fp_bounds(sp, self.ts)
        return (f"fp_is_valid(fp {fp:#x}, sp {sp:#x}): [sp+16, ALIGN(sp, THREAD_SIZE)] = "
                f"[{low:#x}, {high:#x}], THREAD_SIZE {self.ts:#x}")

    # --- starts -----------------------------------------------------------------------------

    def start(self) -> Frame:
        """``walk_stackframe(task, regs)``: from the CPU's registers or the saved context."""
        if not self.ts:
            raise UnwindStop(StopReason.OUTSIDE_STACK, "the dump records no task stack for this task: "
                                                       "THREAD_SIZE unknown")
        task = self.t.task
        regs = task.regs
        if regs is not None:
            return self._init_from_regs(regs)
        return self._init_from_task(task.context or {})

    # stacktrace.c:55-58 walk_stackframe(): regs: fp = frame_pointer(regs), sp = user_stack_pointer(regs), pc = epc
    def _init_from_regs(self, regs: dict[str, int]) -> Frame:
        self.pc, self.fp, self.sp = regs["pc"], regs["s0"], regs["sp"]
        self.regs_epc, self.regs_ra = self.pc, regs["ra"]
        if not kernel_text_address(self.pc, self.k.text):
            if self._cpu_mode() == "firmware":
                return self._firmware_start(regs)
            if self.pc < UPPER_HALF:
                raise UnwindStop(StopReason.USER_MODE, f"cpu{self.t.task.cpu} was in user mode "
                                                       f"(pc {self.pc:#x}): nothing for the kernel walk")
            raise UnwindStop(StopReason.BAD_PC, f"epc {self.pc:#x} is not kernel text")
        prov = None
        if self.record:
            prov = Provenance("walk_stackframe(regs): pc = regs->epc, fp = regs->s0, sp = regs->sp")
            prov.note(f"cpu{self.t.task.cpu} registers: epc {self.pc:#x}, s0 {self.fp:#x}, "
                      f"sp {self.sp:#x}, ra {self.regs_ra:#x}")
        if self.complete:
            self.live = (self.pc, self.regs_ra, f"the ra register of cpu{self.t.task.cpu}")
            if self.k.handle_exception <= self.pc < self.k.ret_from_exception_end:
                self.trap_entry = self._trap_entry_sepc()
        return Frame(self.pc, self.sp, self.fp, _SRC_REGS_PC, self._kind(self.sp), _BOUNDARY, prov)

    def _cpu_mode(self) -> str | None:
        """The privilege mode the dump records for the task's CPU (``kernel``, ``user``, ``firmware``)."""
        cpu = self.t.info.cpu(self.t.task.running_cpu)
        return cpu.mode if cpu is not None else None

    # a CPU in M-mode (SBI firmware): the kernel prints nothing; ra/sp may still be the kernel's
    def _firmware_start(self, regs: dict[str, int]) -> Frame:
        """Stop for a CPU in firmware; complete mode starts from ``ra`` when ra and sp are still the kernel's."""
        cpu, pc, ra, sp = self.t.task.cpu, regs["pc"], regs["ra"], regs["sp"]
        from_kernel = kernel_text_address(ra, self.k.text) and self.stacks.kind_of(sp) is not None
        if not from_kernel:
            raise UnwindStop(StopReason.FIRMWARE, f"cpu{cpu} at M-mode pc {pc:#x}; ra {ra:#x} and sp {sp:#x} are the "
                                                  "firmware's own: no kernel caller in the registers")
        why = (f"cpu{cpu} at M-mode pc {pc:#x}, entered from the kernel (an SBI call or a trap the firmware "
               f"handles): ra {ra:#x} and sp {sp:#x} are still the kernel's")
        if not self.complete:
            raise UnwindStop(StopReason.FIRMWARE, f"{why}; the kernel prints no trace for it (--complete walks from ra)")
        prov = None
        if self.record:
            prov = Provenance("complete: firmware entered from the kernel: the walk starts from ra, fp = s0, sp = sp")
            prov.note(why)
            prov.note("the interrupted kernel pc (mepc) is not in the dump: ra is the caller of the function that "
                      "trapped, or that function itself if it had returned from a call")
        self.pc, self.regs_epc, self.regs_ra = ra, None, 0
        self.beyond = _COMPLETE
        self.firmware_ra = ra
        return Frame(ra, sp, self.fp, _SRC_LIVE_LR, self._kind(sp), _BOUNDARY | _COMPLETE, prov,
                     extra={"complete": "firmware entered from the kernel: ra holds the kernel caller"})

    def _trap_entry_sepc(self) -> tuple[int, int] | None:
        """Complete mode: ``(sepc, sstatus)`` when the CPU stopped in handle_exception before it wrote s0."""
        if self.prover is None:
            return None
        limit = self.prover.first_write(self.k.handle_exception, "s0")
        if limit is None or self.pc >= limit:
            return None
        cpu = self.t.task.running_cpu
        for c in self.t.info.cpus:
            if c.cpu == cpu and "sepc" in c.sysregs and "sstatus" in c.sysregs:
                return c.sysregs["sepc"], c.sysregs["sstatus"]
        return None

    # complete mode: the interrupted pc (sepc) of a CPU stopped in the trap entry
    def _next_trap_entry(self) -> Frame:
        sepc, sstatus = self.trap_entry  # type: ignore[misc]
        self.trap_entry = None
        if not sstatus & SR_SPP:
            raise UnwindStop(StopReason.USER_MODE, f"cpu{self.t.task.cpu} is entering the kernel from user mode "
                                                   f"(sepc {sepc:#x}, sstatus {sstatus:#x})")
        if not kernel_text_address(sepc, self.k.text):
            raise UnwindStop(StopReason.BAD_PC, f"sepc {sepc:#x} is not kernel text")
        prov = None
        if self.record:
            prov = Provenance("complete: trap entry: the interrupted pc is sepc")
            prov.note(f"cpu{self.t.task.cpu} stopped in handle_exception before it saved the registers: "
                      f"sepc {sepc:#x}, sstatus {sstatus:#x} (SPP: from the kernel); ra and s0 are still the "
                      "interrupted function's")
        if self.stacks.kind_of(self.sp) is None:  # the VMAP overflow check borrows sp for a moment
            if prov is not None:
                prov.note(f"sp {self.sp:#x} is on no stack: the walk goes on from fp - 16")
            self.sp = self.fp - STACKFRAME_SIZE
        self.pc = sepc
        self.live = (sepc, self.regs_ra, f"the ra register of cpu{self.t.task.cpu} (interrupted)")
        return Frame(sepc, self.sp, self.fp, _SRC_EXCEPTION_FRAME, self._kind(self.sp),
                     _BOUNDARY | _COMPLETE, prov, extra={"complete": "interrupted pc (sepc) at trap entry"})

    # stacktrace.c:64-68 walk_stackframe(): blocked in __switch_to: fp = thread.s[0], sp = thread.sp, pc = thread.ra
    def _init_from_task(self, ctx: dict[str, int]) -> Frame:
        try:
            self.pc, self.fp, self.sp = ctx["ra"], ctx["s0"], ctx["sp"]
        except KeyError as e:
            raise UnwindStop(StopReason.MISSING_REGISTER, f"saved context has no thread.{e.args[0]}") from None
        if not kernel_text_address(self.pc, self.k.text):
            raise UnwindStop(StopReason.BAD_PC, f"thread.ra {self.pc:#x} is not kernel text")
        prov = None
        if self.record:
            prov = Provenance("walk_stackframe(task): pc = thread.ra, fp = thread.s[0], sp = thread.sp")
            prov.note(f"saved context: ra {self.pc:#x}, s0 {self.fp:#x}, sp {self.sp:#x}")
        return Frame(self.pc, self.sp, self.fp, _SRC_TASK, self._kind(self.sp), _NONE, prov)

    # --- steps ------------------------------------------------------------------------------

    def next(self) -> Frame | Stop:
        """The next pc the kernel loop prints (or, in complete mode, one it misses); where the loop breaks,
        the stop (returned when the record chain ends, raised on a read's error)."""
        if self.pending_frame is not None:
            frame, self.pending_frame = self.pending_frame, None
            return frame
        if self.pending_regs is not None:
            return self._next_regs_pc()
        if not self.complete:  # the kernel's loop: what follows is complete mode's alone
            return self._next_frame_record()
        if self.trap_entry is not None:
            return self._next_trap_entry()
        if self.live is not None:
            live = self._next_live_ra()
            if live is not None:
                return live
        if self.firmware_ra is not None:
            ra, self.firmware_ra = self.firmware_ra, None
            frame = self._next_frame_record()
            # the trapped function's own record holds the same ra: that caller is already printed
            return self._next_frame_record() if type(frame) is Frame and frame.pc == ra else frame
        return self._next_frame_record()

    # stacktrace.c:74-92 walk_stackframe(): the loop body from fp_is_valid() to the next pc
    def _next_frame_record(self) -> Frame | Stop:
        fp, sp = self.fp, self.sp
        flags = self.beyond
        switch_note = None
        rec = fp - STACKFRAME_SIZE
        if rec < sp or fp > self._align_sp(sp) or fp & 7:  # fp < sp + 16, fp > ALIGN(sp, THREAD_SIZE), unaligned
            switch_note = self._cross_irq_stack() if self.complete else None
            if switch_note is None:  # the loop's break: the stop is returned
                return self._invalid_fp_stop()
            sp, flags = self.sp, self.beyond
        regs_epc = self.regs_epc
        if regs_epc is not None and regs_epc == self.pc:
            ra_slot = self._read(rec + STACKFRAME_RA, "frame->ra")
            if fp_is_valid(ra_slot, fp, self.ts):
                return self._leaf_rule(rec, ra_slot)
        new_fp, ra = self._read_record(rec)
        callee = self.pc
        self.fp, self.sp, self.pc = new_fp, fp, ra
        self.sp_from_record = True
        prov = None
        if self.record:
            prov = Provenance("frame record {fp, ra} at fp - 16")
            prov.read(rec + STACKFRAME_FP, 8, new_fp, "frame->fp")
            prov.read(rec + STACKFRAME_RA, 8, ra, "frame->ra")
            prov.note(partial(self._bounds_note, fp, sp))
            if switch_note:
                prov.note(switch_note)
        pc = ra
        k = self.k
        if ra == k.return_to_handler:
            pc, more = self._ftrace_graph_ret_addr(ra, rec + STACKFRAME_RA, callee, new_fp, fp, prov)
            self.pc, flags = pc, flags | more
        elif self.complete and ra in k.rethook_trampolines:  # complete mode's alone: asked first
            pc, more = self._recover_kretprobe(ra, new_fp, prov)
            self.pc, flags = pc, flags | more
        lo, hi = k.exc_frame
        if lo <= pc < hi:
            return self._exception_frame(rec, flags, prov)
        lo, hi = k.text0
        if not (lo <= pc < hi or kernel_text_address(pc, k.text)):
            raise self._bad_pc_stop(pc, new_fp, f"frame->ra at {rec + STACKFRAME_RA:#x}")
        lo, hi, kind = self._kind_cache
        if not lo <= rec < hi:
            kind = self._kind(rec)
        frame = Frame(pc, fp, new_fp, Source.STACK_SWITCH if switch_note else _SRC_FRAME, kind, flags, prov)
        if self.inflight:
            return self._inflight_frame(frame)
        return frame

    # stacktrace.c:43 fp_is_valid(): ALIGN(sp, THREAD_SIZE)
    def _align_sp(self, sp: int) -> int:
        """``ALIGN(sp, THREAD_SIZE)`` as the loop's test takes it (unmasked); the THREAD_SIZE block
        ``(top - THREAD_SIZE, top]`` it was last found for is kept, where every sp has that ``top``."""
        if self.block_low < sp <= self.block_top:
            return self.block_top
        k = self.k
        top = (sp + k.align_less1) & k.align_mask
        if k.align_kept:
            self.block_low, self.block_top = top - k.thread_size, top
        return top

    # complete mode: the return of a call being entered through ftrace_caller (no frame record yet)
    def _inflight_frame(self, after: Frame) -> Frame:
        """The frame of the function whose call the tracer hijacked in flight; ``after`` comes next."""
        ret, self.inflight = self.inflight, 0
        self.pending_frame = after
        prov = None
        if self.record:
            prov = Provenance("complete: a call being entered through ftrace_caller")
            prov.note(f"ret_stack entry with fp {after.sp:#x} (this frame) holds the return {ret:#x}: "
                      "ftrace_caller keeps it in ftrace_regs, not in a frame record")
        return Frame(ret, after.sp, after.sp, Source.FRAME, after.stack, self.beyond | Flag.FGRAPH | _COMPLETE,
                     prov, extra={"complete": "return of a call the tracer is entering"})

    def _read_record(self, rec: int) -> tuple[int, int]:
        """``{frame->fp, frame->ra}`` of the aligned record at ``rec``, remembering the captured segment
        that holds it."""
        try:
            return self.cursor.pair(rec)
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, f"frame record at {rec:#x}: {e}") from None

    # stacktrace.c:83-86 walk_stackframe(): regs && regs->epc == pc && fp_is_valid(frame->ra, sp): the leaf rule
    def _leaf_rule(self, rec: int, ra_slot: int) -> Frame:
        fp = self.fp
        self.fp, self.sp, self.pc = ra_slot, fp, self.regs_ra
        self.sp_from_record = True
        self.live = None  # the kernel itself printed regs->ra
        prov = None
        if self.record:
            prov = Provenance("leaf rule: pc is regs->epc and frame->ra looks like a valid fp, "
                              "so fp = frame->ra and pc = regs->ra (a leaf that saved only s0)")
            prov.read(rec + STACKFRAME_RA, 8, ra_slot, "frame->ra (the caller's fp)")
            prov.note(self._bounds_note(fp, self.sp))
        if not kernel_text_address(self.pc, self.k.text):
            raise self._bad_pc_stop(self.pc, ra_slot, "regs->ra")
        return Frame(self.pc, fp, ra_slot, _SRC_LIVE_LR, self._kind(rec), self.beyond, prov)

    # stacktrace.c:92-96 walk_stackframe(): handle_exception <= pc < ret_from_exception_end: fn(arg, pc)
    def _exception_frame(self, rec: int, flags: Flag, prov: Provenance | None) -> Frame:
        if prov is not None:
            prov.note("return address in [handle_exception, ret_from_exception_end): printed, and the walk "
                      f"goes on from the pt_regs at sp {self.sp:#x} (its epc and s0)")
        if not kernel_text_address(self.pc, self.k.text):
            raise self._bad_pc_stop(self.pc, self.fp, f"frame->ra at {rec + STACKFRAME_RA:#x}")
        self.pending_regs = self.sp
        return Frame(self.pc, self.sp, self.fp, _SRC_FRAME, self._kind(rec), flags, prov)

    # stacktrace.c:97-98 walk_stackframe(): pc = ((struct pt_regs *)sp)->epc; fp = ((struct pt_regs *)sp)->s0
    def _next_regs_pc(self) -> Frame | Stop:
        regs = self.pending_regs
        assert regs is not None
        self.pending_regs = None
        k = self.k
        epc = self._read(regs + k.pt_epc, "pt_regs->epc")
        s0 = self._read(regs + k.pt_s0, "pt_regs->s0")
        self.pc, self.fp = epc, s0
        if not kernel_text_address(epc, k.text):
            status = self._read(regs + k.pt_status, "pt_regs->status")
            if not status & SR_SPP:  # the end of every user task's walk: returned, the sentence made when read
                return Stop(_USER_MODE, partial(user_mode_detail, regs, epc, status))
            raise UnwindStop(StopReason.BAD_PC, f"pt_regs at {regs:#x}: epc {epc:#x} is not kernel text")
        prov = None
        if self.record:
            prov = Provenance("exception frame: pc = pt_regs->epc, fp = pt_regs->s0 (pt_regs at the old fp)")
            prov.read(regs + k.pt_epc, 8, epc, "pt_regs->epc")
            prov.read(regs + k.pt_s0, 8, s0, "pt_regs->s0")
            prov.note("the kernel uses only epc and s0 here: pt_regs->ra is never printed")
        if self.complete:
            try:
                self.live = (epc, self.mem.read_u64(regs + k.pt_ra), f"pt_regs->ra at {regs + k.pt_ra:#x}")
            except MemoryFault:
                self.live = None
        return Frame(epc, self.sp, s0, _SRC_EXCEPTION_FRAME, self._kind(regs), self.beyond | _BOUNDARY, prov,
                     pt_regs=regs)

    # complete mode: the caller whose return address is only in ra (entry, frameless leaf, epilogue)
    def _next_live_ra(self) -> Frame | None:
        pc, ra, where = self.live  # type: ignore[misc]
        self.live = None
        if self.prover is None or self._kernel_leaf_rule_fires():
            return None
        proof, _why = self.prover.prove(pc)
        if proof is None:
            return None
        prov = None
        if self.record:
            prov = self._live_provenance(proof, ra, where)
        flags = self.beyond | _COMPLETE
        if ra == self.k.return_to_handler:
            ra, more = self._ftrace_graph_ret_addr(ra, None, pc, self.fp, -1, prov)
            flags |= more
        elif ra in self.k.rethook_trampolines:
            ra, more = self._recover_kretprobe(ra, self.fp, prov)
            flags |= more
        if not kernel_text_address(ra, self.k.text):
            return None
        self.pc = ra
        if self.k.handle_exception <= ra < self.k.ret_from_exception_end and proof.sp_at_entry:
            # called from the trap entry (do_trap_ecall_u+0): the pt_regs is at the unmoved sp
            self.pending_regs = self.sp
            if prov is not None:
                prov.note(f"a return into handle_exception with sp untouched: the pt_regs is at sp {self.sp:#x}")
        return Frame(ra, self.sp, self.fp, _SRC_LIVE_LR, self._kind(self.sp), flags, prov)

    @staticmethod
    def _live_provenance(proof: Proof, ra: int, where: str) -> Provenance:
        prov = Provenance(f"complete: caller held in ra ({proof.kind} of {proof.function})")
        prov.note(f"ra {ra:#x} from {where}")
        prov.note(f"proof: {proof.detail}")
        prov.note("the kernel reads the record at s0 - 16, which is the caller's own, and so skips this caller")
        return prov

    def _kernel_leaf_rule_fires(self) -> bool:
        """Would the kernel's own leaf rule print regs->ra at the next step?"""
        fp, sp = self.fp, self.sp
        if self.regs_epc != self.pc or not fp_is_valid(fp, sp, self.ts):
            return False
        try:
            return fp_is_valid(self.mem.read_u64(fp - STACKFRAME_SIZE + STACKFRAME_RA), fp, self.ts)
        except MemoryFault:
            return False

    # 6.12 passes current: a blocked task's ret_stack is never consulted; 7.x passes the task
    def _kernel_ret_stack(self) -> tuple[list[FgraphEntry], str | None]:
        """The ret_stack ftrace_graph_ret_addr() searches, and what the dump lacks of it."""
        task = self.t.task
        if self.k.fgraph_of_task or task.running:
            return task.fgraph, task.fgraph_lacks
        return [], None

    # stacktrace.c:90 ftrace_graph_ret_addr(current, &graph_idx, pc, &frame->ra)
    def _ftrace_graph_ret_addr(self, ra: int, retp: int | None, callee: int, caller_fp: int, frame_fp: int,
                               prov: Provenance | None) -> tuple[int, Flag]:
        """Resolve ``return_to_handler`` (``retp`` None: it was in a register); ``(pc, flags gained)``.

        Faithful mode gives the kernel's answer. Complete mode takes the
        ret_stack in order and checks each entry's ``func`` against the
        function the record belongs to: the kernel's ``retp`` test is not
        sound on riscv 6.12, whose ``retp`` is ``&fregs->ra`` in
        ``ftrace_caller``'s frame, a slot that can coincide with another
        function's ``&frame->ra`` and so yield a wrong caller.
        """
        handler = self.k.return_to_handler
        kernel_pc = ra
        if retp is not None:
            fgraph, lacks = self._kernel_ret_stack()
            kernel_pc, self.graph_idx, at = ftrace_graph_ret_addr(fgraph, self.graph_idx, ra, retp,
                                                                  handler, self.k.generation.fgraph_idx)
            if kernel_pc != handler:
                if prov is not None:
                    prov.note(f"ftrace_graph_ret_addr: return_to_handler -> {kernel_pc:#x} "
                              f"(ret_stack entry {at}, retp {retp:#x} = &frame->ra)")
            else:
                stop_on_lost_entries(lacks, f"return_to_handler at &frame->ra {retp:#x}")
                if prov is not None and not self.complete:
                    why = ("no ret_stack entry has retp == &frame->ra" if fgraph else
                           f"{self.generation.name} searches current's ret_stack, not this blocked task's")
                    prov.note(f"return_to_handler left as is: {why}")
        if not self.complete:
            return kernel_pc, (Flag.FGRAPH if kernel_pc != handler else _NONE)
        pc, flags = self._fgraph_by_order(ra, retp, callee, caller_fp, frame_fp, prov)
        if pc == handler:
            return kernel_pc, (Flag.FGRAPH if kernel_pc != handler else _NONE)
        if pc == kernel_pc:
            return pc, Flag.FGRAPH
        if prov is not None and kernel_pc != handler:
            prov.note(f"complete: the kernel's retp match gives {kernel_pc:#x}, which is not the return of "
                      f"the function at {callee:#x}")
        return pc, flags

    def _fgraph_by_order(self, ra: int, retp: int | None, callee: int, caller_fp: int, frame_fp: int,
                         prov: Provenance | None) -> tuple[int, Flag]:
        """Complete mode: the ret_stack entry of this hijacked return, taken in order.

        With the ``fp`` riscv records (the caller's ``s0`` at the hijack): the
        next entry, below the last one used, whose ``fp`` is ``caller_fp`` (the
        fp the record holds); entries above it are hijacks still in flight (a
        function being entered through ``ftrace_caller``, which builds no frame
        record): one whose ``fp`` is ``frame_fp`` returns into the function
        that owns the record, and is kept in :attr:`inflight`. Without it: the next
        entry, if its ``func`` is the function the record belongs to (that of
        ``callee``) or its ``retp`` is this record's ``&frame->ra``.
        """
        stack, handler = self.t.task.fgraph, self.k.return_to_handler
        k = self.fg_cursor if self.fg_cursor is not None else len(stack) - 1
        if k >= 0 and stack[k].fp:
            while k >= 0 and (stack[k].fp != caller_fp or stack[k].ret == handler):
                if stack[k].fp == frame_fp and stack[k].ret != handler and not self.inflight:
                    self.inflight = stack[k].ret  # a call from this frame, hijacked while being entered
                k -= 1
            if k < 0:
                if prov is not None:
                    prov.note(f"return_to_handler: no ret_stack entry left with fp {caller_fp:#x}")
                return ra, _NONE
            entry = stack[k]
            why = f"its fp {entry.fp:#x} is the fp this record holds"
        else:
            top_func = 0
            while k >= 0 and stack[k].ret == handler:  # tail calls: the real ret is further down
                top_func = top_func or stack[k].func
                k -= 1
            if k < 0:
                if prov is not None:
                    prov.note("return_to_handler: no ret_stack entry left to recover it")
                return ra, _NONE
            entry = stack[k]
            func = top_func or entry.func
            syms = self.t.symbols
            if retp is not None and entry.retp == retp:
                why = f"its retp {retp:#x} is this record's &frame->ra"
            elif func and syms is not None:
                want, have = syms.lookup(func), syms.lookup(callee)
                if want is None or have is None or want.addr != have.addr:
                    if prov is not None:
                        prov.note(f"return_to_handler: ret_stack entry {k} is for {func:#x}, not for the function "
                                  f"at {callee:#x}: not recovered")
                    return ra, _NONE
                why = f"its func {func:#x} is the function at {callee:#x}"
            else:
                why = "no symbols to check its func"
        self.fg_cursor = k - 1
        if prov is not None:
            prov.note(f"complete: return_to_handler -> {entry.ret:#x} from ret_stack entry {k}, the next in order "
                      f"({why}); riscv records &fregs->ra as retp"
                      + ("" if self.generation.fgraph_of_task else ", and the kernel searches only current's ret_stack"))
        return entry.ret, Flag.FGRAPH | _COMPLETE

    # complete mode: rethook_find_ret_addr(task, frame, &cur) in kernel/trace/rethook.c
    def _recover_kretprobe(self, ra: int, frame_fp: int, prov: Provenance | None) -> tuple[int, Flag]:
        """The rethook/kretprobe instance whose frame is ``frame_fp``: ``(pc, flags gained)``."""
        ret, self.kr_cur = rethook_find_ret_addr(self.t.task.kretprobes, frame_fp, self.kr_cur, ra)
        if ret:
            if prov is not None:
                prov.note(f"complete: rethook trampoline -> {ret:#x} from the instance with "
                          f"frame {frame_fp:#x} (the riscv walk prints the trampoline)")
            return ret, Flag.KRETPROBE | _COMPLETE
        if prov is not None:
            prov.note(f"rethook trampoline: no instance with frame {frame_fp:#x}")
        return ra, _NONE

    # complete mode: the record call_on_irq_stack leaves at the top of the IRQ stack
    def _cross_irq_stack(self) -> str | None:
        """Accept the task-stack fp the kernel refuses at ``call_on_irq_stack``; a note, or None."""
        here = self._irq_switch_record()
        if here is None:
            return None
        fp, sp = self.fp, self.sp
        self.sp = fp - STACKFRAME_SIZE
        self.beyond = _COMPLETE
        return (f"complete: crossed from the {here.label()} stack (top {sp:#x}) to the task stack through the "
                f"record call_on_irq_stack keeps at {fp - STACKFRAME_SIZE:#x}; the kernel stops here")

    # entry.S call_on_irq_stack: the {fp, ra} record it pushes at the top of the IRQ stack
    def _irq_switch_record(self, at_entry: bool = False) -> StackInfo | None:
        """The per-CPU stack ``sp`` is at the top of, when fp is ``call_on_irq_stack``'s record on the task stack.

        With ``at_entry`` the pc may also be the first instruction of the handler ``call_on_irq_stack``
        called (the starting registers: ``regs->ra`` in ``call_on_irq_stack``, sp still the stack top).
        """
        fp, sp = self.fp, self.sp
        lo, hi = self.k.call_on_irq_stack
        entered = at_entry and self.regs_epc == self.pc and lo <= self.regs_ra < hi
        if not (lo <= self.pc < hi or entered) or fp & 7:
            return None
        here = self.stacks.kind_of(sp)
        there = self.stacks.kind_of(fp - STACKFRAME_SIZE)
        if here is None or here.kind == "task" or sp != here.high or there is None or there.kind != "task":
            return None
        return here

    # --- stops ------------------------------------------------------------------------------

    # stacktrace.c:77-78 walk_stackframe(): if (!fp_is_valid(fp, sp)) break
    def _invalid_fp_stop(self) -> Stop:
        """Why ``fp_is_valid()`` failed, as a stop reason."""
        fp, sp, pc = self.fp, self.sp, self.pc
        if fp == 0:
            return Stop(_END_OF_STACK, FP_ZERO_DETAIL)
        if sp == task_pt_regs(self.stacks.known, self.k.pt_regs_space) and (self.sp_from_record
                                                                          or self.t.task.regs is None):
            return self._first_frame_stop(fp, sp, pc)
        if fp & 7:
            return Stop(StopReason.MISALIGNED_FP, f"fp {fp:#x} (sp {sp:#x})")
        low, high = fp_bounds(sp, self.ts)
        window = f"[sp+16, ALIGN(sp, THREAD_SIZE)] = [{low:#x}, {high:#x}]"
        if low > high:
            window = f"[sp+16, ALIGN(sp, THREAD_SIZE)], an empty window (sp {sp:#x} is on a THREAD_SIZE boundary)"
        here, there = self.stacks.kind_of(sp), self.stacks.kind_of(fp - STACKFRAME_SIZE)
        if self._irq_switch_record(at_entry=True) is not None:
            return Stop(StopReason.KERNEL_LIMIT,
                        f"{self.generation.name} walk_stackframe does not leave the {here.kind} stack at call_on_irq_stack: "
                        f"fp {fp:#x} on the task stack is outside {window} (--complete crosses)")
        if there is not None and here is not None and here.kind != there.kind:
            return Stop(StopReason.TRANSITION_REFUSED,
                        f"{self.generation.name} walk_stackframe does not leave the {here.kind} stack: fp {fp:#x} on the "
                        f"{there.kind} stack is outside {window} (--complete crosses at call_on_irq_stack)")
        if fp < low and there is not None:
            return Stop(StopReason.TRANSITION_REFUSED, f"fp {fp:#x} is below sp+16 = {low:#x}: "
                                                       "the record would not move up the stack")
        if fp < UPPER_HALF:
            if self._before_handler_prologue():
                return self._handler_entry_stop(fp, window)
            window += " (a user address: s0 still holds the user sp, as at the trap entry)"
        return Stop(StopReason.OUTSIDE_STACK, f"fp {fp:#x} outside {window}")

    # handle_exception calls the trap handler with ra in the entry code; s0 is user mode's until its prologue
    def _before_handler_prologue(self) -> bool:
        """Is the walk at its first step from the CPU's registers, in a handler the trap entry called
        (``ra`` in ``[handle_exception, ret_from_exception_end)``; 6.1: ``ret_from_exception``)?"""
        lo, hi = self.k.exc_frame
        return (not self.sp_from_record and self.t.task.regs is not None and self.pc == self.regs_epc
                and lo <= self.regs_ra < hi)

    def _handler_entry_stop(self, fp: int, window: str) -> Stop:
        """The kernel's walk from a CPU stopped in a trap handler before its prologue: ``fp_is_valid()``
        fails on the user's s0 after the handler's pc, so ``walk_stackframe()`` ends there."""
        sym = self.t.symbols.lookup(self.pc) if self.t.symbols is not None else None
        name = sym.name if sym is not None else f"{self.pc:#x}"
        return Stop(StopReason.KERNEL_LIMIT,
                    f"fp {fp:#x} outside {window} is s0 as user mode left it: the trap entry called {name} "
                    f"(ra {self.regs_ra:#x}), whose prologue has not set s0 yet; fp_is_valid() fails, so "
                    "walk_stackframe() ends after the handler's pc (--complete goes on from ra)")

    # the end of every task's chain: the first kernel frame of a task has task_pt_regs(tsk) as its fp
    def _first_frame_stop(self, fp: int, sp: int, pc: int) -> Stop:
        """The record just read was the task's first (its fp is ``task_pt_regs(tsk)``): a clean end.

        A kernel thread starts at ``ret_from_fork`` (6.1, 6.12) or
        ``ret_from_fork_kernel_asm`` (7.x) with sp at its pt_regs, so the first
        C function's frame pointer is ``task_pt_regs(tsk)`` and its saved fp
        is whatever s0 held (the thread function): the kernel's walk stops
        there. The symbol's name is only reported.
        """
        # the end of every walk: the sentence is made when read
        return Stop(_END_OF_STACK, partial(first_frame_detail, self.t, self.k.pt_regs, fp, sp, pc))

    def _bad_pc_stop(self, pc: int, fp: int, where: str) -> UnwindStop:
        if pc == 0 and fp == 0:
            return UnwindStop(StopReason.END_OF_STACK, f"zero record ({where})")
        lo, hi = self.k.head_text
        if lo <= pc < hi:
            return self._head_text_stop(pc, where)
        return UnwindStop(StopReason.BAD_PC, f"{pc:#x} from {where} is not kernel text")

    # walk_stackframe(): if (!__kernel_text_address(pc)) break; head.S's code lies before _stext
    def _head_text_stop(self, pc: int, where: str) -> UnwindStop:
        """An idle task: its chain ends in head.S, the boot hart's in ``_start_kernel`` (which called
        ``start_kernel()``), a secondary hart's in ``secondary_start_sbi`` (which called ``smp_callin()``); that
        code is in ``.head.text``, which ``__kernel_text_address()`` does not count, so the kernel's walk ends
        there without printing it."""
        sym = self.t.symbols.lookup(pc) if self.t.symbols is not None else None
        name = f" ({sym.name}+{sym.offset:#x})" if sym is not None else ""
        return UnwindStop(StopReason.END_OF_STACK,
                          f"{pc:#x}{name} from {where} is in .head.text, the boot code before _stext: not kernel "
                          "text, so walk_stackframe() ends there without printing it")


#: the stop when fp_is_valid() fails on a zero fp
FP_ZERO_DETAIL = "fp is 0"


def user_mode_detail(regs: int, epc: int, status: int) -> str:
    """The stop at a user-mode ``pt_regs`` (:meth:`RiscvUnwinder._next_regs_pc`)."""
    return f"pt_regs at {regs:#x}: epc {epc:#x} in user mode (status {status:#x})"


def first_frame_detail(target: Target, pt: StructLayout, fp: int, sp: int, pc: int) -> str:
    """The stop at the task's first frame (:meth:`RiscvUnwinder._first_frame_stop`)."""
    sym = target.symbols.lookup(pc) if target.symbols is not None else None
    name = f" {sym.name}," if sym is not None else ""
    return (f"reached{name} the first frame of the task: its record's fp {sp:#x} is task_pt_regs(tsk) "
            f"({pt.source} sizeof(pt_regs) {pt.size}); the saved fp {fp:#x} is not a frame")
