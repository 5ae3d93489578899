"""Complete mode on hand-assembled text: the x30 caller only where the code proves it is live."""

from __future__ import annotations

import pytest

from unwind import Options
from unwind.arch.arm64 import synth as S
from unwind.arch.arm64.complete import LrAnalyser
from unwind.arch.arm64.synth import (EQ, NE, ADD_X0_X0_1, AUTIASP, BR_X16, BTI_C, LDP_FP_LR_POST16, MOV_FP_SP,
                                     MOV_X1_X0, NOP, PACIASP, RET, RETURN_TO_HANDLER, STP_FP_LR_PRE16,
                                     STP_FP_LR_PRE32, TASK_LOW, Arm64Synth, b, bcond, bl, fn, ret, sign)
from unwind.core.frame import Flag, Source
from unwind.session.output import replay_text
from unwind.core.walk import collect

F = fn(30)          # the interrupted function
CALLER = ret(31)    # where x30 returns to
#: a normal function: bti; paciasp; stp; mov x29, sp; bl; ldp; autiasp; ret
PROLOGUE = [BTI_C, PACIASP, STP_FP_LR_PRE32, MOV_FP_SP, bl(F + 16, fn(40)), LDP_FP_LR_POST16, AUTIASP, RET]


def running_at(code, pc, *, generation="6.13", x30=None, with_text=True, caller_record_lr=None, **kw):
    """CPU0 stopped in F at ``pc`` with x29 = F's caller's record (its LR returning into func32)."""
    a = Arm64Synth(generation)
    st = a.task_stack(8, TASK_LOW, cpu=0)
    rec = TASK_LOW + 0x3000
    st.put(rec, TASK_LOW + 0x3100, caller_record_lr if caller_record_lr is not None else sign(ret(32), 0x21))
    st.put(TASK_LOW + 0x3100, a.final_fp(st), ret(33))
    a.image.put(F, code)
    a.running(8, "busy", 0, pc=pc, x29=rec, sp=rec - 0x40,
              x30=sign(CALLER, 0x77) if x30 is None else x30, **kw)
    s = a.session(S.FUNCS, with_text=with_text)
    return s, s.select(cpu=0)[0], a


def pcs(s, t, **opt):
    frames, stop = collect(s.backend.unwinder(s.target(t, Options(**opt))))
    return [f.pc for f in frames], frames, stop


FAITHFUL_TAIL = [ret(32), ret(33)]


@pytest.mark.parametrize("generation", ["6.12", "6.13"])
@pytest.mark.parametrize("off", [0, 4, 8, 12])
def test_entry_before_x29_is_set(generation, off):
    """At +0..+0xc (bti, paciasp, stp done but not mov x29) x29 is the caller's: x30 is live."""
    s, t, _ = running_at(PROLOGUE, F + off, generation=generation)
    faithful, _, _ = pcs(s, t)
    assert faithful == [F + off] + FAITHFUL_TAIL
    got, frames, stop = pcs(s, t, complete=True)
    assert got == [F + off, CALLER] + FAITHFUL_TAIL and stop.clean
    assert frames[1].source is Source.LIVE_LR
    assert frames[1].flags & Flag.COMPLETE and frames[1].flags & Flag.PAC_STRIPPED
    assert not frames[1].reliable


@pytest.mark.parametrize("off,why", [(16, "a write to x29/x30 reaches the pc (+0xc: mov x29, sp)"),
                                     (20, "a write to x29/x30 reaches the pc")])
def test_after_mov_x29_nothing_is_added(off, why):
    s, t, _ = running_at(PROLOGUE, F + off)
    got, _, _ = pcs(s, t, complete=True)
    assert got == [F + off] + FAITHFUL_TAIL
    proof = LrAnalyser(s.target(t, Options())).prove(F + off)
    assert not proof.live and proof.reason.startswith(why)


def test_leaf_anywhere():
    leaf = [ADD_X0_X0_1, MOV_X1_X0, b(F + 8, F), RET]   # a loop, but x29/x30 are never touched
    s, t, _ = running_at(leaf, F + 8)
    got, frames, _ = pcs(s, t, complete=True, record=True)
    assert got == [F + 8, CALLER] + FAITHFUL_TAIL
    assert "leaf: no instruction of func30 writes x29 or x30 or calls" in frames[1].provenance.notes


def test_a_branch_back_after_the_frame_is_built_is_refused():
    code = [NOP, ADD_X0_X0_1, STP_FP_LR_PRE16, MOV_FP_SP, bl(F + 16, fn(40)), b(F + 20, F + 4), RET]
    s, t, _ = running_at(code, F + 4)
    got, _, _ = pcs(s, t, complete=True)
    assert got == [F + 4] + FAITHFUL_TAIL
    assert LrAnalyser(s.target(t, Options())).prove(F + 4).reason.startswith("a write to x29/x30 reaches the pc")


