"""Synthetic scenarios: every trace known by construction, in faithful and complete mode."""

from __future__ import annotations

from typing import Callable

import pytest

from unwind import Options, StopReason
from unwind.arch.riscv import synth as S
from unwind.cli.main import main
from unwind.core.frame import Flag, Source
from unwind.session.output import replay_json, replay_text
from unwind.session.replay import Replay
from unwind.core.walk import stack_walk

SCENARIOS: dict[str, Callable[[], S.Scenario]] = {
    "deep chain": lambda: S.deep_chain(200),
    "irq on the irq stack": S.irq_on_irq_stack,
    "irq stop at the handler's entry on the irq stack": lambda: S.irq_on_irq_stack(at_handler_entry=True),
    "exception nested on a syscall": S.exception_on_syscall,
    "exception, no text for the leaf": lambda: S.exception_on_syscall(leaf_code=False),
    "frameless leaf at entry": S.leaf_at_entry,
    "framed function at entry": lambda: S.leaf_at_entry("__cond_resched", 0x8),
    "framed function, ra stored, s0 not set": lambda: S.leaf_at_entry("__cond_resched", 0xC),
    "framed function in its epilogue": lambda: S.leaf_at_entry("__cond_resched", 0x18),
    "after the prologue": S.after_prologue,
    "syscall entry breakpoint": S.syscall_entry,
    "trap entry": S.trap_entry,
    "trap entry, s0 already overwritten": lambda: S.trap_entry(0x10),
    "trap entry from user mode": lambda: S.trap_entry(from_user=True),
    "the kernel's leaf rule": S.kernel_leaf_rule,
    "fgraph, running, retp matches": S.fgraph_hijack,
    "fgraph, blocked": lambda: S.fgraph_hijack(running=False),
    "fgraph, running, riscv retp": lambda: S.fgraph_hijack(kernel_retp=False),
    "fgraph, retp collision": S.fgraph_retp_collision,
    "fgraph, retp collision, with fp": lambda: S.fgraph_retp_collision(with_fp=True),
    "fgraph, a hijack in flight": S.fgraph_in_flight,
    "6.12 fgraph, running, two returns not recovered": S.fgraph_unrecovered,
    "7.x fgraph, blocked, retp matches": lambda: S.fgraph_hijack(running=False, release="7.2.0-synthetic"),
    "7.x fgraph, blocked, retp in ftrace_caller's frame":
        lambda: S.fgraph_hijack(running=False, kernel_retp=False, release="7.2.0-synthetic"),
    "7.x fgraph, blocked, retp collision, with fp":
        lambda: S.fgraph_retp_collision(with_fp=True, running=False, release="7.2.0-synthetic"),
    "6.12 fgraph, blocked, retp collision": lambda: S.fgraph_retp_collision(running=False),
    "7.x kernel thread": S.kthread_v7,
    "6.1 syscall, exception frame at ret_from_exception": S.syscall_v6_1,
    "kretprobe": S.kretprobe_hijack,
    "misaligned fp": lambda: S.broken_chain("misaligned"),
    "fp outside the stack": lambda: S.broken_chain("outside"),
    "self-loop": lambda: S.broken_chain("loop"),
    "user stack ending in fp 0": S.user_stack,
    "user stack, unreadable record": lambda: S.user_stack(unreadable=True),
}
_CHECKED = Flag.FGRAPH | Flag.KRETPROBE | Flag.COMPLETE | Flag.BOUNDARY


def replay(sc: S.Scenario, complete: bool, record: bool = False) -> Replay:
    return sc.session.replay(sc.task(), Options(complete=complete, record=record, user=sc.user))


@pytest.fixture(scope="module", params=list(SCENARIOS), ids=list(SCENARIOS))
def scenario(request) -> S.Scenario:
    return SCENARIOS[request.param]()


def test_faithful(scenario):
    r = replay(scenario, complete=False)
    assert [hex(f.pc) for f in r.frames] == [hex(p) for p in scenario.faithful]
    assert r.stop.reason is scenario.faithful_stop and r.stop.detail
    assert not any(f.flags & Flag.COMPLETE for f in r.frames)
    for f in r.frames:
        if f.pc in scenario.faithful_flags:
            assert f.flags & _CHECKED == scenario.faithful_flags[f.pc], f


#: scenarios the lockstep must walk to their end itself (any other it may hand to the scalar walk)
LOCKSTEP = ("deep chain", "7.x kernel thread", "6.1 syscall, exception frame at ret_from_exception")


