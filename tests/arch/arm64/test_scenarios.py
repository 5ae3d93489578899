"""arm64 walks on synthetic dumps: every scenario's frames are known by construction."""

from __future__ import annotations

import pytest

from unwind import Options, StopReason
from unwind.arch.arm64 import synth as S
from unwind.arch.arm64.synth import (IRQ_LOW, KRETPROBE_TRAMPOLINE, RETURN_TO_HANDLER, STACK_SIZE, TASK_LOW,
                                     Arm64Synth, fn, ret, sign)
from unwind.core.frame import Flag, Source
from unwind.core.walk import collect

GENERATIONS = ["6.12", "6.13"]


def walk(session, task, **opt):
    return collect(session.backend.unwinder(session.target(task, Options(**opt))))


def build_chain(generation, lrs, *, pid=7, first_pc=None, last_fp=None, fps=None, **extra):
    """A blocked task whose records hold ``lrs``, not yet written: (synth, task stack, fps)."""
    a = Arm64Synth(generation)
    st = a.task_stack(pid, TASK_LOW)
    fps = fps or [TASK_LOW + 0x3000 + 0x40 * i for i in range(len(lrs))]
    a.chain(st, fps, lrs, a.final_fp(st) if last_fp is None else last_fp)
    a.blocked(pid, "t", fp=fps[0], pc=first_pc or ret(60), sp=fps[0] - 0x10, **extra)
    return a, st, fps


def opened(a, pid=7):
    """Write the dump and open it: (session, task)."""
    s = a.session(S.FUNCS)
    return s, s.select(pid=pid)[0]


def blocked_chain(generation, lrs, **kw):
    """A blocked task whose records hold ``lrs``: (synth, session, task, fps, task stack)."""
    a, st, fps = build_chain(generation, lrs, **kw)
    s, t = opened(a, kw.get("pid", 7))
    return a, s, t, fps, st


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("name", sorted(S.CLEAN_SCENARIOS))
def test_clean_scenarios(name, generation):
    sc = S.CLEAN_SCENARIOS[name](generation)
    frames, stop = walk(sc.session, sc.task)
    assert [f.pc for f in frames] == sc.expected
    assert stop.reason is sc.stop and stop.clean


@pytest.mark.parametrize("generation", GENERATIONS)
def test_deep_chain_sources_stacks_and_pac(generation):
    sc = S.deep_chain(generation)
    frames, _ = walk(sc.session, sc.task)
    assert frames[0].source is Source.TASK and all(f.source is Source.FRAME for f in frames[1:])
    assert {f.stack for f in frames} == {"task"}
    for f, raw in zip(frames[1:], sc.notes["signed"]):
        assert bool(f.flags & Flag.PAC_STRIPPED) == (raw != f.pc)
    # the low bound of the task stack moved past the last record consumed
    u = sc.session.backend.unwinder(sc.session.target(sc.task, Options()))
    u.start()
    u.next()
    assert u.state.stacks.stack.low == sc.task.context["fp"] + 16


@pytest.mark.parametrize("generation", GENERATIONS)
def test_irq_to_task_labels_each_record_with_its_stack(generation):
    sc = S.irq_to_task(generation)
    frames, _ = walk(sc.session, sc.task)
    assert [f.stack for f in frames[1:]] == ["irq"] * 3 + ["task"] * 2
    assert frames[0].flags & Flag.BOUNDARY and frames[0].source is Source.REGS_PC
    assert frames[0].sp == sc.task.regs["sp"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_overflow_stack_transitions(generation):
    sc = S.overflow(generation)
    frames, _ = walk(sc.session, sc.task)
    assert [f.stack for f in frames[1:]] == ["overflow", "irq", "task"]


def test_el1_exception_v6_12_is_an_ordinary_record():
    sc = S.el1_exception("6.12")
    frames, _ = walk(sc.session, sc.task)
    elr = frames[sc.notes["boundary_index"]]
    assert elr.source is Source.FRAME and not elr.flags  # unsigned ELR, no boundary the kernel can see
    assert [f.pc for f in frames] == sc.expected  # func21, held only in x30, is not in the trace


def test_el1_exception_v6_13_is_a_meta_record():
    sc = S.el1_exception("6.13")
    frames, stop = walk(sc.session, sc.task)
    elr = frames[sc.notes["boundary_index"]]
    assert elr.source is Source.REGS_PC and elr.flags & Flag.BOUNDARY
    assert [f.pc for f in frames] == sc.expected
    assert "FRAME_META_TYPE_FINAL" in stop.detail


@pytest.mark.parametrize("generation", GENERATIONS)
def test_el1_exception_after_the_prologue_shows_the_caller(generation):
    sc = S.el1_exception(generation, entry_pc=False)
    frames, _ = walk(sc.session, sc.task)
    assert [f.pc for f in frames] == sc.expected and ret(21) in sc.expected


@pytest.mark.parametrize("generation", GENERATIONS)
def test_signed_and_unsigned_lrs_mixed(generation):
    lrs = [sign(ret(1), 0xABC), ret(2), sign(ret(3), 0x1), ret(4)]
    _, s, t, _, _ = blocked_chain(generation, lrs)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1), ret(2), ret(3), ret(4)] and stop.clean
    assert [bool(f.flags & Flag.PAC_STRIPPED) for f in frames] == [False, True, False, True, False]


