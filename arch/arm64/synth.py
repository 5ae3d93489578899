"""arm64 scenario builders on top of :class:`unwind.dev.synth.SynthDump`.

Stacks are filled with frame records, ``pt_regs`` of either generation and the
final record at ``task_pt_regs(tsk)->stackframe``; return addresses can be
PAC-signed with the dump's mask; a tiny image of hand-assembled instructions
serves complete mode. The expected trace of every scenario follows from how
it was built.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from unwind.formats.dump import Dump
from unwind.session.replay import Session
from unwind.kernel.symbols import SymbolTable
from unwind.dev.synth import SynthDump, SynthStack
from unwind.core.target import Task
from unwind.core.walk import StopReason

from .structs import (FRAME_META_TYPE_FINAL, FRAME_META_TYPE_PT_REGS, META_RECORDS_SINCE, PtRegsLayout,
                      pt_regs_table)

#: Debian 6.12 under QEMU -cpu max runs 52-bit VA: GENMASK(63, 52)
PAC_MASK_52 = 0xFFF0000000000000
#: the 48-bit mask (GENMASK(63, 48)): -cpu cortex-a57, older QEMU
PAC_MASK_48 = 0xFFFF000000000000
#: PSR_MODE_EL1h with DAIF masked: a kernel pt_regs
PSTATE_EL1H = 0x3C5
BIT55 = 1 << 55

#: a made-up kernel text layout (addresses as on a nokaslr arm64 guest)
TEXT = 0xFFFF800080010000
VECTORS = TEXT + 0x800
RETURN_TO_HANDLER = TEXT + 0x1C000
KRETPROBE_TRAMPOLINE = TEXT + 0x1D000


def sign(addr: int, pac: int, mask: int = PAC_MASK_52) -> int:
    """``addr`` with a PAC in the mask bits (bit 55 kept, as the hardware keeps it)."""
    pattern = (pac & 0xFFFF) * 0x0001000100010001
    return (addr & ~mask) | (pattern & mask & ~BIT55) | (addr & BIT55)


# Hand-assembled AArch64 instructions (little-endian words)
PACIASP = 0xD503233F
AUTIASP = 0xD50323BF
NOP = 0xD503201F
STP_FP_LR_PRE16 = 0xA9BF7BFD   # stp x29, x30, [sp, #-16]!
STP_FP_LR_PRE32 = 0xA9BE7BFD   # stp x29, x30, [sp, #-32]!
MOV_FP_SP = 0x910003FD         # mov x29, sp
LDP_FP_LR_POST16 = 0xA8C17BFD  # ldp x29, x30, [sp], #16
RET = 0xD65F03C0               # ret
ADD_X0_X0_1 = 0x91000400       # add x0, x0, #1
MOV_X1_X0 = 0xAA0003E1         # mov x1, x0
BR_X16 = 0xD61F0200            # br x16
BTI_C = 0xD503245F             # bti c


def bl(at: int, target: int) -> int:
    """``bl target`` placed at ``at``."""
    return 0x94000000 | (((target - at) >> 2) & 0x3FFFFFF)


#: condition codes for :func:`bcond`
EQ, NE = 0x0, 0x1


def bcond(at: int, target: int, cond: int) -> int:
    """``b.<cond> target`` placed at ``at``."""
    return 0x54000000 | ((((target - at) >> 2) & 0x7FFFF) << 5) | cond


def b(at: int, target: int) -> int:
    """``b target`` placed at ``at``."""
    return 0x14000000 | (((target - at) >> 2) & 0x3FFFFFF)


class SynthImage:
    """The slice of :class:`unwind.formats.image.Image` complete mode reads: ``has_text`` and ``text()``."""

    machine = "EM_AARCH64"

    def __init__(self) -> None:
        self._code: dict[int, bytes] = {}

    def put(self, addr: int, words: Sequence[int], size: int = 0x100) -> None:
        """Place instruction words at ``addr``, padded with NOPs to ``size`` bytes (a whole function)."""
        words = list(words) + [NOP] * max(0, size // 4 - len(words))
        self._code[addr] = struct.pack(f"<{len(words)}I", *words)

    @property
    def has_text(self) -> bool:
        """True: the image carries instructions."""
        return True

    def text(self, addr: int, size: int) -> bytes | None:
        """Bytes at ``[addr, addr + size)`` when one placed block holds them."""
        for start, data in self._code.items():
            if start <= addr and addr + size <= start + len(data):
                return data[addr - start:addr - start + size]
        return None


class Arm64Synth:
    """A synthetic arm64 dump of one kernel generation ("6.1", "6.12", "6.13", "6.18", "7.2", ...).

    Its stacks follow that generation's ``pt_regs`` (the table's declaration).
    With ``release=False`` the dump names no kernel release, so a replay must
    find the generation and the layout in the stacks themselves.
    """

    def __init__(self, generation: str = "6.12", *, pac_mask: int | None = PAC_MASK_52,
                 vmcoreinfo: dict[str, str] | None = None, release: bool = True) -> None:
        self.sd = SynthDump("arm64", release=f"{generation}.0-synthetic")
        if not release:
            self.sd.release = ""
            del self.sd.vmcoreinfo["OSRELEASE"]
        self.version = tuple(int(x) for x in generation.split(".")[:2])
        self.meta_records = self.version >= META_RECORDS_SINCE
        self.layout: PtRegsLayout = PtRegsLayout.of(pt_regs_table(self.version, self.meta_records))
        if pac_mask is not None:
            self.sd.vmcoreinfo["NUMBER(KERNELPACMASK)"] = f"{pac_mask:#x}"
        self.sd.vmcoreinfo.update(vmcoreinfo or {})
        self.sd.symbol_hints.update({"return_to_handler": hex(RETURN_TO_HANDLER),
                                     "__kretprobe_trampoline": hex(KRETPROBE_TRAMPOLINE),
                                     "vectors": hex(VECTORS)})
        self.image = SynthImage()

    # -- stacks and records ----------------------------------------------------
    def task_stack(self, pid: int, low: int, size: int = 0x4000, *, cpu: int | None = None,
                   final: bool = True) -> SynthStack:
        """A task stack; with ``final`` its top pt_regs holds the final record (an EL0 entry)."""
        st = self.sd.stack("task", low, size, pid=pid, cpu=cpu)
        if final:
            self.final_record(st)
        return st

    def final_fp(self, st: SynthStack) -> int:
        """``&task_pt_regs(tsk)->stackframe`` of a task stack."""
        return st.high - self.layout.size + self.layout.stackframe

    def final_fp_of(self, pid: int) -> int:
        """``&task_pt_regs(tsk)->stackframe`` of the task stack of ``pid``."""
        return self.final_fp(next(s for s in self.sd.stacks if s.kind == "task" and s.pid == pid))

    def final_record(self, st: SynthStack) -> int:
        """Write the final record: v6.12 ``{0, 0}``, v6.13+ ``{0, 0, FRAME_META_TYPE_FINAL}``."""
        at = self.final_fp(st)
        st.put(at, 0, 0, *([FRAME_META_TYPE_FINAL] if self.meta_records else []))
        return at

    @staticmethod
    def chain(st: SynthStack, fps: Sequence[int], lrs: Sequence[int], last_fp: int) -> None:
        """Records ``fps[i] = {fps[i+1], lrs[i]}``; the last one's fp is ``last_fp``."""
        for i, fp in enumerate(fps):
            st.put(fp, fps[i + 1] if i + 1 < len(fps) else last_fp, lrs[i])

    def pt_regs(self, st: SynthStack, base: int, *, pc: int, x29: int, x30: int,
                pstate: int = PSTATE_EL1H, sp: int | None = None) -> int:
        """An EL1 exception's pt_regs at ``base``; returns the address x29 points at (its stackframe).

        v6.12 writes ``{x29, pc}`` there (``stp x29, x22``); v6.13+ writes a
        ``FRAME_META_TYPE_PT_REGS`` meta record.
        """
        lay = self.layout
        st.put(base + lay.reg(29), x29, x30, sp if sp is not None else base + lay.size, pc, pstate)
        at = base + lay.stackframe
        if self.meta_records:
            st.put(at, 0, 0, FRAME_META_TYPE_PT_REGS)
        else:
            st.put(at, x29, pc)
        return at

    # -- tasks ------------------------------------------------------------------
    def blocked(self, pid: int, comm: str, *, fp: int, pc: int, sp: int, **extra: Any) -> None:
        """A task blocked in cpu_switch_to() with this saved context."""
        self.sd.blocked_task(pid, comm, {"fp": fp, "pc": pc, "sp": sp}, **extra)

    def running(self, pid: int, comm: str, cpu: int, *, pc: int, x29: int, sp: int, x30: int = 0,
                pstate: int = PSTATE_EL1H, normalised: str | None = None, **extra: Any) -> None:
        """A task running on ``cpu`` with these registers."""
        self.sd.running_task(pid, comm, cpu, {"pc": pc, "x29": x29, "x30": x30, "sp": sp, "pstate": pstate},
                             **extra)
        if normalised is not None:
            self.sd.cpus[-1]["normalised"] = normalised

    # -- output -----------------------------------------------------------------
    def dump(self) -> Dump:
        """Write and read back the dump."""
        return self.sd.dump()

    def session(self, symbols: Iterable[tuple[int, str]] = (), *, with_text: bool = False) -> Session:
        """A replay session; ``symbols`` are ``(addr, name)`` text symbols (plus the trampolines)."""
        entries = [(a, "T", n) for a, n in symbols]
        entries += [(RETURN_TO_HANDLER, "T", "return_to_handler"), (KRETPROBE_TRAMPOLINE, "T", "__kretprobe_trampoline"),
                    (VECTORS, "T", "vectors"), (TEXT + 0x100000, "T", "_etext")]
        return Session(self.dump(), self.image if with_text else None, SymbolTable(entries))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Scenarios: each returns the session, the task and the trace expected by construction