def test_lockstep_prints_what_the_kernel_prints(scenario, request):
    """The batch walk, in lockstep, gives each scenario's faithful trace and stop, known by construction; the
    6.1 syscall (its exception frame exactly at ``ret_from_exception``, then user-mode ``pt_regs``) and the
    kernel threads it walks to their end itself."""
    from unwind.session.batch import replay_all

    if scenario.user:
        pytest.skip("user stacks are walked by the scalar path")
    batch = replay_all([scenario.session], Options(), tasks=[[scenario.task()]], lockstep=True)[0]
    assert [hex(f.pc) for f in batch[0].frames] == [hex(p) for p in scenario.faithful]
    assert batch[0].stop == replay(scenario, complete=False).stop
    if request.node.callspec.id in LOCKSTEP:
        assert batch.batched(0)


def test_complete(scenario):
    r = replay(scenario, complete=True)
    assert [hex(f.pc) for f in r.frames] == [hex(p) for p in scenario.complete]
    assert r.stop.reason is scenario.complete_stop
    added = set(scenario.complete) - set(scenario.faithful)
    for f in r.frames:
        if f.pc in scenario.complete_flags:
            assert f.flags & _CHECKED == scenario.complete_flags[f.pc], f
        elif f.pc not in added:
            assert not f.flags & Flag.COMPLETE, f


def test_provenance_changes_nothing_but_provenance(scenario):
    for complete in (False, True):
        plain, explained = replay(scenario, complete), replay(scenario, complete, record=True)
        assert [(f.pc, f.sp, f.fp, f.source, f.stack, f.flags) for f in plain.frames] == \
               [(f.pc, f.sp, f.fp, f.source, f.stack, f.flags) for f in explained.frames]
        assert all(f.provenance is None for f in plain.frames)
        assert all(f.provenance is not None for f in explained.frames)


def test_irq_stack_labels_and_sources():
    sc = S.irq_on_irq_stack()
    r = replay(sc, complete=True, record=True)
    stacks = [f.stack for f in r.frames]
    assert stacks[:4] == ["irq"] * 4 and set(stacks[4:]) == {"task"}
    assert r.frames[0].source is Source.REGS_PC and r.frames[0].flags & Flag.BOUNDARY
    assert r.frames[4].source is Source.STACK_SWITCH
    assert r.frames[6].source is Source.EXCEPTION_FRAME and r.frames[6].flags & Flag.BOUNDARY
    assert "call_on_irq_stack" in " ".join(r.frames[4].provenance.notes)
    faithful = replay(sc, complete=False)
    assert "does not leave the irq stack" in faithful.stop.detail and "--complete" in faithful.stop.detail
    # the kernel's own limit: clean but truncated, not an error (exit 0)
    assert faithful.stop.clean and faithful.stop.truncated and r.stop.clean and not r.stop.truncated


def test_live_ra_frame_explains_its_proof():
    sc = S.exception_on_syscall()
    r = replay(sc, complete=True, record=True)
    live = next(f for f in r.frames if f.source is Source.LIVE_LR)
    assert live.flags & Flag.COMPLETE
    text = " ".join(live.provenance.notes)
    assert "pt_regs->ra" in text and "frameless leaf" in text and "__clear_user" in live.provenance.rule


def test_explain_shows_record_bounds_and_why():
    sc = S.irq_on_irq_stack()
    r = replay(sc, complete=True, record=True)
    text = "\n".join(replay_text(sc.session, r, explain=True))
    rec = r.frames[1].provenance.reads[0]
    assert f"read {rec.addr:#x}+8" in text and "(frame->fp)" in text and "(frame->ra)" in text
    assert "fp_is_valid(fp " in text and "[sp+16, ALIGN(sp, THREAD_SIZE)] = [" in text
    assert "THREAD_SIZE 0x4000" in text
    assert "complete: crossed from the irq@cpu0 stack" in text
    assert "[complete: past call_on_irq_stack]" in text
    assert "--- call_on_irq_stack: IRQ stack -> task stack [complete] ---" in text


def test_format_trace_is_the_kernels():
    sc = S.deep_chain(3)
    r = replay(sc, complete=False)
    lines = [line.text for line in sc.session.backend.format_trace(r.frames, r.stop, r.target)]
    assert lines[0] == "Call Trace:"
    assert lines[1] == f"[<{sc.faithful[0]:016x}>] __schedule+0x3a6/0x400"
    assert lines[-1] == f"[<{sc.faithful[-1]:016x}>] ret_from_fork+0xe/0x40"
    sc = S.irq_on_irq_stack()
    r = replay(sc, complete=False)
    lines = [line.text for line in sc.session.backend.format_trace(r.frames, r.stop, r.target)]
    assert lines[:2] == ["epc : riscv_timer_interrupt+0x1c/0x400", " ra : handle_percpu_devid_irq+0x70/0x400"]
    sc = S.user_stack()
    r = replay(sc, complete=False)
    lines = [line.text for line in sc.session.backend.format_trace(r.frames, r.stop, r.target)]
    assert lines == ["<user stack trace>", *(f" =>  <{p:016x}>" for p in sc.faithful)]


