"""The registers a riscv walk establishes for each frame (what ``unwind gdb`` hands gdb), on a synthetic
stack whose records and ``pt_regs`` are known by construction."""

from __future__ import annotations

from unwind.arch.riscv.structs import GPR_NAMES
from unwind.arch.riscv.synth import exception_on_syscall
from unwind.core.frame import Flag


def test_exception_frame_gets_every_register_of_its_pt_regs() -> None:
    sc = exception_on_syscall()
    session = sc.session
    replay = session.replay(sc.task())
    frames = replay.frames
    assert [f.pc for f in frames] == sc.faithful
    boundary = next(i for i, f in enumerate(frames) if i and f.flags & Flag.BOUNDARY)
    # the kernel-mode pt_regs the scenario built (the other is the user syscall's)
    (built_at, built), = ((a, v) for a, v in sc.synth.built_pt_regs.items() if v["epc"] == sc.faithful[boundary])
    regs = session.backend.frame_registers(frames, boundary, replay.target)
    assert regs == {"pc": built["epc"], **{n: built[n] for n in GPR_NAMES}}
    assert frames[boundary].pt_regs == built_at


def test_record_frame_gets_s0_sp_and_its_return_address() -> None:
    sc = exception_on_syscall()
    session = sc.session
    replay = session.replay(sc.task())
    frames = replay.frames
    # frame 1 (do_page_fault) came from handle_mm_fault's record {fp, ra} at its s0 - 16
    callee_fp = sc.task().regs["s0"]
    record_fp = int.from_bytes(replay.target.mem.read(callee_fp - 16, 8), "little")
    regs = session.backend.frame_registers(frames, 1, replay.target)
    assert regs == {"pc": sc.faithful[1], "ra": sc.faithful[1], "sp": callee_fp, "s0": record_fp}
