"""Synthetic RISC-V kernels whose traces are known by construction.

:class:`RiscvSynth` lays out a fake kernel text (named functions at known
addresses, a few of them with real, hand-assembled instructions in a
:class:`TextImage`), task/IRQ stacks, ``{fp, ra}`` records and ``pt_regs``, on
top of :class:`unwind.dev.synth.SynthDump`. The scenario functions return a
:class:`Scenario`: a replay session plus the pcs each mode must print and the
stop each must reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unwind.formats.dump import Dump
from unwind.core.frame import Flag
from unwind.session.replay import Session
from unwind.kernel.symbols import SymbolTable
from unwind.dev.synth import SynthDump, SynthStack
from unwind.core.target import Task
from unwind.core.walk import StopReason

from .structs import GPR_NAMES, PT_SIZE, SR_SPP, STACKFRAME_SIZE, pt_regs

TEXT_BASE = 0xFFFFFFFF80000000
THREAD_SIZE = 0x4000
#: IRQ stacks are allocated first, below every task stack (as on the real riscv64 guest)
IRQ_BASE = 0xFF20000000000000
TASK_BASE = 0xFF20000000100000
USER_STACK_TOP = 0x3FFFFFF000
USER_PC = 0x2AAAAB1230
SR_SPIE = 0x20

#: the kernel text, in address order: (name, size)
FUNCTIONS: tuple[tuple[str, int], ...] = (
    ("handle_exception", 0x200), ("ret_from_exception", 0x80), ("ret_from_exception_end", 0x20),
    ("ret_from_fork", 0x40), ("call_on_irq_stack", 0x40), ("__switch_to", 0x100),
    ("return_to_handler", 0x40), ("arch_rethook_trampoline", 0x40),
    *((name, 0x400) for name in (
        "do_irq", "handle_riscv_irq", "handle_percpu_devid_irq", "riscv_timer_interrupt",
        "__schedule", "schedule", "schedule_timeout", "do_nanosleep", "hrtimer_nanosleep",
        "__riscv_sys_clock_nanosleep", "do_trap_ecall_u", "kthread", "worker_thread",
        "do_page_fault", "handle_mm_fault", "__clear_user", "read_zero", "vfs_read", "ksys_read",
        "__riscv_sys_read", "rcu_all_qs", "__cond_resched", "probed_fn", "leaf_saves_s0")),
)

# Hand-assembled RV64GC instructions (checked with llvm-mc -triple=riscv64 -mattr=+c and capstone).
NOP = bytes.fromhex("13000000")          # nop (addi zero, zero, 0): the patchable-entry slots
C_ADDI_SP_M32 = bytes.fromhex("0111")    # c.addi sp, -32
C_SDSP_RA_24 = bytes.fromhex("06ec")     # c.sdsp ra, 24(sp)
C_SDSP_S0_16 = bytes.fromhex("22e8")     # c.sdsp s0, 16(sp)
C_ADDI4SPN_S0_32 = bytes.fromhex("0010")  # c.addi4spn s0, sp, 32
JAL_RA_16 = bytes.fromhex("ef000001")    # jal ra, 16 (a call)
C_LDSP_RA_24 = bytes.fromhex("e260")     # c.ldsp ra, 24(sp)
C_LDSP_S0_16 = bytes.fromhex("4264")     # c.ldsp s0, 16(sp)
C_ADDI16SP_32 = bytes.fromhex("0561")    # c.addi16sp sp, 32
RET = bytes.fromhex("8280")              # ret (c.jr ra)
C_LI_A0_0 = bytes.fromhex("0145")        # c.li a0, 0
C_BEQZ_A0_8 = bytes.fromhex("01c5")      # c.beqz a0, 8
C_LD_A5_A0 = bytes.fromhex("1c61")       # c.ld a5, 0(a0)
C_NOP = bytes.fromhex("0100")            # c.nop
SW_ZERO_A0 = bytes.fromhex("23200500")   # sw zero, 0(a0)
CSRRW_TP = bytes.fromhex("73120214")     # csrrw tp, sscratch, tp
BNEZ_TP_16 = bytes.fromhex("63180200")   # bnez tp, 16
CSRR_TP = bytes.fromhex("73220014")      # csrr tp, sscratch
SD_SP_TP = bytes.fromhex("23382200")     # sd sp, 16(tp)
LD_S0_TP = bytes.fromhex("03348201")     # ld s0, 24(tp)

#: a function with a 32-byte frame: entry +0x8, ra stored +0xc, s0 set +0x10, call +0x10,
#: return address +0x14, epilogue restores ra/s0 by +0x18, ret at +0x1a
FRAMED_CODE = (NOP + NOP + C_ADDI_SP_M32 + C_SDSP_RA_24 + C_SDSP_S0_16 + C_ADDI4SPN_S0_32 + JAL_RA_16
               + C_LDSP_RA_24 + C_LDSP_S0_16 + C_ADDI16SP_32 + RET)
FRAMED_CALL_RET = 0x14
#: a frameless leaf (rcu_all_qs, __clear_user): no write to ra or s0 anywhere
LEAF_CODE = NOP + NOP + C_LI_A0_0 + C_BEQZ_A0_8 + C_LD_A5_A0 + SW_ZERO_A0 + C_NOP + RET
#: the head of handle_exception: s0 is first written at +0x10 (.Lsave_context's ld s0, TASK_TI_USER_SP)
TRAP_ENTRY_CODE = CSRRW_TP + BNEZ_TP_16 + CSRR_TP + SD_SP_TP + LD_S0_TP


class TextImage:
    """A tiny image: instruction bytes at kernel addresses (``Image.text``/``has_text``), and no symbol table
    of its own (``Image.symbols``: the dump's symbols name the frames)."""

    symbols = None

    def __init__(self, code: dict[int, bytes]) -> None:
        self.code = dict(code)

    @property
    def has_text(self) -> bool:
        """True: it has instructions."""
        return bool(self.code)

    def text(self, addr: int, size: int) -> bytes | None:
        """Bytes at ``[addr, addr + size)`` when one function holds them all."""
        for start, data in self.code.items():
            if start <= addr and addr + size <= start + len(data):
                return data[addr - start:addr - start + size]
        return None


class RiscvSynth:
    """A synthetic riscv64 kernel: text, stacks, records, pt_regs, tasks."""

    def __init__(self, release: str = "6.12.0-synthetic", extra_functions: tuple[str, ...] = ()) -> None:
        self.sd = SynthDump("riscv", release)
        self.addr: dict[str, int] = {"_stext": TEXT_BASE}
        at = TEXT_BASE + 0x1000
        for name, size in (*FUNCTIONS, *((n, 0x100) for n in extra_functions)):
            self.addr[name] = at
            at += size
        self.addr["_etext"] = at
        self.code: dict[int, bytes] = {}
        #: each ``struct pt_regs`` built, by address: its members' values
        self.built_pt_regs: dict[int, dict[str, int]] = {}
        self.raw = b""
        self.sd.symbol_hints.update({k: hex(v) for k, v in self.addr.items()})

    def at(self, name: str, off: int = 0) -> int:
        """The address ``name+off``."""
        return self.addr[name] + off

    def task_stack(self, pid: int, cpu: int | None = None) -> SynthStack:
        """The THREAD_SIZE-aligned task stack of ``pid``."""
        return self.sd.stack("task", TASK_BASE + pid * 2 * THREAD_SIZE, THREAD_SIZE, pid=pid, cpu=cpu)

    def irq_stack(self, cpu: int) -> SynthStack:
        """CPU ``cpu``'s IRQ stack (IRQ_STACK_SIZE = THREAD_SIZE), below the task stacks."""
        return self.sd.stack("irq", IRQ_BASE + cpu * 2 * THREAD_SIZE, THREAD_SIZE, cpu=cpu)

    @staticmethod
    def record(stack: SynthStack, fp: int, next_fp: int, ra: int) -> None:
        """The ``struct stackframe {fp, ra}`` at ``fp - 16``."""
        stack.put(fp - STACKFRAME_SIZE, next_fp, ra)

    def pt_regs(self, stack: SynthStack, addr: int, **regs: int) -> None:
        """A ``struct pt_regs`` at ``addr``; unnamed members are zero (every member kept in :attr:`built_pt_regs`)."""
        values = {sub.name: 0 for sub in pt_regs.subcons}
        values.update(regs)
        stack.put_bytes(addr, pt_regs.build(values))
        self.built_pt_regs[addr] = values

    def function_code(self, name: str, code: bytes) -> None:
        """Give ``name`` real instructions (padded with zeros to its symbol size)."""
        size = self.symbols().lookup(self.addr[name])
        assert size is not None
        self.code[self.addr[name]] = code.ljust(size.size, b"\0")

    def symbols(self) -> SymbolTable:
        """The kallsyms-like table of the text."""
        return SymbolTable((a, "T", n) for n, a in self.addr.items())

    def session(self) -> Session:
        """A replay session: the dump (its bytes kept in :attr:`raw`), the tiny image, the symbols."""
        self.raw = self.sd.to_bytes()
        img = TextImage(self.code) if self.code else None
        return Session(Dump(self.raw, "<synthetic>"), img, self.symbols())  # type: ignore[arg-type]


@dataclass
class Scenario:
    """A synthetic kernel, the task to walk, and what each mode must print and where it must stop."""

    synth: RiscvSynth
    pid: int
    faithful: list[int]
    faithful_stop: StopReason
    complete: list[int] = field(default_factory=list)
    complete_stop: StopReason | None = None
    #: pc -> flags the complete-mode frame at that pc must carry
    complete_flags: dict[int, Flag] = field(default_factory=dict)
    faithful_flags: dict[int, Flag] = field(default_factory=dict)
    user: bool = False
    session: Session = field(init=False)

    def __post_init__(self) -> None:
        self.session = self.synth.session()

    @property
    def raw(self) -> bytes:
        """The dump file's bytes."""
        return self.synth.raw

    def task(self) -> Task:
        """The task walked."""
        return self.session.select(pid=self.pid)[0]


def _user_syscall_base(s: RiscvSynth, st: SynthStack) -> tuple[int, int]:
    """User pt_regs at the stack top and do_trap_ecall_u's frame: ``(fp of do_trap_ecall_u, its ra)``."""
    p_user = st.high - PT_SIZE
    s.pt_regs(st, p_user, epc=USER_PC, ra=USER_PC + 0x40, sp=USER_STACK_TOP - 0x100,
              s0=USER_STACK_TOP - 0x80, status=SR_SPIE)
    # do_trap_ecall_u's fp is its entry sp, the pt_regs; s0 was the user sp
    s.record(st, p_user, USER_STACK_TOP - 0x100, s.at("handle_exception", 0x14A))
    return p_user, s.at("handle_exception", 0x14A)


def deep_chain(depth: int = 200, frame_size: int = 0x20) -> Scenario:
    """A blocked kernel thread ``depth`` frames deep, ending in ``kthread`` / ``ret_from_fork``."""
    names = tuple(f"fn_{i:04d}" for i in range(depth))
    s = RiscvSynth(extra_functions=names)
    pid = 10
    st = s.task_stack(pid)
    funcs = ["__schedule", "schedule", *names, "kthread"]
    bottom = st.high - PT_SIZE  # kthread's fp: ret_from_fork calls it with sp at task_pt_regs(tsk)
    fps = [bottom - (len(funcs) - 1 - i) * frame_size for i in range(len(funcs))]
    if fps[0] - frame_size < st.low:
        raise ValueError(f"{depth} frames of {frame_size:#x} do not fit THREAD_SIZE")
    ras = [s.at(funcs[i + 1], 0x40 + (i % 7) * 4) for i in range(len(funcs) - 1)] + [s.at("ret_from_fork", 0xE)]
    for i, fp in enumerate(fps):
        nxt = fps[i + 1] if i + 1 < len(fps) else s.at("kthread")  # ret_from_fork: s0 is the thread function
        s.record(st, fp, nxt, ras[i])
    ra0 = s.at("__schedule", 0x3A6)
    s.sd.blocked_task(pid, "kworker/0:1", {"ra": ra0, "sp": fps[0] - frame_size, "s0": fps[0]})
    pcs = [ra0, *ras]
    return Scenario(s, pid, pcs, StopReason.END_OF_STACK, pcs, StopReason.END_OF_STACK)


def kthread_v7(release: str = "7.2.0-synthetic", pt_size: int = PT_SIZE) -> Scenario:
    """A blocked 7.x kernel thread: ``ret_from_fork_kernel_asm`` -> ``ret_from_fork_kernel`` -> ``kthread``.

    copy_thread() starts it with sp at ``task_pt_regs(tsk)``, ``s0`` = the
    thread function and ``ra`` = ``ret_from_fork_kernel_asm``, which calls
    ``ret_from_fork_kernel(fn_arg, fn, regs)``: that C function's frame
    pointer is ``task_pt_regs(tsk)`` and its saved fp is the thread
    function's address. The walk prints ``ret_from_fork_kernel_asm`` and
    ends there, as every task's first frame does. ``pt_size`` lays the stack out for
    another ``sizeof(struct pt_regs)`` (a kernel whose BTF or offsets say so).
    """
    s = RiscvSynth(release, extra_functions=("ret_from_fork_kernel_asm", "ret_from_fork_kernel"))
    pid = 12
    st = s.task_stack(pid)
    fp_r = st.high - pt_size                                        # ret_from_fork_kernel
    s.pt_regs(st, fp_r, status=SR_SPP | SR_SPIE)                    # copy_thread(): zeroed, SR_PP | SR_PIE
    s.record(st, fp_r, s.at("kthread"), s.at("ret_from_fork_kernel_asm", 0xC))
    fp_k = fp_r - 0x50                                              # kthread
    s.record(st, fp_k, fp_r, s.at("ret_from_fork_kernel", 0x1A))
    fp_w = fp_k - 0x60                                              # worker_thread
    s.record(st, fp_w, fp_k, s.at("kthread", 0xE8))
    fp_s = fp_w - 0x30                                              # schedule
    s.record(st, fp_s, fp_w, s.at("worker_thread", 0x1C4))
    fp_0 = fp_s - 0x20                                              # __schedule
    s.record(st, fp_0, fp_s, s.at("schedule", 0x2C))
    first = s.at("__schedule", 0x3A6)
    s.sd.blocked_task(pid, "kworker/1:0", {"ra": first, "sp": fp_0 - 0x40, "s0": fp_0})
    pcs = [first, s.at("schedule", 0x2C), s.at("worker_thread", 0x1C4), s.at("kthread", 0xE8),
           s.at("ret_from_fork_kernel", 0x1A), s.at("ret_from_fork_kernel_asm", 0xC)]
    return Scenario(s, pid, pcs, StopReason.END_OF_STACK, pcs, StopReason.END_OF_STACK)


def syscall_v6_1() -> Scenario:
    """A 6.1 task blocked in a syscall: the handler's record returns to ``ret_from_exception`` itself.

    6.1 has no ``ret_from_exception_end``: walk_stackframe() takes an
    exception frame only where ``pc == ret_from_exception`` (``la ra,
    ret_from_exception`` before the handler), then goes on from the user
    pt_regs at the top of the stack.
    """
    s = RiscvSynth("6.1.0-synthetic")
    del s.addr["ret_from_exception_end"], s.sd.symbol_hints["ret_from_exception_end"]
    pid = 13
    st = s.task_stack(pid)
    p_user = st.high - PT_SIZE
    s.pt_regs(st, p_user, epc=USER_PC, ra=USER_PC + 0x40, sp=USER_STACK_TOP - 0x100,
              s0=USER_STACK_TOP - 0x80, status=SR_SPIE)
    s.record(st, p_user, USER_STACK_TOP - 0x100, s.at("ret_from_exception"))  # do_trap_ecall_u
    fp_n = p_user - 0x30                                            # __riscv_sys_clock_nanosleep
    s.record(st, fp_n, p_user, s.at("do_trap_ecall_u", 0x6E))
    fp_h = fp_n - 0x40                                              # hrtimer_nanosleep
    s.record(st, fp_h, fp_n, s.at("__riscv_sys_clock_nanosleep", 0x40))
    fp_0 = fp_h - 0x40                                              # __schedule, via do_nanosleep
    s.record(st, fp_0, fp_h, s.at("hrtimer_nanosleep", 0x52))
    first = s.at("__schedule", 0x3A6)
    s.sd.blocked_task(pid, "sleep", {"ra": first, "sp": fp_0 - 0x40, "s0": fp_0})
    pcs = [first, s.at("hrtimer_nanosleep", 0x52), s.at("__riscv_sys_clock_nanosleep", 0x40),
           s.at("do_trap_ecall_u", 0x6E), s.at("ret_from_exception")]
    return Scenario(s, pid, pcs, StopReason.USER_MODE, pcs, StopReason.USER_MODE)


def irq_on_irq_stack(at_handler_entry: bool = False) -> Scenario:
    """A timer IRQ on CPU 0's IRQ stack, taken in ``ksys_read`` during a ``read()`` syscall.

    Faithful: the walk ends at ``call_on_irq_stack`` (fp on the task stack is
    outside the window above the IRQ stack top). Complete: it crosses through
    ``call_on_irq_stack``'s record to ``do_irq``, the IRQ pt_regs, the syscall
    and the user pt_regs. With ``at_handler_entry`` the CPU is stopped at
    ``handle_riscv_irq+0`` (sp the IRQ stack top, s0 ``call_on_irq_stack``'s
    record, ra into it): the kernel prints that one pc and stops; complete adds
    ``call_on_irq_stack`` from ra, then crosses.
    """
    s = RiscvSynth()
    pid, cpu = 20, 0
    st, irq = s.task_stack(pid, cpu), s.irq_stack(cpu)
    fp_a, exc_ra = _user_syscall_base(s, st)
    fp_b = fp_a - 0x30                       # __riscv_sys_read
    s.record(st, fp_b, fp_a, s.at("do_trap_ecall_u", 0x6E))
    fp_c = fp_b - 0x40                       # ksys_read, interrupted
    s.record(st, fp_c, fp_b, s.at("__riscv_sys_read", 0x1C))
    ksys_sp = fp_c - 0x40
    p_irq = ksys_sp - PT_SIZE
    epc = s.at("ksys_read", 0x5A)
    s.pt_regs(st, p_irq, epc=epc, ra=s.at("vfs_read", 0x10), sp=ksys_sp, s0=fp_c, status=SR_SPP | SR_SPIE,
              cause=(1 << 63) | 5)
    fp_d = p_irq                             # do_irq
    s.record(st, fp_d, ksys_sp, s.at("handle_exception", 0x128))
    fp_e = fp_d - 0x20                       # call_on_irq_stack: s0 = sp + 16
    s.record(st, fp_e, fp_d, s.at("do_irq", 0x3C))
    if at_handler_entry:
        s.function_code("handle_riscv_irq", FRAMED_CODE)
        pc, ret = s.at("handle_riscv_irq"), s.at("call_on_irq_stack", 0x32)
        s.sd.running_task(pid, "cat", cpu, {"pc": pc, "ra": ret, "sp": irq.high, "s0": fp_e})
        complete = [pc, ret, s.at("do_irq", 0x3C), s.at("handle_exception", 0x128), epc,
                    s.at("__riscv_sys_read", 0x1C), s.at("do_trap_ecall_u", 0x6E), exc_ra]
        flags = {a: Flag.COMPLETE for a in complete[1:]}
        flags[epc] |= Flag.BOUNDARY
        return Scenario(s, pid, [pc], StopReason.KERNEL_LIMIT, complete, StopReason.USER_MODE,
                        complete_flags=flags)
    fp_f = irq.high                          # handle_riscv_irq, at the IRQ stack top
    s.record(irq, fp_f, fp_e, s.at("call_on_irq_stack", 0x32))
    fp_g = fp_f - 0x30                       # handle_percpu_devid_irq
    s.record(irq, fp_g, fp_f, s.at("handle_riscv_irq", 0x4A))
    fp_h = fp_g - 0x20                       # riscv_timer_interrupt, running
    s.record(irq, fp_h, fp_g, s.at("handle_percpu_devid_irq", 0x70))
    pc = s.at("riscv_timer_interrupt", 0x1C)
    s.sd.running_task(pid, "cat", cpu, {"pc": pc, "ra": s.at("handle_percpu_devid_irq", 0x70),
                                        "sp": fp_h - 0x20, "s0": fp_h})
    faithful = [pc, s.at("handle_percpu_devid_irq", 0x70), s.at("handle_riscv_irq", 0x4A),
                s.at("call_on_irq_stack", 0x32)]
    complete = [*faithful, s.at("do_irq", 0x3C), s.at("handle_exception", 0x128), epc,
                s.at("__riscv_sys_read", 0x1C), s.at("do_trap_ecall_u", 0x6E), exc_ra]
    flags = {a: Flag.COMPLETE for a in complete[len(faithful):]}
    flags[epc] |= Flag.BOUNDARY
    return Scenario(s, pid, faithful, StopReason.KERNEL_LIMIT, complete, StopReason.USER_MODE,
                    complete_flags=flags)


def exception_on_syscall(leaf_code: bool = True) -> Scenario:
    """A kernel-mode page fault in the frameless leaf ``__clear_user`` under ``read()``.

    Faithful: ``read_zero`` is lost (pt_regs->ra is never used). Complete,
    with ``__clear_user``'s code in the image: ``read_zero`` comes back from
    ``pt_regs->ra``; without code there is no proof and no frame.
    """
    s = RiscvSynth()
    pid, cpu = 30, 0
    st = s.task_stack(pid, cpu)
    fp_a, exc_ra = _user_syscall_base(s, st)
    fp_b = fp_a - 0x30
    s.record(st, fp_b, fp_a, s.at("do_trap_ecall_u", 0x6E))      # __riscv_sys_read
    fp_c = fp_b - 0x40
    s.record(st, fp_c, fp_b, s.at("__riscv_sys_read", 0x1C))     # ksys_read
    fp_d = fp_c - 0x60
    s.record(st, fp_d, fp_c, s.at("ksys_read", 0x6A))            # vfs_read
    fp_e = fp_d - 0x40
    s.record(st, fp_e, fp_d, s.at("vfs_read", 0x9C))             # read_zero
    leaf_sp = fp_e - 0x40
    p_k = leaf_sp - PT_SIZE
    epc, lost = s.at("__clear_user", 0xE), s.at("read_zero", 0x5E)  # at its sw: a store page fault
    # every other register distinct: a register read from the wrong slot shows
    others = {name: 0x5A00 + 8 * i for i, name in enumerate(GPR_NAMES) if name not in ("ra", "sp", "s0")}
    s.pt_regs(st, p_k, epc=epc, ra=lost, sp=leaf_sp, s0=fp_e, status=SR_SPP, cause=15, badaddr=0x2AAAAC0000,
              **others)
    fp_f = p_k                                                   # do_page_fault
    s.record(st, fp_f, leaf_sp, s.at("handle_exception", 0x14A))
    fp_g = fp_f - 0x50                                           # handle_mm_fault, running
    s.record(st, fp_g, fp_f, s.at("do_page_fault", 0x1B0))
    pc = s.at("handle_mm_fault", FRAMED_CALL_RET - 4)            # at its call, s0 already its own
    s.function_code("handle_mm_fault", FRAMED_CODE)
    if leaf_code:
        s.function_code("__clear_user", LEAF_CODE)
    s.sd.running_task(pid, "dd", cpu, {"pc": pc, "ra": s.at("do_page_fault", 0x1B0), "sp": fp_g - 0x20,
                                       "s0": fp_g})
    faithful = [pc, s.at("do_page_fault", 0x1B0), s.at("handle_exception", 0x14A), epc, s.at("vfs_read", 0x9C),
                s.at("ksys_read", 0x6A), s.at("__riscv_sys_read", 0x1C), s.at("do_trap_ecall_u", 0x6E), exc_ra]
    complete = faithful[:4] + [lost] + faithful[4:] if leaf_code else list(faithful)
    flags = {lost: Flag.COMPLETE} if leaf_code else {}
    return Scenario(s, pid, faithful, StopReason.USER_MODE, complete, StopReason.USER_MODE,
                    complete_flags=flags, faithful_flags={epc: Flag.BOUNDARY})


def leaf_at_entry(function: str = "rcu_all_qs", offset: int = 0x8) -> Scenario:
    """CPU registers stopped in ``function`` while ``s0`` is still its caller's and ``ra`` live.

    ``rcu_all_qs`` is a frameless leaf (called from ``__cond_resched``); with
    ``function="__cond_resched"`` the stop is in a framed function, at its
    entry (+0x8, +0xc) or in its epilogue (+0x18), called from ``read_zero``.
    Faithful drops the caller; complete adds it back from ``ra``.
    """
    s = RiscvSynth()
    pid, cpu = 40, 0
    st = s.task_stack(pid, cpu)
    s.function_code("rcu_all_qs", LEAF_CODE)
    s.function_code("__cond_resched", FRAMED_CODE)
    fp_v = st.high - 0x100                                       # vfs_read: its record ends the stack
    s.record(st, fp_v, 0, 0)
    fp_r = fp_v - 0x40                                           # read_zero
    s.record(st, fp_r, fp_v, s.at("vfs_read", 0x9C))
    if function == "rcu_all_qs":
        fp_c = fp_r - 0x20                                       # __cond_resched: framed, calls rcu_all_qs
        s.record(st, fp_c, fp_r, s.at("read_zero", 0x4A))
        s0, ra, sp = fp_c, s.at("__cond_resched", FRAMED_CALL_RET), fp_c - 0x20
        callers = [s.at("__cond_resched", FRAMED_CALL_RET), s.at("read_zero", 0x4A), s.at("vfs_read", 0x9C)]
    else:
        s0, ra, sp = fp_r, s.at("read_zero", 0x4A), fp_r - 0x40
        callers = [s.at("read_zero", 0x4A), s.at("vfs_read", 0x9C)]
    pc = s.at(function, offset)
    s.sd.running_task(pid, "dd", cpu, {"pc": pc, "ra": ra, "sp": sp, "s0": s0})
    faithful = [pc, *callers[1:]]
    complete = [pc, *callers]
    return Scenario(s, pid, faithful, StopReason.END_OF_STACK, complete, StopReason.END_OF_STACK,
                    complete_flags={callers[0]: Flag.COMPLETE})


def trap_entry(offset: int = 0x4, from_user: bool = False) -> Scenario:
    """A CPU stopped in ``handle_exception`` before it saved the registers (an IRQ in ``rcu_all_qs``).

    The kernel never walks from here; faithful replay follows the registers
    (pc in handle_exception, then the record at s0 - 16). Complete mode prints
    the interrupted pc (``sepc``) after it when ``s0`` is not yet overwritten,
    and ``rcu_all_qs``'s caller from ``ra``.
    """
    s = RiscvSynth()
    pid, cpu = 43, 0
    st = s.task_stack(pid, cpu)
    s.function_code("handle_exception", TRAP_ENTRY_CODE)
    s.function_code("rcu_all_qs", LEAF_CODE)
    fp_r = st.high - 0x100
    s.record(st, fp_r, 0, 0)                                     # read_zero ends the stack
    fp_c = fp_r - 0x20                                           # __cond_resched called rcu_all_qs
    s.record(st, fp_c, fp_r, s.at("read_zero", 0x4A))
    pc, sepc, ra = s.at("handle_exception", offset), s.at("rcu_all_qs", 0xE), s.at("__cond_resched", 0x14)
    s.sd.running_task(pid, "dd", cpu, {"pc": pc, "ra": ra, "sp": fp_c - 0x20, "s0": fp_c})
    s.sd.cpus[-1]["sysregs"] = {"sepc": hex(sepc), "sstatus": hex(0x20 if from_user else 0x120)}
    faithful = [pc, s.at("read_zero", 0x4A)]
    if from_user:
        return Scenario(s, pid, faithful, StopReason.END_OF_STACK, [pc], StopReason.USER_MODE)
    if offset >= len(TRAP_ENTRY_CODE) - 4:
        return Scenario(s, pid, faithful, StopReason.END_OF_STACK, faithful, StopReason.END_OF_STACK)
    return Scenario(s, pid, faithful, StopReason.END_OF_STACK, [pc, sepc, ra, s.at("read_zero", 0x4A)],
                    StopReason.END_OF_STACK,
                    complete_flags={sepc: Flag.COMPLETE | Flag.BOUNDARY, ra: Flag.COMPLETE})


def syscall_entry() -> Scenario:
    """A CPU stopped at ``do_trap_ecall_u+0``: s0 is still the user sp, ra ``handle_exception+0x14a``.

    Faithful: the pc, then the user-space fp ends the kernel's walk (a clean, truncated stop). Complete: the
    entry proof (sp not moved either) gives ``handle_exception+0x14a`` and the
    user pt_regs at sp, where the walk ends cleanly.
    """
    s = RiscvSynth()
    pid, cpu = 44, 0
    st = s.task_stack(pid, cpu)
    s.function_code("do_trap_ecall_u", FRAMED_CODE)
    p_user, exc_ra = _user_syscall_base(s, st)
    pc = s.at("do_trap_ecall_u")
    s.sd.running_task(pid, "ls", cpu, {"pc": pc, "ra": exc_ra, "sp": p_user, "s0": USER_STACK_TOP - 0x100})
    return Scenario(s, pid, [pc], StopReason.KERNEL_LIMIT, [pc, exc_ra], StopReason.USER_MODE,
                    complete_flags={exc_ra: Flag.COMPLETE})


def after_prologue() -> Scenario:
    """Stopped in ``__cond_resched`` after ``addi s0``: s0 is its own, so neither mode adds a frame."""
    s = RiscvSynth()
    pid, cpu = 41, 0
    st = s.task_stack(pid, cpu)
    s.function_code("__cond_resched", FRAMED_CODE)
    fp_r = st.high - 0x100
    s.record(st, fp_r, 0, 0)                                     # read_zero ends the stack
    fp_c = fp_r - 0x20
    s.record(st, fp_c, fp_r, s.at("read_zero", 0x4A))
    pc = s.at("__cond_resched", 0x10)
    s.sd.running_task(pid, "dd", cpu, {"pc": pc, "ra": s.at("read_zero", 0x4A), "sp": fp_c - 0x20, "s0": fp_c})
    pcs = [pc, s.at("read_zero", 0x4A)]
    return Scenario(s, pid, pcs, StopReason.END_OF_STACK, pcs, StopReason.END_OF_STACK)


def kernel_leaf_rule() -> Scenario:
    """A leaf that saved only s0 (``sd s0, 8(sp); addi s0, sp, 16``): the kernel's own leaf rule prints ra."""
    s = RiscvSynth()
    pid, cpu = 42, 0
    st = s.task_stack(pid, cpu)
    fp_v = st.high - 0x100
    s.record(st, fp_v, 0, 0)                                     # vfs_read ends the stack
    fp_r = fp_v - 0x40                                           # read_zero
    s.record(st, fp_r, fp_v, s.at("vfs_read", 0x9C))
    fp_l = fp_r - 0x20                                           # leaf_saves_s0: only s0, at fp - 8
    st.put(fp_l - 8, fp_r)
    pc, ra = s.at("leaf_saves_s0", 0x10), s.at("read_zero", 0x4A)
    s.sd.running_task(pid, "dd", cpu, {"pc": pc, "ra": ra, "sp": fp_l - 0x10, "s0": fp_l})
    pcs = [pc, ra, s.at("vfs_read", 0x9C)]
    return Scenario(s, pid, pcs, StopReason.END_OF_STACK, pcs, StopReason.END_OF_STACK)


def _searches_task(release: str, running: bool) -> bool:
    """Does that kernel's walk_stackframe() search this task's ret_stack? 6.12 passes current, 7.x the task."""
    return running or int(release.split(".")[0]) >= 7


def fgraph_hijack(running: bool = True, kernel_retp: bool = True, release: str = "6.12.0-synthetic") -> Scenario:
    """``schedule_timeout``'s return hijacked by the function-graph tracer (``return_to_handler``).

    ``kernel_retp``: the ret_stack entry's retp is ``&frame->ra`` (what the
    kernel's test needs); otherwise it is the ftrace_regs slot riscv 6.12
    and 7.x really record (``&fregs->ra`` in ``ftrace_caller``'s frame). The
    kernel recovers a return with a matching retp, of current only in 6.12,
    of the task walked in 7.x; complete mode recovers the others in order.
    """
    s = RiscvSynth(release)
    pid, cpu = 50, 0
    st = s.task_stack(pid, cpu if running else None)
    fp_n = st.high - 0x100                                       # do_nanosleep ends the stack
    s.record(st, fp_n, 0, 0)
    fp_t = fp_n - 0x40                                           # schedule_timeout: traced
    s.record(st, fp_t, fp_n, s.at("return_to_handler"))
    real = s.at("do_nanosleep", 0x58)
    fp_s = fp_t - 0x30                                           # schedule
    s.record(st, fp_s, fp_t, s.at("schedule_timeout", 0x94))
    fp_0 = fp_s - 0x20                                           # __schedule
    s.record(st, fp_0, fp_s, s.at("schedule", 0x2C))
    retp = fp_t - 8 if kernel_retp else fp_0 - 0x200
    entry = {"ret": real, "retp": retp, "func": s.at("schedule_timeout")}
    first = s.at("__schedule", 0x3A6)
    if running:
        s.sd.running_task(pid, "sleep", cpu, {"pc": first, "ra": s.at("schedule", 0x2C), "sp": fp_0 - 0x40,
                                              "s0": fp_0}, fgraph=[entry])
    else:
        s.sd.blocked_task(pid, "sleep", {"ra": first, "sp": fp_0 - 0x40, "s0": fp_0}, fgraph=[entry])
    head = [first, s.at("schedule", 0x2C), s.at("schedule_timeout", 0x94)]
    kernel_recovers = _searches_task(release, running) and kernel_retp
    faithful = [*head, real if kernel_recovers else s.at("return_to_handler")]
    complete = [*head, real]
    return Scenario(s, pid, faithful, StopReason.END_OF_STACK, complete, StopReason.END_OF_STACK,
                    faithful_flags={real: Flag.FGRAPH} if kernel_recovers else {},
                    complete_flags={real: Flag.FGRAPH if kernel_recovers else Flag.FGRAPH | Flag.COMPLETE})


def _traced_nanosleep(s: RiscvSynth, st: SynthStack, fp_c: int) -> tuple[int, int, int]:
    """Below ``hrtimer_nanosleep``'s record at ``fp_c``: ``do_nanosleep`` and ``schedule_timeout``, both
    traced (their records' ra is ``return_to_handler``), then ``schedule`` and ``__schedule``. The fps
    of ``do_nanosleep``, ``schedule_timeout`` and ``__schedule``."""
    fp_a = fp_c - 0x40                                           # do_nanosleep: traced
    s.record(st, fp_a, fp_c, s.at("return_to_handler"))
    fp_b = fp_a - 0x40                                           # schedule_timeout: traced
    s.record(st, fp_b, fp_a, s.at("return_to_handler"))
    fp_s = fp_b - 0x30                                           # schedule
    s.record(st, fp_s, fp_b, s.at("schedule_timeout", 0x94))
    fp_0 = fp_s - 0x20                                           # __schedule
    s.record(st, fp_0, fp_s, s.at("schedule", 0x2C))
    return fp_a, fp_b, fp_0


def fgraph_retp_collision(with_fp: bool = False, running: bool = True,
                          release: str = "6.12.0-synthetic") -> Scenario:
    """Two hijacked returns where an older entry's retp is the younger function's ``&frame->ra``.

    riscv 6.12 records ``&fregs->ra`` (in ``ftrace_caller``'s frame) as retp; the
    slot can coincide with another function's ``&frame->ra`` (seen on the real
    guest: sysrq printed ``vfs_write+0xaa`` for ``write_sysrq_trigger``). The
    kernel then prints the older entry's return at the younger record, and
    ``return_to_handler`` at the older one. Complete mode takes the entries in
    order, checked by ``func`` (or, ``with_fp``, by the ``fp`` riscv records).
    A blocked task shows the same on 7.x; on 6.12 its ret_stack is not searched.
    """
    s = RiscvSynth(release)
    pid, cpu = 52, 0
    st = s.task_stack(pid, cpu if running else None)
    fp_c = st.high - 0x100                                       # hrtimer_nanosleep ends the stack
    s.record(st, fp_c, 0, 0)
    fp_a, fp_b, fp_0 = _traced_nanosleep(s, st, fp_c)
    ret_a, ret_b = s.at("hrtimer_nanosleep", 0x50), s.at("do_nanosleep", 0x58)
    entries = [{"ret": ret_a, "retp": fp_b - 8, "func": s.at("do_nanosleep")},      # retp collides
               {"ret": ret_b, "retp": fp_0 - 0x100, "func": s.at("schedule_timeout")}]
    if with_fp:  # the caller's s0 at the hijack
        entries[0]["fp"], entries[1]["fp"] = fp_c, fp_a
    first = s.at("__schedule", 0x3A6)
    if running:
        s.sd.running_task(pid, "sleep", cpu, {"pc": first, "ra": s.at("schedule", 0x2C), "sp": fp_0 - 0x40,
                                              "s0": fp_0}, fgraph=entries)
    else:
        s.sd.blocked_task(pid, "sleep", {"ra": first, "sp": fp_0 - 0x40, "s0": fp_0}, fgraph=entries)
    head = [first, s.at("schedule", 0x2C), s.at("schedule_timeout", 0x94)]
    both = Flag.FGRAPH | Flag.COMPLETE
    r2h = s.at("return_to_handler")
    if not _searches_task(release, running):
        return Scenario(s, pid, [*head, r2h, r2h], StopReason.END_OF_STACK, [*head, ret_b, ret_a],
                        StopReason.END_OF_STACK, complete_flags={ret_b: both, ret_a: both})
    return Scenario(s, pid, [*head, ret_a, r2h], StopReason.END_OF_STACK,
                    [*head, ret_b, ret_a], StopReason.END_OF_STACK,
                    faithful_flags={ret_a: Flag.FGRAPH}, complete_flags={ret_b: both, ret_a: both})


def fgraph_unrecovered() -> Scenario:
    """A running CPU with two hijacked returns in a row that riscv 6.12's walk does not recover.

    ``ftrace_graph_func()`` records ``&fregs->ra`` (in ``ftrace_caller``'s frame) as retp and
    ``walk_stackframe()`` searches for ``&frame->ra``: no entry matches, so the kernel prints
    ``return_to_handler+0x0`` once per hijacked record (as the guest printed it above
    ``call_on_irq_stack``), then goes on from the record's fp. Complete mode takes the entries in order.
    """
    s = RiscvSynth()
    pid, cpu = 54, 0
    st = s.task_stack(pid, cpu)
    fp_e = st.high - 0x100                                       # __riscv_sys_clock_nanosleep ends the stack
    s.record(st, fp_e, 0, 0)
    fp_c = fp_e - 0x40                                           # hrtimer_nanosleep
    s.record(st, fp_c, fp_e, s.at("__riscv_sys_clock_nanosleep", 0x30))
    _, _, fp_0 = _traced_nanosleep(s, st, fp_c)
    ret_a, ret_b = s.at("hrtimer_nanosleep", 0x50), s.at("do_nanosleep", 0x58)
    entries = [{"ret": ret_a, "retp": fp_0 - 0x180, "func": s.at("do_nanosleep")},  # &fregs->ra: in
               {"ret": ret_b, "retp": fp_0 - 0x100, "func": s.at("schedule_timeout")}]  # no record
    first = s.at("__schedule", 0x3A6)
    s.sd.running_task(pid, "sleep", cpu, {"pc": first, "ra": s.at("schedule", 0x2C), "sp": fp_0 - 0x40,
                                          "s0": fp_0}, fgraph=entries)
    head = [first, s.at("schedule", 0x2C), s.at("schedule_timeout", 0x94)]
    tail = s.at("__riscv_sys_clock_nanosleep", 0x30)
    r2h = s.at("return_to_handler")
    both = Flag.FGRAPH | Flag.COMPLETE
    return Scenario(s, pid, [*head, r2h, r2h, tail], StopReason.END_OF_STACK, [*head, ret_b, ret_a, tail],
                    StopReason.END_OF_STACK, complete_flags={ret_b: both, ret_a: both})


def fgraph_in_flight() -> Scenario:
    """A CPU inside the tracer while it enters ``__clear_user`` from ``read_zero``.

    ``ftrace_caller`` builds no frame record: the walk goes from the tracer
    straight to ``read_zero``'s record, whose own return is hijacked too. The
    ret_stack holds both hijacks, with the caller's fp: complete mode prints
    ``read_zero``'s pc from the in-flight entry, then recovers its return.
    """
    s = RiscvSynth()
    pid, cpu = 53, 0
    st = s.task_stack(pid, cpu)
    fp_v = st.high - 0x100                                       # vfs_read ends the stack
    s.record(st, fp_v, 0, 0)
    fp_g = fp_v - 0x40                                           # read_zero: its return hijacked
    s.record(st, fp_g, fp_v, s.at("return_to_handler"))
    fp_0 = fp_g - 0x200                                          # the tracer (schedule plays it), called
    s.record(st, fp_0, fp_g, s.at("__switch_to", 0x8))          # from the trampoline (__switch_to plays it)
    entries = [{"ret": s.at("vfs_read", 0x9C), "retp": fp_0 - 0x80, "func": s.at("read_zero"), "fp": fp_v},
               {"ret": s.at("read_zero", 0x5E), "retp": fp_0 - 0x70, "func": s.at("__clear_user"), "fp": fp_g}]
    pc = s.at("schedule", 0x10)
    s.sd.running_task(pid, "dd", cpu, {"pc": pc, "ra": s.at("__switch_to", 0x8), "sp": fp_0 - 0x20, "s0": fp_0},
                      fgraph=entries)
    head = [pc, s.at("__switch_to", 0x8)]
    both = Flag.FGRAPH | Flag.COMPLETE
    return Scenario(s, pid, [*head, s.at("return_to_handler")], StopReason.END_OF_STACK,
                    [*head, s.at("read_zero", 0x5E), s.at("vfs_read", 0x9C)], StopReason.END_OF_STACK,
                    complete_flags={s.at("read_zero", 0x5E): both, s.at("vfs_read", 0x9C): both})


def kretprobe_hijack() -> Scenario:
    """``probed_fn``'s return replaced by the rethook trampoline; the instance keys it by frame (s0 at entry)."""
    s = RiscvSynth()
    pid = 51
    st = s.task_stack(pid)
    fp_v = st.high - 0x100
    s.record(st, fp_v, 0, 0)                                     # vfs_read ends the stack
    fp_p = fp_v - 0x40                                           # probed_fn: hijacked
    s.record(st, fp_p, fp_v, s.at("arch_rethook_trampoline"))
    fp_s = fp_p - 0x30                                           # schedule
    s.record(st, fp_s, fp_p, s.at("probed_fn", 0x30))
    real = s.at("vfs_read", 0x9C)
    first = s.at("__schedule", 0x3A6)
    s.sd.blocked_task(pid, "probed", {"ra": first, "sp": fp_s - 0x40, "s0": fp_s},
                      kretprobes=[{"ret": real, "fp": fp_v}])
    head = [first, s.at("probed_fn", 0x30)]
    return Scenario(s, pid, [*head, s.at("arch_rethook_trampoline")], StopReason.END_OF_STACK,
                    [*head, real], StopReason.END_OF_STACK, complete_flags={real: Flag.KRETPROBE | Flag.COMPLETE})


def broken_chain(kind: str) -> Scenario:
    """A blocked task whose second record is broken: ``misaligned``, ``outside`` the stack, or a ``loop``."""
    s = RiscvSynth()
    pid = 60
    st = s.task_stack(pid)
    fp_1 = st.high - 0x200
    fp_0 = fp_1 - 0x40
    ra_0, ra_1 = s.at("schedule", 0x2C), s.at("schedule_timeout", 0x94)
    s.record(st, fp_0, fp_1, ra_0)
    bad = {"misaligned": fp_1 + 0x44, "outside": 0xFF30000000000000, "loop": fp_1}[kind]
    s.record(st, fp_1, bad, ra_1)
    first = s.at("__schedule", 0x3A6)
    s.sd.blocked_task(pid, "broken", {"ra": first, "sp": fp_0 - 0x40, "s0": fp_0})
    reason = {"misaligned": StopReason.MISALIGNED_FP, "outside": StopReason.OUTSIDE_STACK,
              "loop": StopReason.TRANSITION_REFUSED}[kind]
    pcs = [first, ra_0, ra_1]
    return Scenario(s, pid, pcs, reason, pcs, reason)


def user_stack(unreadable: bool = False) -> Scenario:
    """A task running in user mode with a three-record user stack ending in fp = 0.

    ``unreadable``: the outermost record's memory is not in the dump.
    """
    s = RiscvSynth()
    pid, cpu = 70, 0
    s.task_stack(pid, cpu)
    u1, u2, u3 = USER_STACK_TOP - 0x200, USER_STACK_TOP - 0x180, USER_STACK_TOP - 0x100
    epc, ra_reg, ra2, ra3 = USER_PC, USER_PC + 0x400, USER_PC + 0x800, USER_PC + 0xC00
    low = bytearray(0x100)                                       # [u1 - 0x80, u1 + 0x80): records u1, u2
    base = u1 - 0x80

    def put(addr: int, fp: int, ra: int) -> None:
        low[addr - 16 - base:addr - base] = fp.to_bytes(8, "little") + ra.to_bytes(8, "little")

    put(u1, u2, 0x1111)                                          # the first record's ra is ignored: regs->ra
    put(u2, u3, ra2)
    s.sd.memory(base, bytes(low))
    if not unreadable:
        s.sd.memory(u3 - 16, (0).to_bytes(8, "little") + ra3.to_bytes(8, "little"))
    regs = {"epc": epc, "ra": ra_reg, "sp": u1 - 0x40, "s0": u1}
    s.sd.running_task(pid, "busybox", cpu, {"pc": epc, "ra": ra_reg, "sp": u1 - 0x40, "s0": u1},
                      user_regs=regs, mode="user")
    pcs = [epc, ra_reg, ra2] + ([] if unreadable else [ra3])
    stop = StopReason.MEMORY_FAULT if unreadable else StopReason.END_OF_STACK
    return Scenario(s, pid, pcs, stop, pcs, stop, user=True)
