"""The arch-free walk on the toy architecture: every rule known by construction."""

from __future__ import annotations

import pytest

from unwind import Options, StopReason, bpf_stack_walk, iter_frames, stack_walk, stack_walk_reliable
from unwind.core.frame import Flag, Source
from unwind.dev.synth import SynthDump
from unwind.core.walk import collect, kunwind_stack_walk

from .toy import BACKEND, META_UNKNOWN

TASK_LOW, SIZE = 0x10000, 0x4000
IRQ_LOW = 0x40000


def chain(sd: SynthDump, stack, fps: list[int], pcs: list[int], end=(0, 0)) -> None:
    """Records at fps[i] = {fps[i+1], pcs[i]}; the last holds ``end``."""
    for i, fp in enumerate(fps):
        nxt = (fps[i + 1], pcs[i]) if i + 1 < len(fps) else end
        stack.put(fp, *nxt)


def blocked(fps, pcs, end=(0, 0), first_pc=0x1000, **ctx):
    sd = SynthDump(BACKEND)
    task = sd.stack("task", TASK_LOW, SIZE, pid=7)
    chain(sd, task, fps, pcs, end)
    sd.blocked_task(7, "worker", {"fp": fps[0], "pc": first_pc, **ctx})
    s = sd.session()
    t = s.select(pid=7)[0]
    return s, t


def walk(s, t, **opt):
    return collect(s.backend.unwinder(s.target(t, Options(**opt))))


def test_deep_chain_ends_cleanly():
    fps = [TASK_LOW + 0x100 + 0x40 * i for i in range(100)]
    pcs = [0x2000 + i for i in range(100)]
    s, t = blocked(fps, pcs[:-1] + [0])
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [0x1000] + pcs[:-1]
    assert stop.reason is StopReason.END_OF_STACK and stop.clean
    assert frames[0].source is Source.TASK and frames[1].source is Source.FRAME


def test_low_bound_advances_past_each_record():
    fps = [TASK_LOW + 0x100, TASK_LOW + 0x200, TASK_LOW + 0x300]
    s, t = blocked(fps, [0x2000, 0x2001])
    u = s.backend.unwinder(s.target(t, Options()))
    u.start()
    u.next()
    assert u.stacks.stack.low == fps[0] + 16
    u.next()
    assert u.stacks.stack.low == fps[1] + 16


def test_self_referencing_record_terminates():
    fp = TASK_LOW + 0x100
    sd = SynthDump(BACKEND)
    sd.stack("task", TASK_LOW, SIZE, pid=7).put(fp, fp, 0x2000)  # {fp -> itself}
    sd.blocked_task(7, "loop", {"fp": fp, "pc": 0x1000})
    s = sd.session()
    frames, stop = walk(s, s.select(pid=7)[0])
    assert [f.pc for f in frames] == [0x1000, 0x2000]
    assert stop.reason is StopReason.TRANSITION_REFUSED
    assert "below the part of the current stack already consumed" in stop.detail


def test_backwards_record_is_refused():
    hi, lo = TASK_LOW + 0x300, TASK_LOW + 0x100
    s, t = blocked([hi, lo], [0x2000, 0x2001])
    frames, stop = walk(s, t)
    assert stop.reason is StopReason.TRANSITION_REFUSED
    assert len(frames) == 2


def _irq_then_task(second_irq_record: bool):
    """CPU0 runs pid 7: IRQ stack record -> task stack record (-> back to IRQ if asked)."""
    sd = SynthDump(BACKEND)
    task = sd.stack("task", TASK_LOW, SIZE, pid=7)
    irq = sd.stack("irq", IRQ_LOW, SIZE, cpu=0)
    irq_fp, task_fp = IRQ_LOW + 0x3F00, TASK_LOW + 0x200
    irq.put(irq_fp, task_fp, 0x3000)
    back = IRQ_LOW + 0x3F80 if second_irq_record else 0
    task.put(task_fp, back, 0x3001 if back else 0)
    irq.put(IRQ_LOW + 0x3F80, 0, 0)
    sd.running_task(7, "busy", 0, {"fp": irq_fp, "pc": 0x2FFF, "sp": irq_fp})
    s = sd.session()
    return s, s.select(cpu=0)[0]


def test_one_way_transition_irq_to_task():
    s, t = _irq_then_task(False)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [0x2FFF, 0x3000]
    # the return address 0x3000 was read from the record on the IRQ stack
    assert [f.stack for f in frames[1:]] == ["irq"]
    assert stop.reason is StopReason.END_OF_STACK


def test_transition_back_to_a_left_stack_is_refused():
    s, t = _irq_then_task(True)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [0x2FFF, 0x3000, 0x3001]
    assert stop.reason is StopReason.TRANSITION_REFUSED
    assert "already left" in stop.detail