def test_pac_mask_from_t1sz_when_kernelpacmask_is_absent():
    a = Arm64Synth("6.12", pac_mask=None, vmcoreinfo={"NUMBER(TCR_EL1_T1SZ)": "0x10"})  # 48-bit VA
    st = a.task_stack(7, TASK_LOW)
    signed48 = sign(ret(1), 0xBEEF, S.PAC_MASK_48)
    a.chain(st, [TASK_LOW + 0x3000], [signed48], a.final_fp(st))
    a.blocked(7, "t", fp=TASK_LOW + 0x3000, pc=ret(60), sp=TASK_LOW + 0x2FF0)
    s = a.session(S.FUNCS)
    frames, _ = walk(s, s.select(pid=7)[0])
    assert frames[1].pc == ret(1) and frames[1].flags & Flag.PAC_STRIPPED


@pytest.mark.parametrize("generation", GENERATIONS)
def test_fgraph_and_kretprobe_flags(generation):
    for build, flag in ((S.fgraph_hijack, Flag.FGRAPH), (S.kretprobe_hijack, Flag.KRETPROBE)):
        sc = build(generation)
        frames, _ = walk(sc.session, sc.task)
        assert [i for i, f in enumerate(frames) if f.flags & flag] == sc.notes["recovered"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_fgraph_recovers_the_first_pc_too(generation):
    lrs = [ret(2)]
    fps = [TASK_LOW + 0x3000]
    _, s, t, _, _ = blocked_chain(generation, lrs, fps=fps, first_pc=RETURN_TO_HANDLER,
                                  fgraph=[{"ret": ret(9), "retp": fps[0], "func": fn(9)}])
    frames, _ = walk(s, t)
    assert frames[0].pc == ret(9) and frames[0].flags & Flag.FGRAPH and frames[0].source is Source.TASK


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("lr,extra,what", [
    (RETURN_TO_HANDLER, {}, "return_to_handler"),
    (RETURN_TO_HANDLER, {"fgraph": [{"ret": ret(5), "retp": 0x1234, "func": 0}]}, "return_to_handler"),
    (RETURN_TO_HANDLER, {"fgraph": [{"ret": RETURN_TO_HANDLER, "retp": TASK_LOW + 0x3040, "func": 0}]},
     "return_to_handler"),
    (KRETPROBE_TRAMPOLINE, {}, "__kretprobe_trampoline"),
    (KRETPROBE_TRAMPOLINE, {"kretprobes": [{"ret": KRETPROBE_TRAMPOLINE, "fp": TASK_LOW + 0x3040}]},
     "__kretprobe_trampoline"),
])
def test_missing_recovery_entry_stops_without_inventing(generation, lr, extra, what):
    _, s, t, fps, _ = blocked_chain(generation, [ret(1), sign(lr, 7), ret(3)], **extra)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1)]
    assert stop.reason is StopReason.RECOVERY_FAILED and not stop.clean and what in stop.detail