# ---------------------------------------------------------------------------

TASK_LOW = 0xFFFF800083000000
IRQ_LOW = 0xFFFF800082508000
OVERFLOW_LOW = 0xFFFF800082600000
STACK_SIZE = 0x4000
OVERFLOW_SIZE = 0x1000


def fn(i: int) -> int:
    """Start of the made-up function ``func<i>`` (0x100 bytes each)."""
    return TEXT + 0x2000 + 0x100 * i


def ret(i: int) -> int:
    """A return address inside ``func<i>``."""
    return fn(i) + 0x40


#: symbols of the made-up functions, for sessions
FUNCS = [(fn(i), f"func{i}") for i in range(64)]


@dataclass
class Scenario:
    """A built dump, the task to walk and its known answer."""

    session: Session
    task: Task
    expected: list[int]
    stop: StopReason
    synth: "Arm64Synth"
    notes: dict[str, Any] = field(default_factory=dict)


def _scenario(a: Arm64Synth, expected: list[int], stop: StopReason, *, pid: int | None = None,
              cpu: int | None = None, with_text: bool = False, **notes: Any) -> Scenario:
    s = a.session(FUNCS, with_text=with_text)
    task = s.select(pid=pid, cpu=cpu)[0]
    return Scenario(s, task, expected, stop, a, dict(notes))