def test_blocked_task_cannot_use_per_cpu_stacks():
    sd = SynthDump(BACKEND)
    sd.stack("task", TASK_LOW, SIZE, pid=7)
    irq = sd.stack("irq", IRQ_LOW, SIZE, cpu=0)
    irq.put(IRQ_LOW + 0x100, 0, 0)
    sd.blocked_task(7, "sleeper", {"fp": IRQ_LOW + 0x100, "pc": 0x1000})
    s = sd.session()
    t = s.select(pid=7)[0]
    assert [x.kind for x in t.stacks] == ["task"]
    frames, stop = walk(s, t)
    assert stop.reason is StopReason.OUTSIDE_STACK and len(frames) == 1


@pytest.mark.parametrize("fps,pcs,end,reason", [
    ([TASK_LOW + 0x104], [], (0, 0), StopReason.MISALIGNED_FP),
    ([TASK_LOW + 0x100], [], (0x900000, 0x2000), StopReason.OUTSIDE_STACK),
    ([TASK_LOW + 0x100], [], (TASK_LOW + 0x10, META_UNKNOWN), StopReason.UNKNOWN_METADATA),
    ([TASK_LOW + 0x100], [], (TASK_LOW + 0x200, 0xBAD), StopReason.BAD_PC),
])
def test_error_stops(fps, pcs, end, reason):
    s, t = blocked(fps, pcs, end)
    frames, stop = walk(s, t)
    assert stop.reason is reason and not stop.clean
    assert stop.detail


def test_memory_fault_on_uncaptured_stack():
    sd = SynthDump(BACKEND)
    sd.stack("task", TASK_LOW, SIZE, pid=7, capture=False)
    sd.blocked_task(7, "ghost", {"fp": TASK_LOW + 0x100, "pc": 0x1000})
    s = sd.session()
    frames, stop = walk(s, s.select(pid=7)[0])
    assert stop.reason is StopReason.MEMORY_FAULT
    assert "0x10100" in stop.detail


def test_frame_limit_and_consumer_stop():
    fps = [TASK_LOW + 0x100 + 0x20 * i for i in range(50)]
    s, t = blocked(fps, list(range(0x2000, 0x2031)) + [0])
    u = s.backend.unwinder(s.target(t, Options()))
    stop = kunwind_stack_walk(u, lambda f: True, max_frames=10)
    assert stop.reason is StopReason.FRAME_LIMIT and stop.frames == 10 and not stop.clean
    seen: list[int] = []
    stop = stack_walk(s.backend.unwinder(s.target(t, Options())), lambda pc: seen.append(pc) or len(seen) < 3)
    assert stop.reason is StopReason.CONSUMER_STOPPED and stop.clean and seen == [0x1000, 0x2000, 0x2001]


def test_reliable_adapter():
    # a clean blocked chain is reliable
    s, t = blocked([TASK_LOW + 0x100, TASK_LOW + 0x200], [0x2000, 0])
    ok = stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True)
    assert ok.ok
    # a guess fails it
    s, t = blocked([TASK_LOW + 0x100, TASK_LOW + 0x200], [0x2000, 0], guess=1)
    bad = stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True)
    assert not bad.ok and "guessed" in bad.reason
    # an exception boundary fails it
    s, t = _irq_then_task(False)
    bad = stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True)
    assert not bad.ok and "exception boundary" in bad.reason
    # an error stop fails it
    s, t = blocked([TASK_LOW + 0x104], [])
    bad = stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True)
    assert not bad.ok and "misaligned" in bad.reason


def test_bpf_adapter_passes_sp_zero():
    s, t = blocked([TASK_LOW + 0x100, TASK_LOW + 0x200], [0x2000, 0])
    got = []
    bpf_stack_walk(s.backend.unwinder(s.target(t, Options())), lambda ip, sp, fp: got.append((ip, sp, fp)) or True)
    assert got == [(0x1000, 0, TASK_LOW + 0x100), (0x2000, 0, TASK_LOW + 0x200)]


def test_iterator_matches_walk_and_returns_stop():
    s, t = blocked([TASK_LOW + 0x100, TASK_LOW + 0x200], [0x2000, 0])
    it = iter_frames(s.backend.unwinder(s.target(t, Options())))
    pcs = []
    try:
        while True:
            pcs.append(next(it).pc)
    except StopIteration as e:
        stop = e.value
    assert pcs == [0x1000, 0x2000] and stop.reason is StopReason.END_OF_STACK


def test_provenance_only_when_recording():
    s, t = _irq_then_task(True)
    frames, _ = walk(s, t)
    assert all(f.provenance is None for f in frames)
    frames, _ = walk(s, t, record=True)
    prov = frames[2].provenance
    assert prov is not None and [r.what for r in prov.reads] == ["fp", "lr"]
    assert [r.addr for r in prov.reads] == [TASK_LOW + 0x200, TASK_LOW + 0x208]
    assert "moved from the irq@cpu0 stack to task" in prov.notes[0]
    assert frames[0].flags & Flag.BOUNDARY