@pytest.mark.parametrize("generation", GENERATIONS)
def test_record_pointing_at_itself(generation):
    fp = TASK_LOW + 0x3000
    _, s, t, _, _ = blocked_chain(generation, [ret(1)], fps=[fp], last_fp=fp)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1)]
    assert stop.reason is StopReason.TRANSITION_REFUSED and "already consumed" in stop.detail


@pytest.mark.parametrize("generation", GENERATIONS)
def test_record_pointing_backwards(generation):
    fps = [TASK_LOW + 0x3000, TASK_LOW + 0x3100]
    _, s, t, _, _ = blocked_chain(generation, [ret(1), ret(2)], fps=fps, last_fp=TASK_LOW + 0x3080)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1), ret(2)]
    assert stop.reason is StopReason.TRANSITION_REFUSED


@pytest.mark.parametrize("generation", GENERATIONS)
def test_misaligned_fp(generation):
    _, s, t, _, _ = blocked_chain(generation, [ret(1)], last_fp=TASK_LOW + 0x3104)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1)]
    assert stop.reason is StopReason.MISALIGNED_FP and "0xffff800083003104" in stop.detail


def test_misaligned_means_8_bytes_not_16():
    a, st, _ = build_chain("6.12", [ret(1)], last_fp=TASK_LOW + 0x3108)  # 8-aligned: accepted
    st.put(TASK_LOW + 0x3108, a.final_fp(st), ret(2))
    s, t = opened(a)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1), ret(2)] and stop.clean


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("where", [TASK_LOW + STACK_SIZE - 8, TASK_LOW - 16, 0])
def test_record_just_outside_the_stack(generation, where):
    _, s, t, _, _ = blocked_chain(generation, [ret(1)], last_fp=where)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1)]
    assert stop.reason is StopReason.OUTSIDE_STACK and "outside every stack" in stop.detail


@pytest.mark.parametrize("generation", GENERATIONS)
def test_backwards_stack_transition_is_refused(generation):
    """IRQ -> task -> IRQ again: the IRQ stack was left, so the third record is refused."""
    a = Arm64Synth(generation)
    task = a.task_stack(8, TASK_LOW, cpu=0)
    irq = a.sd.stack("irq", IRQ_LOW, STACK_SIZE, cpu=0)
    i_fp, t_fp, back = IRQ_LOW + 0x3000, TASK_LOW + 0x3000, IRQ_LOW + 0x3800
    irq.put(i_fp, t_fp, ret(1))
    task.put(t_fp, back, ret(2))
    irq.put(back, a.final_fp(task), ret(3))
    a.running(8, "busy", 0, pc=ret(60), x29=i_fp, sp=i_fp)
    s = a.session(S.FUNCS)
    frames, stop = walk(s, s.select(cpu=0)[0])
    assert [f.pc for f in frames] == [ret(60), ret(1), ret(2)]
    assert stop.reason is StopReason.TRANSITION_REFUSED and "already left" in stop.detail


@pytest.mark.parametrize("generation", GENERATIONS)
def test_blocked_task_unwinds_on_its_task_stack_alone(generation):
    a = Arm64Synth(generation)
    a.task_stack(7, TASK_LOW)
    irq = a.sd.stack("irq", IRQ_LOW, STACK_SIZE, cpu=0)
    irq.put(IRQ_LOW + 0x3000, 0, 0)
    a.blocked(7, "sleeper", fp=IRQ_LOW + 0x3000, pc=ret(60), sp=IRQ_LOW + 0x2FF0)
    s = a.session(S.FUNCS)
    t = s.select(pid=7)[0]
    assert [x.kind for x in t.stacks] == ["task"]
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60)] and stop.reason is StopReason.OUTSIDE_STACK


@pytest.mark.parametrize("generation", GENERATIONS)
def test_memory_not_captured(generation):
    a = Arm64Synth(generation)
    a.sd.stack("task", TASK_LOW, STACK_SIZE, pid=7, capture=False)
    a.blocked(7, "ghost", fp=TASK_LOW + 0x3000, pc=ret(60), sp=TASK_LOW + 0x2FF0)
    s = a.session(S.FUNCS)
    frames, stop = walk(s, s.select(pid=7)[0])
    assert [f.pc for f in frames] == [ret(60)] and stop.reason is StopReason.MEMORY_FAULT


