"""The kernel steps one by one: layouts, fp_is_valid, text ranges, and the ra proofs."""

from __future__ import annotations

import capstone
import pytest

from unwind.arch.riscv import structs
from unwind.arch.riscv.backend import RiscvBackend
from unwind.arch.riscv.liveness import LiveRaProver, dirty_on_entry, is_return, written_register
from unwind.arch.riscv.stacktrace import KernelLayout, align, fp_bounds, fp_is_valid, kernel_text_address
from unwind.arch.riscv.synth import FRAMED_CODE, LEAF_CODE, RiscvSynth, TextImage
from unwind.core.target import Options
from unwind.core.walk import StopReason

CS = (capstone.CS_ARCH_RISCV, capstone.CS_MODE_RISCV64 | capstone.CS_MODE_RISCVC)


def test_layouts():
    assert structs.pt_regs.sizeof() == 288
    assert structs.offsetof(structs.pt_regs, "s0") == 64
    assert structs.offsetof(structs.pt_regs, "ra") == 8
    assert structs.offsetof(structs.pt_regs, "status") == 256
    assert structs.offsetof(structs.pt_regs, "orig_a0") == 280
    assert (structs.STACKFRAME_SIZE, structs.STACKFRAME_FP, structs.STACKFRAME_RA) == (16, 0, 8)
    names = RiscvBackend.prstatus_regs
    assert len(names) == 32 and names[:3] == ("pc", "ra", "sp") and names[8] == "s0"


def test_fp_is_valid_window():
    ts = 0x4000
    sp = 0xFF20000000103E00
    assert fp_bounds(sp, ts) == (sp + 16, 0xFF20000000104000)
    assert fp_is_valid(sp + 16, sp, ts) and fp_is_valid(0xFF20000000104000, sp, ts)
    assert not fp_is_valid(sp + 8, sp, ts)              # below sp + 16
    assert not fp_is_valid(0xFF20000000104008, sp, ts)  # past ALIGN(sp, THREAD_SIZE)
    assert not fp_is_valid(sp + 0x24, sp, ts)           # not 8-aligned
    top = 0xFF20000000004000                            # an empty window: sp at an aligned stack top
    assert fp_bounds(top, ts) == (top + 16, top) and not fp_is_valid(top + 16, top, ts)
    assert align(0xFFFFFFFFFFFFFFF0, 0x4000) == 0       # unsigned long wraps