def deep_chain(generation: str, depth: int = 64) -> Scenario:
    """A blocked task with ``depth`` records on its stack, signed and unsigned LRs alternating."""
    a = Arm64Synth(generation)
    st = a.task_stack(7, TASK_LOW)
    fps = [TASK_LOW + 0x800 + 0x30 * i for i in range(depth)]
    pcs = [ret(i % 60) for i in range(depth)]
    lrs = [sign(pc, 0x1234 + i) if i % 2 == 0 else pc for i, pc in enumerate(pcs)]
    a.chain(st, fps, lrs, a.final_fp(st))
    a.blocked(7, "deep", fp=fps[0], pc=ret(63), sp=fps[0] - 0x40)
    return _scenario(a, [ret(63)] + pcs, StopReason.END_OF_STACK, pid=7, signed=lrs)


def irq_to_task(generation: str) -> Scenario:
    """A running task interrupted: three records on CPU0's IRQ stack, then two on the task stack."""
    a = Arm64Synth(generation)
    task = a.task_stack(8, TASK_LOW, cpu=0)
    irq = a.sd.stack("irq", IRQ_LOW, STACK_SIZE, cpu=0)
    irq_fps = [IRQ_LOW + STACK_SIZE - 0x100 + 0x30 * i for i in range(3)]
    task_fps = [TASK_LOW + 0x3000, TASK_LOW + 0x3100]
    lrs = [sign(ret(i), 0x77 + i) for i in range(5)]
    a.chain(irq, irq_fps, lrs[:3], task_fps[0])
    a.chain(task, task_fps, lrs[3:], a.final_fp(task))
    a.running(8, "busy", 0, pc=fn(40) + 8, x29=irq_fps[0], sp=irq_fps[0] - 0x20)
    return _scenario(a, [fn(40) + 8] + [ret(i) for i in range(5)], StopReason.END_OF_STACK, cpu=0,
                     stacks=["irq"] * 3 + ["task"] * 2)