def test_v6_12_final_check_comes_before_the_read():
    """v6.12 stops at the fixed place whatever the final record holds."""
    a, st, _ = build_chain("6.12", [ret(1)])
    st.put(a.final_fp(st), 0x1111, 0x2222)
    frames, stop = walk(*opened(a))
    assert [f.pc for f in frames] == [ret(60), ret(1)] and stop.reason is StopReason.END_OF_STACK


def test_v6_12_zero_record_elsewhere_is_reported_as_pc_zero():
    """v6.12 has no meta records: a {0, 0} record away from the end is an ordinary frame, then an error."""
    fps = [TASK_LOW + 0x3000, TASK_LOW + 0x3100]
    _, s, t, _, _ = blocked_chain("6.12", [ret(1), 0], fps=fps, last_fp=0)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1), 0] and stop.reason is StopReason.OUTSIDE_STACK


def test_v6_13_zero_record_elsewhere_is_metadata():
    fps = [TASK_LOW + 0x3000, TASK_LOW + 0x3100]
    for kind, says in ((1, "not at task_pt_regs"), (7, "type 0x7")):  # FINAL in the wrong place; unknown
        a, st, _ = build_chain("6.13", [ret(1), 0], fps=fps, last_fp=0)
        st.put(fps[1] + 16, kind)
        frames, stop = walk(*opened(a))
        assert [f.pc for f in frames] == [ret(60), ret(1)]
        assert stop.reason is StopReason.UNKNOWN_METADATA and says in stop.detail


def test_generation_override_and_dump_offsets():
    """--generation 6.13 on a dump built the 6.13 way but labelled 6.12; offsets from the dump win."""
    a = Arm64Synth("6.13")
    a.sd.release = "6.12.5-mislabelled"
    st = a.task_stack(7, TASK_LOW)
    a.chain(st, [TASK_LOW + 0x3000], [ret(1)], a.final_fp(st))
    a.blocked(7, "t", fp=TASK_LOW + 0x3000, pc=ret(60), sp=TASK_LOW + 0x2FF0)
    s = a.session(S.FUNCS)
    t = s.select(pid=7)[0]
    _, stop = walk(s, t)
    assert stop.reason is StopReason.OUTSIDE_STACK  # read as v6.12: the FINAL meta record is not its end
    frames, stop = walk(s, t, generation="6.13")
    assert [f.pc for f in frames] == [ret(60), ret(1)] and stop.reason is StopReason.END_OF_STACK
    # a v6.12 dump whose BTF offsets say the stackframe moved: the final record moves with it
    a, _, _ = build_chain("6.12", [ret(1)])
    a.sd.extra_meta["offsets"] = {"pt_regs": {"size": 352, "members": {"regs": 0, "pc": 256, "pstate": 264,
                                                                       "stackframe": "0x128"}}}
    s, t = opened(a)
    u = s.backend.unwinder(s.target(t, Options()))
    assert u.state.final_fp == TASK_LOW + STACK_SIZE - 352 + 0x128
    assert "from dump" in u.basis()["pt_regs"]
    # offsets that leave a member out (or put one past the size) are not a layout: the table stays
    for bad in ({"size": 352, "members": {"stackframe": 0x128}}, {"size": 200, "members": {"regs": 0, "pc": 256,
                                                                                           "pstate": 264, "stackframe": 296}}):
        a.sd.extra_meta["offsets"] = {"pt_regs": bad}
        s, t = opened(a)
        u = s.backend.unwinder(s.target(t, Options()))
        assert u.state.final_fp == TASK_LOW + STACK_SIZE - 336 + 304 and "table" in u.basis()["pt_regs"]


def test_running_cpu_in_user_mode_prints_nothing():
    a = Arm64Synth("6.12")
    a.task_stack(8, TASK_LOW, cpu=0)
    a.running(8, "user", 0, pc=0x400000, x29=0xFFFFF000, sp=0xFFFFEFF0, pstate=0x0)
    s = a.session(S.FUNCS)
    frames, stop = walk(s, s.select(cpu=0)[0])
    assert frames == [] and stop.reason is StopReason.USER_MODE and stop.clean