def test_user_mode_cpu_has_no_kernel_trace():
    sc = S.user_stack()
    r = sc.session.replay(sc.task(), Options())
    assert r.frames == [] and r.stop.reason is StopReason.USER_MODE and r.stop.clean


def test_user_walk_needs_user_regs():
    sc = S.deep_chain(2)
    r = sc.session.replay(sc.task(), Options(user=True))
    assert r.stop.reason is StopReason.MISSING_REGISTER


def test_consumer_adapter_and_json():
    sc = S.irq_on_irq_stack()
    t = sc.session.target(sc.task(), Options())
    seen: list[int] = []
    stack_walk(sc.session.backend.unwinder(t), lambda pc: seen.append(pc) or len(seen) < 2)
    assert seen == sc.faithful[:2]
    js = replay_json(sc.session, replay(sc, complete=True, record=True), explain=True)
    assert js["frames"][4]["source"] == "stack-switch record" and "complete" in js["frames"][4]["flags"]
    assert js["frames"][1]["provenance"]["reads"][1]["what"] == "frame->ra"


def test_cli_replay_user_complete_explain(tmp_path, capsys):
    sc = S.user_stack()
    path = tmp_path / "user.core"
    path.write_bytes(sc.raw)
    assert main(["replay", str(path), "--user", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "<user stack trace>" in out and f" =>  <{sc.faithful[-1]:016x}>" in out and "buftail.fp" in out
    sc = S.irq_on_irq_stack()
    path, smap = tmp_path / "irq.core", tmp_path / "System.map"
    path.write_bytes(sc.raw)
    smap.write_text("".join(f"{a:016x} T {n}\n" for n, a in sorted(sc.synth.addr.items(), key=lambda x: x[1])))
    assert main(["replay", str(path), "--system-map", str(smap)]) == 0  # faithful stops at call_on_irq_stack
    assert main(["replay", str(path), "--system-map", str(smap), "--complete"]) == 0
    out = capsys.readouterr().out
    assert "[<ffffffff80001312>] call_on_irq_stack+0x32/0x40\n" in out
    assert "do_irq+0x3c/0x400 [complete: past call_on_irq_stack]" in out


def test_a_frame_record_in_a_page_excluded_from_the_dump_says_so():
    """A vmcore page makedumpfile filtered out (a hole of ExcludedPage) under a frame record: the walk
    stops at that record with the reason Memory gives, not a bare 'no captured memory'."""
    from unwind.core.memory import ExcludedPage, Memory, Segment

    sc = S.deep_chain(depth=8, frame_size=0x400)
    dump = sc.session.dump
    frames = sc.session.replay(sc.task()).frames
    page = (frames[4].fp - 16) & ~0xFFF  # the page of a record the walk reads midway
    rec = next(f.fp - 16 for f in frames if f.fp is not None and page <= f.fp - 16 < page + 0x1000)
    segs = []
    for seg in dump.memory.segments:
        if seg.start <= page < seg.end:
            segs += [Segment(seg.start, seg.data[:page - seg.start]),
                     Segment(page + 0x1000, seg.data[page + 0x1000 - seg.start:])]
        else:
            segs.append(seg)
    dump.memory = Memory(segs, holes=[(page, page + 0x1000, ExcludedPage)])
    r = sc.session.replay(sc.task())
    assert [f.pc for f in r.frames] == [f.pc for f in frames[:len(r.frames)]] and len(r.frames) < len(frames)
    assert r.stop.reason is StopReason.MEMORY_FAULT
    assert f"{rec:#x}" in r.stop.detail and "excluded from the dump" in r.stop.detail


WHY = "task->ret_stack 0xff60000001234000: memory not in the dump (beyond the end of the file)"


@pytest.mark.parametrize("release", ["6.12.0-synthetic", "7.2.0-synthetic"])
def test_a_return_stack_the_dump_lacks_stops_the_walk_where_the_kernel_would_search_it(release: str) -> None:
    sc = S.fgraph_hijack(running=release.startswith("6."), release=release)  # a task whose list 6.12 and 7.x read
    task = sc.task()
    retp = task.fgraph[0].retp
    task.fgraph, task.fgraph_lacks = [], WHY
    r = sc.session.replay(task, Options())
    assert [f.pc for f in r.frames] == sc.faithful[:3]
    assert r.stop.reason is StopReason.MEMORY_FAULT
    assert r.stop.detail == f"return_to_handler at &frame->ra {retp:#x}: {WHY}"


def test_a_return_stack_the_kernel_does_not_search_is_not_missed() -> None:
    sc = S.fgraph_hijack(running=False)  # 6.12 searches current's list, not this blocked task's
    task = sc.task()
    task.fgraph, task.fgraph_lacks = [], WHY
    r = sc.session.replay(task, Options())
    assert [f.pc for f in r.frames] == sc.faithful and r.stop.reason is sc.faithful_stop