def test_shrink_wrapped_fast_path_with_a_clean_loop():
    """The frame is built only on an out-of-line slow path that returns: the loop before it stays clean."""
    code = [NOP, ADD_X0_X0_1, bcond(F + 8, F + 0x14, NE), bcond(F + 0xC, F + 4, EQ), RET,
            PACIASP, STP_FP_LR_PRE16, MOV_FP_SP, bl(F + 0x20, fn(40)), LDP_FP_LR_POST16, AUTIASP, RET]
    for off in (4, 8, 0xC, 0x10):
        s, t, _ = running_at(code, F + off)
        assert pcs(s, t, complete=True)[0] == [F + off, CALLER] + FAITHFUL_TAIL
    s, t, _ = running_at(code, F + 0x24)  # after bl in the slow path
    assert pcs(s, t, complete=True)[0] == [F + 0x24] + FAITHFUL_TAIL


def test_indirect_branch_is_refused():
    code = [NOP, STP_FP_LR_PRE16, MOV_FP_SP, BR_X16]
    s, t, _ = running_at(code, F)
    assert pcs(s, t, complete=True)[0] == [F] + FAITHFUL_TAIL


def test_no_text_no_frame():
    s, t, _ = running_at(PROLOGUE, F, with_text=False)
    assert pcs(s, t, complete=True)[0] == [F] + FAITHFUL_TAIL


def test_x30_already_in_the_next_record_is_refused():
    """If the record at x29 returns where x30 does, x29 was the function's own record: add nothing."""
    s, t, _ = running_at(PROLOGUE, F, caller_record_lr=sign(CALLER, 0x5))
    got, _, _ = pcs(s, t, complete=True)
    assert got == [F, CALLER, ret(33)]


def test_live_lr_hijacked_by_fgraph_is_recovered():
    a_rec = TASK_LOW + 0x3000
    s, t, _ = running_at(PROLOGUE, F + 8, x30=RETURN_TO_HANDLER,
                         fgraph=[{"ret": CALLER, "retp": a_rec, "func": F}])
    got, frames, _ = pcs(s, t, complete=True)
    assert got == [F + 8, CALLER] + FAITHFUL_TAIL and frames[1].flags & Flag.FGRAPH


@pytest.mark.parametrize("generation", ["6.12", "6.13"])
def test_exception_boundary_in_both_generations(generation):
    sc = S.el1_exception(generation, with_text=True)
    frames, _ = collect(sc.session.backend.unwinder(sc.session.target(sc.task, Options(complete=True))))
    assert [f.pc for f in frames] == sc.notes["complete"]
    added = [f for f in frames if f.flags & Flag.COMPLETE]
    assert len(added) == 1 and added[0].pc == ret(21) and added[0].source is Source.LIVE_LR
    # after the prologue the kernel already shows func21: nothing to add
    sc = S.el1_exception(generation, with_text=True, entry_pc=False)
    frames, _ = collect(sc.session.backend.unwinder(sc.session.target(sc.task, Options(complete=True))))
    assert [f.pc for f in frames] == sc.expected


def test_vector_stop_pseudo_frame():
    vec = S.VECTORS + 0x280
    s, t, _ = running_at(PROLOGUE, F + 20, normalised="vectors+0x280 -> ELR_EL1/SPSR_EL1")  # the capture's note
    faithful, _, _ = pcs(s, t)
    got, frames, _ = pcs(s, t, complete=True, record=True)
    assert got == [vec] + faithful
    assert frames[0].source is Source.EXCEPTION_FRAME and frames[0].flags & Flag.COMPLETE
    r = s.replay(t, Options(complete=True, record=True))
    text = "\n".join(replay_text(s, r, explain=True))
    assert "vectors+0x280/" in text and "[complete: vector]" in text and "entry 5 (offset 0x280)" in text


def test_vector_stop_from_user_mode_then_stops():
    vec = S.VECTORS + 0x400
    s, t, _ = running_at(PROLOGUE, 0x4000, pstate=0, normalised=f"stopped at {vec:#x}, normalised to ELR_EL1")
    got, _, stop = pcs(s, t, complete=True)
    assert got == [vec] and stop.reason.name == "USER_MODE"


def test_explain_states_the_proof():
    s, t, _ = running_at(PROLOGUE, F + 8)
    r = s.replay(t, Options(complete=True, record=True))
    text = "\n".join(replay_text(s, r, explain=True))
    assert "func31+0x40/0x100 [complete: live lr]" in text
    assert "rule: live link register (entry)" in text
    assert "no write to x29/x30 reaches the pc on any path from the entry; before it: +0x0: bti c; +0x4: paciasp" in text
    assert "first write in the function: +0xc: mov x29, sp" in text
    assert f"lr raw {sign(CALLER, 0x77):#x} -> stripped {CALLER:#x}" in text


# -- oracle categories (unwind diff) ------------------------------------------------

def _compare(oracle, **kw):
    from unwind.cli.corpus import compare_oracle
    s, t, _ = running_at(PROLOGUE, kw.pop("pc", F + 8), **kw)
    return compare_oracle(s, {"cpu": 0, **oracle})


def gdb(*pcs):
    return {"source": "gdb", "frames": [hex(p) for p in pcs]}