@pytest.mark.parametrize("size", [0x4000, 0x3000])
def test_the_loops_align_is_the_kernels_for_every_sp(size):
    """fp_is_valid()'s ALIGN(sp, THREAD_SIZE), which the walk keeps per THREAD_SIZE block, is align.h's
    ``(sp + THREAD_SIZE - 1) & ~(THREAD_SIZE - 1)`` for sps in any order, with a THREAD_SIZE (the dump's task
    stack size) that is a power of two or not."""
    s = RiscvSynth()
    s.sd.stack("task", 0xFF20000000100000, size, pid=1)
    s.sd.blocked_task(1, "x", {"ra": s.at("__schedule"), "sp": 0, "s0": 0})
    session = s.session()
    unwinder = session.backend.unwinder(session.target(session.select(pid=1)[0], Options()))
    assert unwinder.ts == size
    near = [0xFF20000000100000 + d for d in range(-3 * size, 3 * size + 1, 0x7F8)]
    edges = [k * size + d for k in (0, 1, 0xFF20000000100000 // size) for d in (-1, 0, 1)]
    for sp in near + near[::-1] + edges + near[::3]:
        assert unwinder._align_sp(sp) == (sp + size - 1) & ~(size - 1), hex(sp)


def test_kernel_text_address():
    text = ((0x1000, 0x2000), (0x8000, 0x9000))
    assert kernel_text_address(0x1000, text) and kernel_text_address(0x8FFF, text)
    assert not kernel_text_address(0x2000, text) and not kernel_text_address(0x7000, text)
    assert kernel_text_address(0xFFFFFFFF80001000, ()) and not kernel_text_address(0x2AAAAB1230, ())


@pytest.mark.parametrize("code,want", [
    (FRAMED_CODE, ["nop", "nop", "c.addi", "c.sdsp", "c.sdsp", "c.addi4spn", "jal", "c.ldsp", "c.ldsp",
                   "c.addi16sp", "c.jr"]),
    (LEAF_CODE, ["nop", "nop", "c.li", "c.beqz", "c.ld", "sw", "c.nop", "c.jr"]),
])
def test_hand_assembled_encodings_decode_as_intended(code, want):
    md = capstone.Cs(*CS)
    insns = list(md.disasm_lite(code, 0x1000))
    assert [i[2] for i in insns] == want and sum(i[1] for i in insns) == len(code)
    ops = {i[2]: i[3] for i in insns}
    if "c.addi4spn" in ops:
        assert ops["c.addi4spn"] == "s0, sp, 0x20" and ops["jal"] == "0x10"  # capstone prints the offset


@pytest.mark.parametrize("mn,ops,reg", [
    ("c.addi4spn", "s0, sp, 0x20", "s0"), ("c.ldsp", "ra, 0x18(sp)", "ra"), ("c.sdsp", "ra, 0x18(sp)", None),
    ("sd", "s0, 0x10(sp)", None), ("jal", "0x10", "ra"), ("jalr", "a5", "ra"), ("jalr", "t0, t0, 0", "t0"),
    ("c.jalr", "a5", "ra"), ("j", "0x10", None), ("beq", "a0, a1, 8", None), ("csrrw", "s0, sscratch, s0", "s0"),
    ("c.mv", "s0, a0", "s0"), ("nop", "", None), ("amoswap.d", "ra, a0, (a1)", "ra"),
])
def test_written_register(mn, ops, reg):
    assert written_register(mn, ops) == reg


def test_is_return():
    assert is_return("ret", "") and is_return("c.jr", "ra") and is_return("jalr", "zero, 0(ra)")
    assert not is_return("c.jr", "a5") and not is_return("jalr", "ra, 0(a5)")


def _prover(excluded=()):
    s = RiscvSynth()
    s.function_code("__cond_resched", FRAMED_CODE)
    s.function_code("rcu_all_qs", LEAF_CODE)
    return s, LiveRaProver(TextImage(s.code), s.symbols(), excluded, CS)


@pytest.mark.parametrize("func,off,kind", [
    ("__cond_resched", 0x0, "entry"), ("__cond_resched", 0x8, "entry"), ("__cond_resched", 0xC, "entry"),
    ("__cond_resched", 0xE, "entry"),      # ra and s0 stored, s0 not yet set
    ("__cond_resched", 0x10, None),        # s0 is its own now
    ("__cond_resched", 0x14, None),        # after the call: ra clobbered, s0 its own
    ("__cond_resched", 0x16, None),        # ra restored, s0 not yet
    ("__cond_resched", 0x18, "epilogue"),  # both restored, before ret
    ("rcu_all_qs", 0x8, "entry"), ("rcu_all_qs", 0xE, "leaf"), ("rcu_all_qs", 0x14, "leaf"),
])
def test_live_ra_proofs(func, off, kind):
    s, prover = _prover()
    proof, why = prover.prove(s.at(func, off))
    assert (proof.kind if proof else None) == kind
    assert (why == "") == (kind is not None)


def test_no_proof_without_text_or_in_trap_entry():
    s, prover = _prover(excluded=((0, 0),))
    assert prover.prove(s.at("vfs_read", 0x9C))[0] is None                      # no code for it
    assert "no text" in LiveRaProver(None, s.symbols(), (), CS).prove(s.at("rcu_all_qs", 8))[1]
    trap = (s.at("handle_exception"), s.at("ret_from_exception_end"))
    _, prover = _prover(excluded=(trap,))
    proof, why = prover.prove(s.at("handle_exception"))
    assert proof is None and "trap-entry" in why


def test_dirty_on_entry_follows_every_path():
    # 0: beqz -> 8 | 2: sd ra | 4: addi s0 | 6: ret | 8: li | 0xa: ret   (addresses relative to 0x100)
    insns = [(0x100, 2, "c.beqz", "a0, 8"), (0x102, 2, "c.sdsp", "ra, 8(sp)"), (0x104, 2, "c.addi4spn", "s0, sp, 16"),
             (0x106, 2, "c.jr", "ra"), (0x108, 2, "c.li", "a0, 0"), (0x10A, 2, "c.jr", "ra")]
    state = dirty_on_entry(insns)
    assert state[0x108] == frozenset() and state[0x10A] == frozenset()  # the frameless path
    assert state[0x106] == {"s0"} and state[0x104] == frozenset()
    # a join of a framed and a frameless path is dirty
    joined = insns[:3] + [(0x106, 2, "c.j", "2"), (0x108, 2, "c.li", "a0, 0"), (0x10A, 2, "c.jr", "ra")]
    assert dirty_on_entry(joined)[0x108] == {"s0"}
    # an indirect jump carrying a written register could land anywhere: no answer
    assert dirty_on_entry(insns[:3] + [(0x106, 2, "c.jr", "a5")]) is None
    assert dirty_on_entry([(0x100, 2, "c.jr", "a5")]) is not None     # clean: a tail call
    # a branch into the middle of an instruction: the decode is not trusted
    assert dirty_on_entry([(0x100, 2, "c.beqz", "a0, 3"), (0x102, 4, "addi", "s0, sp, 16")]) is None


def test_module_area_counts_as_text():
    s = RiscvSynth()
    s.sd.vmcoreinfo.update({"NUMBER(MODULES_VADDR)": "0xffffffff01000000", "NUMBER(MODULES_END)": "0xffffffff80000000"})
    s.task_stack(1)
    s.sd.blocked_task(1, "x", {"ra": s.at("__schedule"), "sp": 0, "s0": 0})
    session = s.session()
    layout = KernelLayout.of(session.target(session.select(pid=1)[0], Options()))
    assert kernel_text_address(0xFFFFFFFF01234568, layout.text)
    assert not kernel_text_address(0xFFFFFFFF00FFFFFF, layout.text)
    assert layout.thread_size == 0x4000


def test_the_natural_end_moves_with_the_pt_regs_size_the_dump_gives():
    """A kernel with a 304-byte pt_regs: its first frame's fp is top - 304; the dump's offsets say so."""
    from unwind.arch.riscv import synth as S

    sc = S.kthread_v7(pt_size=304)
    sc.synth.sd.extra_meta["offsets"] = {"pt_regs": {"size": 304, "members": {"epc": 0, "ra": 8, "s0": 64,
                                                                             "status": 256}}}
    sc.session = sc.synth.session()
    r = sc.session.replay(sc.task())
    assert r.stop.reason is StopReason.END_OF_STACK and "ret_from_fork_kernel_asm" in r.stop.detail
    assert r.basis["pt_regs"] == "struct pt_regs: 304 bytes, from dump (the dump's offsets)"
    assert r.basis["generation"] == "v7.x"


def _no_layout_dump(pt_size: int, tasks: int = 3, zero_regs: bool = False, stray: bool = False):
    """A 7.x dump with no BTF and no offsets: ``tasks`` kernel threads plus one blocked in a syscall, each
    stack laid out for a ``pt_size``-byte pt_regs (the answer, by construction); with ``stray`` one more
    task whose chain ends 0x200 below its top on a user-looking pt_regs."""
    from unwind.arch.riscv import synth as S

    s = S.RiscvSynth("7.2.0-synthetic", extra_functions=("ret_from_fork_kernel_asm", "ret_from_fork_kernel"))
    for pid in range(10, 10 + tasks):
        st = s.task_stack(pid)
        fp_r = st.high - pt_size                                     # ret_from_fork_kernel: fp = task_pt_regs
        if not zero_regs:
            s.pt_regs(st, fp_r, status=S.SR_SPP | S.SR_SPIE)         # copy_thread()'s
        s.record(st, fp_r, s.at("kthread"), s.at("ret_from_fork_kernel_asm", 0xC))
        fp_k = fp_r - 0x50                                           # kthread
        s.record(st, fp_k, fp_r, s.at("ret_from_fork_kernel", 0x1A))
        s.sd.blocked_task(pid, f"kworker/{pid}", {"ra": s.at("kthread", 0xE8), "sp": fp_k - 0x40, "s0": fp_k})
    st = s.task_stack(99)
    p_user = st.high - pt_size                                       # do_trap_ecall_u: fp = the user pt_regs
    if not zero_regs:
        s.pt_regs(st, p_user, epc=S.USER_PC, sp=S.USER_STACK_TOP, status=S.SR_SPIE)
    s.record(st, p_user, S.USER_STACK_TOP - 0x100, s.at("handle_exception", 0x14A))
    fp_s = p_user - 0x40                                             # __riscv_sys_read
    s.record(st, fp_s, p_user, s.at("do_trap_ecall_u", 0x6E))
    s.sd.blocked_task(99, "cat", {"ra": s.at("__riscv_sys_read", 0x1C), "sp": fp_s - 0x20, "s0": fp_s})
    if stray:
        st = s.task_stack(50)
        p = st.high - 0x200
        s.pt_regs(st, p, epc=S.USER_PC, status=S.SR_SPIE)
        s.record(st, p, S.USER_STACK_TOP - 0x100, s.at("handle_exception", 0x14A))
        s.record(st, p - 0x40, p, s.at("do_trap_ecall_u", 0x6E))
        s.sd.blocked_task(50, "odd", {"ra": s.at("__riscv_sys_read", 0x1C), "sp": p - 0x60, "s0": p - 0x40})
    return s, s.session()


@pytest.mark.parametrize("pt_size", [288, 304])
def test_pt_regs_derived_from_where_the_record_chains_end(pt_size):
    """No BTF, no offsets: sizeof(struct pt_regs) is where every task's chain ends on a first pt_regs."""
    s, session = _no_layout_dump(pt_size)
    for pid in (10, 99):
        r = session.replay(session.select(pid=pid)[0])
        assert r.stop.reason in (StopReason.END_OF_STACK, StopReason.USER_MODE), r.stop
        assert r.basis["pt_regs"].startswith(f"struct pt_regs: {pt_size} bytes, from derived (4 of 4 task record "
                                             f"chains end at top-{pt_size:#x} on a first pt_regs"), r.basis


def test_pt_regs_derivation_needs_a_first_pt_regs_at_the_chain_end():
    """Chains ending on zeroed memory prove nothing: the table (288) is used and the 304 kernel's walk fails."""
    s, session = _no_layout_dump(304, zero_regs=True)
    r = session.replay(session.select(pid=10)[0])
    assert r.basis["pt_regs"] == "struct pt_regs: 288 bytes, from table (6.1-7.2 table (288 bytes))"
    assert not r.stop.clean


def test_pt_regs_derivation_outvotes_a_broken_chain():
    """One task whose chain ends elsewhere does not move the derived place."""
    s, session = _no_layout_dump(304, stray=True)
    r = session.replay(session.select(pid=11)[0])
    assert "304 bytes, from derived (4 of 5 task record chains end at top-0x130" in r.basis["pt_regs"]
    assert r.stop.reason is StopReason.END_OF_STACK