@pytest.mark.parametrize("generation", GENERATIONS)
def test_caller_start(generation):
    a = Arm64Synth(generation)
    st = a.task_stack(7, TASK_LOW)
    a.chain(st, [TASK_LOW + 0x3000], [ret(1)], a.final_fp(st))
    a.sd.blocked_task(7, "self", {"fp": TASK_LOW + 0x3000, "pc": ret(60), "caller": 1})
    s = a.session(S.FUNCS)
    frames, _ = walk(s, s.select(pid=7)[0])
    assert frames[0].source is Source.CALLER and [f.pc for f in frames] == [ret(60), ret(1)]


def test_no_release_detects_the_generation_from_the_final_record():
    for gen in GENERATIONS:
        a, _, _ = build_chain(gen, [ret(1)])
        a.sd.release = ""
        a.sd.vmcoreinfo.pop("OSRELEASE")
        s, _ = opened(a)
        u = s.backend.unwinder(s.target(s.select(pid=7)[0], Options()))
        assert u.meta_records == (gen == "6.13")
        frames, stop = walk(s, s.select(pid=7)[0])
        assert [f.pc for f in frames] == [ret(60), ret(1)] and stop.clean


def test_missing_register_is_a_stop_not_a_crash():
    a = Arm64Synth("6.13")
    a.task_stack(7, TASK_LOW)
    a.sd.blocked_task(7, "odd", {"pc": ret(1), "sp": TASK_LOW + 0x3000})
    frames, stop = walk(*opened(a))
    assert frames == [] and stop.reason is StopReason.MISSING_REGISTER and "fp" in stop.detail


SDEI_NORMAL, SDEI_CRITICAL = 0xFFFF800082700000, 0xFFFF800082800000


@pytest.mark.parametrize("generation", GENERATIONS)
def test_sdei_stacks_nest_one_way(generation):
    """SDEI critical -> SDEI normal -> task, as an NMI-like SDEI event nests."""
    a = Arm64Synth(generation)
    task = a.task_stack(8, TASK_LOW, cpu=0)
    crit = a.sd.stack("sdei_critical", SDEI_CRITICAL, STACK_SIZE, cpu=0)
    norm = a.sd.stack("sdei_normal", SDEI_NORMAL, STACK_SIZE, cpu=0)
    c_fp, n_fp, t_fp = SDEI_CRITICAL + 0x3F00, SDEI_NORMAL + 0x3F00, TASK_LOW + 0x3800
    crit.put(c_fp, n_fp, sign(ret(1), 1))
    norm.put(n_fp, t_fp, sign(ret(2), 2))
    task.put(t_fp, a.final_fp(task), ret(3))
    a.running(8, "busy", 0, pc=ret(60), x29=c_fp, sp=c_fp)
    s = a.session(S.FUNCS)
    frames, stop = walk(s, s.select(cpu=0)[0])
    assert [f.pc for f in frames] == [ret(60), ret(1), ret(2), ret(3)] and stop.clean
    assert [f.stack for f in frames[1:]] == ["sdei_critical", "sdei_normal", "task"]


def test_per_cpu_stacks_of_another_cpu_are_unusable():
    """The task running on cpu0 cannot follow a record onto cpu1's IRQ stack."""
    a = Arm64Synth("6.13")
    task = a.task_stack(8, TASK_LOW, cpu=0)
    a.sd.stack("irq", IRQ_LOW, STACK_SIZE, cpu=0)
    other = a.sd.stack("irq", IRQ_LOW + 0x10000, STACK_SIZE, cpu=1)
    other.put(IRQ_LOW + 0x13000, 0, 0)
    task.put(TASK_LOW + 0x3000, IRQ_LOW + 0x13000, ret(1))
    a.running(8, "busy", 0, pc=ret(60), x29=TASK_LOW + 0x3000, sp=TASK_LOW + 0x2F00)
    s = a.session(S.FUNCS)
    t = s.select(cpu=0)[0]
    assert sorted(x.label() for x in t.stacks) == ["irq@cpu0", "task@cpu0"]
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [ret(60), ret(1)] and stop.reason is StopReason.OUTSIDE_STACK