def overflow(generation: str) -> Scenario:
    """A running task on CPU0's overflow stack: overflow -> IRQ -> task."""
    a = Arm64Synth(generation)
    task = a.task_stack(9, TASK_LOW, cpu=0)
    irq = a.sd.stack("irq", IRQ_LOW, STACK_SIZE, cpu=0)
    ovf = a.sd.stack("overflow", OVERFLOW_LOW, OVERFLOW_SIZE, cpu=0)
    o_fp, i_fp, t_fp = OVERFLOW_LOW + 0xF00, IRQ_LOW + 0x3F00, TASK_LOW + 0x3800
    ovf.put(o_fp, i_fp, sign(ret(1), 5))
    irq.put(i_fp, t_fp, sign(ret(2), 6))
    task.put(t_fp, a.final_fp(task), ret(3))
    a.running(9, "deep-recursion", 0, pc=fn(41) + 4, x29=o_fp, sp=o_fp - 0x10)
    return _scenario(a, [fn(41) + 4, ret(1), ret(2), ret(3)], StopReason.END_OF_STACK, cpu=0,
                     stacks=["overflow", "irq", "task"])


def el1_exception(generation: str, *, with_text: bool = False, entry_pc: bool = True) -> Scenario:
    """An IRQ taken at EL1 in ``func20`` (called by ``func21``, itself called by ``func22``).

    The IRQ handler runs on the IRQ stack; its chain reaches the interrupted
    context through the ``pt_regs`` on the task stack: an ``{x29, ELR}`` record
    in v6.12, a ``FRAME_META_TYPE_PT_REGS`` record in v6.13+. ``func20`` was
    interrupted at its entry (``entry_pc``, x30 live) or after ``mov x29, sp``.
    ``notes["complete"]`` is the trace complete mode adds ``func21`` to.
    """
    a = Arm64Synth(generation)
    task = a.task_stack(10, TASK_LOW, cpu=0)
    irq = a.sd.stack("irq", IRQ_LOW, STACK_SIZE, cpu=0)
    f20 = fn(20)
    a.image.put(f20, [NOP, NOP, PACIASP, STP_FP_LR_PRE16, MOV_FP_SP, bl(f20 + 20, fn(30)), LDP_FP_LR_POST16,
                      AUTIASP, RET])
    elr = f20 + 8 if entry_pc else f20 + 20
    regs_base = TASK_LOW + 0x2000
    caller_fp = TASK_LOW + 0x2400   # func21's record: returns into func22
    func20_fp = TASK_LOW + 0x2200   # func20's own record (above the pt_regs), once it has one
    x29 = caller_fp if entry_pc else func20_fp
    if not entry_pc:
        task.put(func20_fp, caller_fp, sign(ret(21), 0x33))
    task.put(caller_fp, TASK_LOW + 0x2500, sign(ret(22), 0x44))
    task.put(TASK_LOW + 0x2500, a.final_fp(task), ret(23))
    frame_at = a.pt_regs(task, regs_base, pc=elr, x29=x29, x30=sign(ret(21), 0x33))
    # handler side: el1h_64_irq_handler <- call_on_irq_stack <- handler on the IRQ stack
    t_fp = regs_base - 0x40
    task.put(t_fp, frame_at, sign(ret(12), 0x55))             # el1_interrupt's record -> pt_regs
    i_fps = [IRQ_LOW + 0x3E00, IRQ_LOW + 0x3E40]
    a.chain(irq, i_fps, [sign(ret(10), 1), ret(11)], t_fp)    # call_on_irq_stack's LR is unsigned
    a.running(10, "irq-victim", 0, pc=fn(50) + 0xC, x29=i_fps[0], sp=i_fps[0] - 0x30, x30=sign(ret(10), 1))
    head = [fn(50) + 0xC, ret(10), ret(11), ret(12), elr]
    tail = ([ret(21)] if not entry_pc else []) + [ret(22), ret(23)]
    return _scenario(a, head + tail, StopReason.END_OF_STACK, cpu=0, with_text=with_text,
                     boundary_index=4, complete=head + ([ret(21)] if entry_pc else []) + tail)


def fgraph_hijack(generation: str) -> Scenario:
    """Two returns hijacked by the function-graph tracer, one with a tail-call duplicate entry.

    The return stack (bottom to top) holds func6's real return for the deeper
    hijack, then the real return and a tail-call entry (``ret ==
    return_to_handler``) for the top one; each keyed by the fp its record holds.
    """
    a = Arm64Synth(generation)
    st = a.task_stack(11, TASK_LOW)
    fps = [TASK_LOW + 0x3000 + 0x40 * i for i in range(4)]
    lrs = [sign(RETURN_TO_HANDLER, 0x99), ret(3), RETURN_TO_HANDLER, ret(5)]
    a.chain(st, fps, lrs, a.final_fp(st))
    fgraph = [{"ret": ret(6), "retp": fps[3], "func": fn(2)},
              {"ret": ret(2), "retp": fps[1], "func": fn(1)},
              {"ret": RETURN_TO_HANDLER, "retp": fps[1], "func": fn(0)}]
    a.blocked(11, "traced", fp=fps[0], pc=ret(1), sp=fps[0] - 0x10, fgraph=fgraph)
    return _scenario(a, [ret(1), ret(2), ret(3), ret(6), ret(5)], StopReason.END_OF_STACK, pid=11,
                     recovered=[1, 3])