def test_gdb_with_the_x30_caller_is_exact_in_complete_mode():
    assert _compare(gdb(F + 8, CALLER, *FAITHFUL_TAIL)).category == "exact"
    assert _compare(gdb(F + 8, CALLER, *FAITHFUL_TAIL), with_text=False).category == "entry-or-leaf"


def test_gdb_categories():
    assert _compare(gdb(F + 8, sign(CALLER, 0x77), ret(32))).category == "oracle-stops-early"
    assert _compare(gdb(F + 8, sign(CALLER, 0x77), *FAITHFUL_TAIL)).category == "oracle-pac"
    assert _compare(gdb(F + 8, CALLER, *FAITHFUL_TAIL, 0x4000, 0x5000)).category == "oracle-continues"
    assert _compare(gdb(F + 8, ret(40), *FAITHFUL_TAIL)).category == "unexplained"
    vec = {"normalised": "vectors+0x280 -> ELR_EL1/SPSR_EL1"}
    assert _compare(gdb(F + 20, *FAITHFUL_TAIL), pc=F + 20, **vec).category == "vector"


def test_kernel_oracles_must_be_exact_unless_stale():
    dump_backtrace = {"source": "dump_backtrace", "frames": [hex(F + 8), *map(hex, FAITHFUL_TAIL)]}
    assert _compare(dump_backtrace).category == "exact"
    wrong = {**dump_backtrace, "frames": [hex(F + 8), hex(CALLER), *map(hex, FAITHFUL_TAIL)]}
    assert _compare(wrong).category == "unexplained"
    assert _compare({**wrong, "stale": True}).category == "stale"


def test_v6_12_explain_names_the_pt_regs_record():
    sc = S.el1_exception("6.12", with_text=True, entry_pc=False)
    r = sc.session.replay(sc.task, Options(complete=True, record=True))
    elr = r.frames[sc.notes["boundary_index"]]
    assert any("stackframe of an EL1 pt_regs" in n for n in elr.provenance.notes)
    assert any(n.startswith("complete: the x30 caller is not added: a write to x29/x30 reaches the pc")
               for n in elr.provenance.notes)


@pytest.mark.parametrize("generation", ["6.12", "6.13"])
@pytest.mark.parametrize("name", sorted(S.CLEAN_SCENARIOS))
def test_complete_mode_never_changes_the_faithful_frames(name, generation):
    sc = S.CLEAN_SCENARIOS[name](generation)
    faithful, _ = collect(sc.session.backend.unwinder(sc.session.target(sc.task, Options())))
    complete, _ = collect(sc.session.backend.unwinder(sc.session.target(sc.task, Options(complete=True))))
    kept = [f for f in complete if not f.flags & Flag.COMPLETE]
    assert [(f.pc, f.fp, f.source, f.flags) for f in kept] == [(f.pc, f.fp, f.source, f.flags) for f in faithful]


def test_hijacked_x30_and_hijacked_next_record_both_recover():
    """F and its caller both graph-traced: x30 and the record at x29 both hold return_to_handler."""
    rec = TASK_LOW + 0x3000
    s, t, _ = running_at(PROLOGUE, F + 8, x30=RETURN_TO_HANDLER, caller_record_lr=sign(RETURN_TO_HANDLER, 3),
                         fgraph=[{"ret": ret(32), "retp": TASK_LOW + 0x3100, "func": fn(31)},
                                 {"ret": CALLER, "retp": rec, "func": F}])
    got, frames, stop = pcs(s, t, complete=True)
    assert got == [F + 8, CALLER] + FAITHFUL_TAIL and stop.clean
    assert frames[1].flags & Flag.FGRAPH and frames[2].flags & Flag.FGRAPH


def test_gdb_with_an_unproven_caller_that_also_stops_early():
    assert _compare(gdb(F + 8, CALLER, ret(32)), with_text=False).category == "entry-or-leaf"


EPILOGUE = [PACIASP, STP_FP_LR_PRE16, MOV_FP_SP, bl(F + 12, fn(40)), LDP_FP_LR_POST16, AUTIASP, RET]


@pytest.mark.parametrize("off,live", [(0x10, False), (0x14, True), (0x18, True)])
def test_epilogue_after_the_record_is_restored(off, live):
    """After ``ldp x29, x30, [sp], #16`` x29 is the caller's again and x30 its return address."""
    s, t, _ = running_at(EPILOGUE, F + off)
    got, frames, _ = pcs(s, t, complete=True, record=True)
    assert got == [F + off] + ([CALLER] if live else []) + FAITHFUL_TAIL
    if live:
        assert frames[1].provenance.rule.startswith("live link register (epilogue)")
        assert any(n.startswith("epilogue: +0x10: ldp x29, x30, [sp], #0x10 restored") for n in frames[1].provenance.notes)


def test_epilogue_reached_by_a_branch_is_refused():
    code = EPILOGUE[:-1] + [RET, b(F + 0x1C, F + 0x18)]  # something else jumps to the ret
    s, t, _ = running_at(code, F + 0x18)
    assert pcs(s, t, complete=True)[0] == [F + 0x18] + FAITHFUL_TAIL