def kretprobe_hijack(generation: str) -> Scenario:
    """Two returns hijacked by kretprobes, one with a tail-call duplicate instance (newest first)."""
    a = Arm64Synth(generation)
    st = a.task_stack(12, TASK_LOW)
    fps = [TASK_LOW + 0x3000 + 0x40 * i for i in range(3)]
    final = a.final_fp(st)
    lrs = [sign(KRETPROBE_TRAMPOLINE, 0x42), ret(3), KRETPROBE_TRAMPOLINE]
    a.chain(st, fps, lrs, final)
    instances = [{"ret": KRETPROBE_TRAMPOLINE, "fp": fps[1]},
                 {"ret": ret(2), "fp": fps[1]},
                 {"ret": ret(7), "fp": final}]
    a.blocked(12, "probed", fp=fps[0], pc=ret(1), sp=fps[0] - 0x10, kretprobes=instances)
    return _scenario(a, [ret(1), ret(2), ret(3), ret(7)], StopReason.END_OF_STACK, pid=12, recovered=[1, 3])


def preempted_in_irq(generation: str, *, release: bool = True) -> Scenario:
    """A task preempted at the end of an EL1 IRQ (``preempt_schedule_irq()``), blocked since.

    Its chain, from ``thread.cpu_context``: three records of the IRQ exit
    path (``__schedule`` <- ``preempt_schedule_irq`` <- ``el1_interrupt``),
    the record ``el1h_64_irq`` builds at the ``pt_regs`` of the exception
    (v6.13+: a ``FRAME_META_TYPE_PT_REGS`` record), then the interrupted
    ``func30``, whose own record sits right above that ``pt_regs`` (where
    the interrupted sp was), and its callers down to the final record. A walk
    that takes the wrong ``sizeof(struct pt_regs)`` consumes past that record
    and refuses it.
    """
    a = Arm64Synth(generation, release=release)
    st = a.task_stack(20, TASK_LOW)
    size = a.layout.size
    regs_base = TASK_LOW + 0x3000
    f30_fp = regs_base + size                     # the interrupted func30's record: at its sp
    callers = [f30_fp + 0x40, f30_fp + 0x80]     # func31, func32
    st.put(f30_fp, callers[0], sign(ret(31), 0x31))
    a.chain(st, callers, [sign(ret(32), 0x32), ret(33)], a.final_fp(st))
    elr = fn(30) + 0x24
    frame_at = a.pt_regs(st, regs_base, pc=elr, x29=f30_fp, x30=sign(ret(31), 0x31))
    exit_fps = [regs_base - 0xC0, regs_base - 0x80, regs_base - 0x40]
    a.chain(st, exit_fps, [sign(ret(1), 1), sign(ret(2), 2), sign(ret(3), 3)], frame_at)
    a.blocked(20, "preempted", fp=exit_fps[0], pc=ret(0), sp=exit_fps[0] - 0x20)
    return _scenario(a, [ret(0), ret(1), ret(2), ret(3), elr, ret(31), ret(32), ret(33)],
                     StopReason.END_OF_STACK, pid=20, boundary_index=4)


#: the scenarios that end cleanly, by name, for both generations
CLEAN_SCENARIOS = {f.__name__: f for f in (deep_chain, irq_to_task, overflow, el1_exception,
                                            fgraph_hijack, kretprobe_hijack, preempted_in_irq)}


def long_chain(generation: str, frames: int = 4096) -> Scenario:
    """A blocked task with ``frames`` frames on a large task stack (a benchmark shape), all LRs signed."""
    a = Arm64Synth(generation)
    size = 0x20 * frames + 0x1000
    size = 1 << (size - 1).bit_length()
    st = a.task_stack(13, TASK_LOW, size=size)
    fps = [TASK_LOW + 0x100 + 0x10 * i for i in range(frames - 1)]
    pcs = [TEXT + 0x2000 + 4 * i for i in range(frames - 1)]
    a.chain(st, fps, [sign(pc, i) for i, pc in enumerate(pcs)], a.final_fp(st))
    a.blocked(13, "deep", fp=fps[0], pc=TEXT + 0x1000, sp=fps[0])
    return _scenario(a, [TEXT + 0x1000] + pcs, StopReason.END_OF_STACK, pid=13)
