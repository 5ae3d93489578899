"""The ORC unwinder on synthetic scenarios whose answer is known by construction."""

from __future__ import annotations

import pytest

from unwind import Options, StopReason
from unwind.core.dumpinfo import StructOffsets
from unwind.arch.x86_64.orc import (ORC_REG_AX, ORC_REG_BP, ORC_REG_BP_INDIRECT, ORC_REG_DI, ORC_REG_DX,
                                    ORC_REG_PREV_SP, ORC_REG_R10, ORC_REG_R13, ORC_REG_SP_INDIRECT, OrcEntry)
from unwind.arch.x86_64.synth import (END_OF_STACK, FP_FRAME, KERNEL_CS, KERNEL_SS, TEXT, UNDEFINED, USER_CS,
                                      USER_SS, OrcBuilder, call, put_pt_regs, regs, session)
from unwind.arch.x86_64.unwind_orc import OrcUnwinder
from unwind.core.frame import Flag, Source
from unwind.dev.synth import SynthDump
from unwind.core.walk import bpf_stack_walk, collect, stack_walk_reliable

TASK_LO, IRQ_LO, NMI_LO = 0xFFFFC90000010000, 0xFFFFC90000000000, 0xFFFFFE0000008000
STACK = 0x4000
MODULE_PC = 0xFFFFFFFFC0001234


def kernel() -> OrcBuilder:
    """__schedule -> schedule -> do_nanosleep -> kthread -> ret_from_fork -> ret_from_fork_asm."""
    b = OrcBuilder()
    b.func("__schedule", 0x200, (0, call(16)))
    b.func("schedule", 0x40, (0, call(8)))
    b.func("do_nanosleep", 0x80, (0, call(24, bp_reg=ORC_REG_PREV_SP, bp_offset=-16)))
    b.func("kthread", 0x100, (0, call(8)))
    b.func("ret_from_fork", 0x40, (0, call(8)))
    b.func("ret_from_fork_asm", 0x20, (0, END_OF_STACK))
    b.func("return_to_handler", 0x20, (0, call(8)))
    b.func("arch_rethook_trampoline", 0x20, (0, call(8)))
    return b


def chain(stack, sp: int, frames: list[tuple[int, int]]) -> int:
    """Frames of CALL entries ``sp:sp+size``: the return address sits at ``sp + size - 8``."""
    for size, ret in frames:
        stack.put(sp + size - 8, ret)
        sp += size
    return sp


def blocked(b: OrcBuilder, build, version: int = 3, release: str = "6.12.0-synthetic", modules=(), **task):
    """A blocked task on a task stack; ``build(stack, a)`` writes it and returns thread.sp; ``modules`` are the
    note's ``modules[]``."""
    sd = SynthDump("x86_64", release)
    sd.extra_meta["modules"] = list(modules)
    st = sd.stack("task", TASK_LO, STACK, pid=7)
    tsp = build(st, b.addr)
    sd.blocked_task(7, "worker", {"sp": tsp}, **task)
    s = session(sd, b.image(version))
    return s, s.select(pid=7)[0]


def walk(s, t, **opt):
    return collect(s.backend.unwinder(s.target(t, Options(**opt))))


def sleeping(st, a, tsp=TASK_LO + 0x3000, bp=0xB0B0):
    st.put(tsp, 15, 14, 13, 12, 11, bp, a["__schedule"] + 0x50)  # inactive_task_frame
    sp = tsp + 56
    st.put(sp + 16 + 8 + 8, 0xB1B1)  # do_nanosleep saved bp at its CFA-16
    chain(st, sp, [(16, a["schedule"] + 0x10), (8, a["do_nanosleep"] + 0x20), (24, a["kthread"] + 0x30),
                   (8, a["ret_from_fork"] + 0x10), (8, a["ret_from_fork_asm"] + 0x8)])
    return tsp


EXPECTED = ["__schedule", 0x50, "schedule", 0x10, "do_nanosleep", 0x20, "kthread", 0x30, "ret_from_fork", 0x10,
            "ret_from_fork_asm", 0x8]


def pcs(b, names_offs):
    return [b.addr[n] + o for n, o in zip(names_offs[::2], names_offs[1::2])]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_blocked_task_every_generation(version):
    b = kernel()
    s, t = blocked(b, sleeping, version=version, release={1: "6.1.0-57-amd64"}.get(version, "6.12.0"))
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == pcs(b, EXPECTED)
    assert stop.reason is StopReason.END_OF_STACK and stop.clean
    assert frames[0].source is Source.TASK and all(f.source is Source.ORC_CALL for f in frames[1:])
    assert frames[0].sp == TASK_LO + 0x3000 + 56 and frames[0].fp == 0xB0B0
    assert frames[4].fp == 0xB1B1  # bp:prevsp-16 of do_nanosleep's frame
    assert all(f.stack == "task" and f.reliable for f in frames)
    assert stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True).ok


def test_new_task_at_ret_from_fork_asm_is_a_signal_frame():
    b = kernel()
    b.rows.append((b.addr["ret_from_fork_asm"] - 1 + 0, call(8)))  # what ip-1 would find instead
    s, t = blocked(b, lambda st, a: st.put(TASK_LO + 0x3F00, 0, 0, 0, 0, 0, 0, a["ret_from_fork_asm"]) and
                   TASK_LO + 0x3F00)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["ret_from_fork_asm"]]
    assert stop.reason is StopReason.END_OF_STACK


def test_bp_based_frame_and_provenance():
    b = kernel()
    b.func("fp_user", 0x40, (0, FP_FRAME))

    def build(st, a):
        tsp = TASK_LO + 0x3000
        bp = TASK_LO + 0x3100
        st.put(tsp, 0, 0, 0, 0, 0, bp, a["fp_user"] + 0x10)
        st.put(bp, TASK_LO + 0x3200, a["kthread"] + 0x30)  # push %rbp frame: {saved bp, ret}
        st.put(bp + 16, a["ret_from_fork_asm"] + 0x8)  # kthread: call(8) from its sp bp+16
        return tsp
    s, t = blocked(b, build)
    frames, stop = walk(s, t, record=True)
    assert [f.pc for f in frames] == [b.addr["fp_user"] + 0x10, b.addr["kthread"] + 0x30,
                                      b.addr["ret_from_fork_asm"] + 0x8]
    assert frames[1].sp == TASK_LO + 0x3110 and frames[1].fp == TASK_LO + 0x3200
    prov = frames[1].provenance
    assert "sp:bp+16 bp:prevsp-16" in prov.rule and [r.what for r in prov.reads] == [
        "return address", "saved bp at prevsp+offset"]


def running(b: OrcBuilder, cpu_regs: dict, build, stacks=(("task", TASK_LO),), version: int = 3):
    """A task running on cpu0; ``build(stacks_by_kind, addr)`` writes memory."""
    sd = SynthDump("x86_64")
    made = {kind: sd.stack(kind, lo, STACK, cpu=0 if kind != "task" else None, pid=7 if kind == "task" else None)
            for kind, lo in stacks}
    build(made, b.addr)
    sd.running_task(7, "busy", 0, {"cs": KERNEL_CS, "ss": KERNEL_SS, **cpu_regs})
    s = session(sd, b.image(version))
    return s, s.select(pid=7)[0]


def test_irq_stack_crossing_through_sp_indirect():
    b = kernel()
    b.func("handler", 0x40, (0, call(8)))
    b.func("sysvec", 0x80, (0, call(16)), (0x20, call(16, ORC_REG_SP_INDIRECT)), (0x28, call(16)))
    irq_top = IRQ_LO + STACK
    task_sp = TASK_LO + 0x3000

    def build(st, a):
        st["irq"].put(irq_top - 8, task_sp)       # call_on_irqstack saved the task sp at the top
        st["irq"].put(irq_top - 16, a["sysvec"] + 0x25)  # handler's return into the call site
        st["task"].put(task_sp + 8, a["kthread"] + 0x30)  # sysvec frame on the task stack: CFA = *sp + 16
        st["task"].put(task_sp + 16, a["ret_from_fork_asm"] + 8)
    s, t = running(b, {"rip": b.addr["handler"] + 4, "rsp": irq_top - 16, "rbp": 0},
                   build, stacks=(("task", TASK_LO), ("irq", IRQ_LO)))
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["handler"] + 4, b.addr["sysvec"] + 0x25, b.addr["kthread"] + 0x30,
                                      b.addr["ret_from_fork_asm"] + 8]
    assert [f.stack for f in frames] == ["irq", "irq", "task", "task"]
    assert frames[0].source is Source.REGS_PC and frames[0].flags & Flag.BOUNDARY
    assert stop.reason is StopReason.END_OF_STACK
    text = [line.text for line in s.backend.format_trace(frames, stop, s.target(t, Options()))]
    assert text[0].startswith("RIP: 0010:handler+0x4/") and "Call Trace:" in text
    assert text[text.index("Call Trace:") + 1:] == [" <IRQ>", " sysvec+0x25/0x80", " </IRQ>", " <TASK>",
                                                    " kthread+0x30/0x100", " ret_from_fork_asm+0x8/0x20",
                                                    " </TASK>"]


def test_exception_stack_crossing_through_full_pt_regs():
    b = kernel()
    b.func("nmi_handler", 0x40, (0, call(8)))
    b.func("asm_exc_nmi", 0x80, (0, regs(0)))
    b.func("default_idle", 0x40, (0, call(8)))
    nmi_top = NMI_LO + STACK  # the interrupted context's pt_regs sit at the top: next_sp
    task_sp = TASK_LO + 0x3000
    pt = nmi_top - 168

    def build(st, a):
        st["exception:NMI"].put(pt - 8, a["asm_exc_nmi"] + 0x10)  # nmi_handler returns into the asm entry
        put_pt_regs(st["exception:NMI"], pt, ip=a["default_idle"] + 7, cs=KERNEL_CS, sp=task_sp, ss=KERNEL_SS,
                    bp=0x4242, r10=1)
        st["task"].put(task_sp, a["kthread"] + 0x30)
        st["task"].put(task_sp + 8, a["ret_from_fork_asm"] + 8)
    s, t = running(b, {"rip": b.addr["nmi_handler"] + 3, "rsp": pt - 8}, build,
                   stacks=(("task", TASK_LO), ("exception:NMI", NMI_LO)))
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["nmi_handler"] + 3, b.addr["asm_exc_nmi"] + 0x10,
                                      b.addr["default_idle"] + 7, b.addr["kthread"] + 0x30,
                                      b.addr["ret_from_fork_asm"] + 8]
    assert frames[2].source is Source.ORC_REGS and frames[2].fp == 0x4242 and frames[2].stack == "exception:NMI"
    assert frames[2].flags & Flag.BOUNDARY and not frames[1].flags & Flag.BOUNDARY
    assert [f.stack for f in frames[3:]] == ["task", "task"]
    r = stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True)
    assert r.ok  # ORC accepts kernel-mode pt_regs
    text = [line.text for line in s.backend.format_trace(frames, stop, s.target(t, Options()))]
    i = text.index(" <NMI>")
    assert text[i + 1] == " asm_exc_nmi+0x10/0x80" and text[i + 2].startswith("RIP: 0010:default_idle+0x7/")
    assert " </NMI>" in text and " <TASK>" in text


def test_regs_partial_then_register_from_previous_full_regs():
    """REGS (full) -> REGS_PARTIAL (IRET frame, prev_regs kept) -> sp from DI of the previous full regs."""
    b = kernel()
    b.func("inner", 0x40, (0, regs(0)))
    b.func("entry_a", 0x40, (0, regs(0, partial=True)))
    b.func("entry_b", 0x40, (0, call(0, ORC_REG_DI)))
    full = TASK_LO + 0x2000
    iret = TASK_LO + 0x2200
    final = TASK_LO + 0x2400

    def build(st, a):
        put_pt_regs(st["task"], full, ip=a["entry_a"] + 4, cs=KERNEL_CS, sp=iret, ss=KERNEL_SS, di=final + 8)
        st["task"].put(iret, a["entry_b"] + 4, KERNEL_CS, 0x246, iret + 0x100, KERNEL_SS)
        st["task"].put(final, a["ret_from_fork_asm"] + 8)
    s, t = running(b, {"rip": b.addr["inner"] + 1, "rsp": full}, build)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["inner"] + 1, b.addr["entry_a"] + 4, b.addr["entry_b"] + 4,
                                      b.addr["ret_from_fork_asm"] + 8]
    assert [f.source for f in frames[1:]] == [Source.ORC_REGS, Source.ORC_REGS_PARTIAL, Source.ORC_CALL]
    assert [f.pt_regs for f in frames] == [None, full, iret - 128, None]
    assert stop.reason is StopReason.END_OF_STACK


@pytest.mark.parametrize("reg,cpu_name", [(ORC_REG_R10, "r10"), (ORC_REG_R13, "r13"), (ORC_REG_DI, "rdi"),
                                          (ORC_REG_DX, "rdx"), (ORC_REG_AX, "rax")])
def test_register_based_cfa_from_the_cpu_registers(reg, cpu_name):
    b = kernel()
    b.func("drap", 0x40, (0, call(0, reg)))
    cfa = TASK_LO + 0x3800

    def build(st, a):
        st["task"].put(cfa - 8, a["ret_from_fork_asm"] + 8)
    s, t = running(b, {"rip": b.addr["drap"] + 2, "rsp": TASK_LO + 0x3000, cpu_name: cfa}, build, version=4)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["drap"] + 2, b.addr["ret_from_fork_asm"] + 8]
    assert frames[1].sp == cfa and stop.clean


@pytest.mark.parametrize("reg,name", [(ORC_REG_R10, "R10"), (ORC_REG_R13, "R13"), (ORC_REG_DI, "RDI"),
                                      (ORC_REG_DX, "DX")])
def test_register_based_cfa_without_regs_is_the_kernels_missing_register_error(reg, name):
    b = kernel()
    b.func("drap", 0x40, (0, call(0, reg)))
    s, t = blocked(b, lambda st, a: st.put(TASK_LO + 0x3000, 0, 0, 0, 0, 0, 0, a["drap"] + 9) and TASK_LO + 0x3000)
    frames, stop = walk(s, t)
    assert len(frames) == 1 and stop.reason is StopReason.MISSING_REGISTER
    assert stop.detail.startswith(f"missing {name} value at ")


def test_bp_indirect_dereferences_after_the_offset():
    b = kernel()
    b.func("realigned", 0x40, (0, call(-8, ORC_REG_BP_INDIRECT, bp_reg=ORC_REG_BP, bp_offset=0)))

    def build(st, a):
        tsp = TASK_LO + 0x3000
        bp = TASK_LO + 0x3100
        st.put(tsp, 0, 0, 0, 0, 0, bp, a["realigned"] + 0x10)
        st.put(bp - 8, TASK_LO + 0x3300)        # *(bp - 8) = the CFA
        st.put(bp, 0x5151)                       # bp:bp+0 -> the saved bp
        st.put(TASK_LO + 0x3300 - 8, a["ret_from_fork_asm"] + 8)
        return tsp
    s, t = blocked(b, build)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["realigned"] + 0x10, b.addr["ret_from_fork_asm"] + 8]
    assert frames[1].sp == TASK_LO + 0x3300 and frames[1].fp == 0x5151 and stop.clean


def test_user_mode_regs_end_the_walk_cleanly():
    b = kernel()
    b.func("entry_SYSCALL_64", 0x80, (0, regs(0)))
    pt = TASK_LO + STACK - 168

    def build(st, a):
        tsp = pt - 56 - 16
        st.put(tsp, 0, 0, 0, 0, 0, 0, a["__schedule"] + 0x50)
        st.put(tsp + 56 + 8, a["entry_SYSCALL_64"] + 0x40)
        put_pt_regs(st, pt, ip=0x7F0000001000, cs=USER_CS, sp=0x7FFF0000, ss=USER_SS, orig_ax=0)
        return tsp
    s, t = blocked(b, build)
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["__schedule"] + 0x50, b.addr["entry_SYSCALL_64"] + 0x40]
    assert stop.reason is StopReason.USER_MODE and stop.clean
    assert frames[-1].extra == {"user_regs": pt}
    assert stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True).ok
    text = [line.text for line in s.backend.format_trace(frames, stop, s.target(t, Options()))]
    assert text[-2].startswith("R13: ") and "RIP: 0033:0x7f0000001000" in text
    assert "RSP: 002b:000000007fff0000 EFLAGS: 00000000 ORIG_RAX: 0000000000000000" in text
    # the batch walk ends it in lockstep where struct pt_regs is known when it starts (here the dump's offsets)
    from unwind.arch.x86_64.structs import PT_REGS_TABLE
    from unwind.session.batch import replay_all

    s, t = blocked(b, build)
    s.dump.info = s.dump.info._replace(offsets={"pt_regs": StructOffsets(PT_REGS_TABLE.size,
                                                                         dict(PT_REGS_TABLE.offsets))})
    batch = replay_all([s], Options(), tasks=[[t]], lockstep=True)[0]
    assert batch.batched(0)
    got = batch[0]
    assert [f.pc for f in got.frames] == [b.addr["__schedule"] + 0x50, b.addr["entry_SYSCALL_64"] + 0x40]
    assert got.stop.reason is StopReason.USER_MODE and got.stop.detail == s.replay(t).stop.detail
    assert got.frames[-1].extra == {"user_regs": pt}


def test_running_task_in_user_mode_has_no_kernel_frames():
    b = kernel()
    s, t = running(b, {"rip": 0x401000, "rsp": 0x7FFF0000, "cs": USER_CS}, lambda st, a: None)
    frames, stop = walk(s, t)
    assert frames == [] and stop.reason is StopReason.USER_MODE


def test_undefined_entry_is_an_error():
    """An UNDEFINED row inside a function that has ORC: the return address is where no frame can be."""
    b = kernel()
    b.func("asm_thing", 0x40, (0, call(8)), (8, UNDEFINED), (0x10, call(8)))
    s, t = blocked(b, lambda st, a: st.put(TASK_LO + 0x3000, 0, 0, 0, 0, 0, 0, a["asm_thing"] + 9)
                   and TASK_LO + 0x3000)
    frames, stop = walk(s, t)
    assert len(frames) == 1 and stop.reason is StopReason.UNKNOWN_METADATA and "UNDEFINED" in stop.detail
    assert not stop.clean


def test_undefined_function_is_where_the_kernels_walk_ends():
    """A function with no ORC at all (objtool's STACK_FRAME_NON_STANDARD): unwind_next_frame() ends there
    with unwind_error() set; a clean, truncated stop, and the reliable walk fails."""
    b = kernel()
    b.func("asm_thing", 0x40, (0, UNDEFINED))
    s, t = blocked(b, lambda st, a: st.put(TASK_LO + 0x3000, 0, 0, 0, 0, 0, 0, a["asm_thing"] + 9)
                   and TASK_LO + 0x3000)
    frames, stop = walk(s, t)
    assert len(frames) == 1 and stop.reason is StopReason.KERNEL_LIMIT and stop.clean and stop.truncated
    assert "asm_thing has no ORC at all" in stop.detail and "STACK_FRAME_NON_STANDARD" in stop.detail
    assert not stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True).ok


def test_orc_missing_pc_falls_back_to_frame_pointers_and_is_unreliable():
    b = kernel()

    def build(st, a):
        tsp = TASK_LO + 0x3000
        bp = TASK_LO + 0x3100
        st.put(tsp, 0, 0, 0, 0, 0, bp, MODULE_PC)                  # in a module with no ORC table
        st.put(bp, TASK_LO + 0x3200, a["kthread"] + 0x30)          # its frame-pointer record
        st.put(bp + 16, a["ret_from_fork_asm"] + 8)                # kthread: call(8)
        return tsp
    # a loaded module the kernel has no ORC for (mod->arch.num_orcs 0): orc_find() finds nothing
    no_orc = {"name": "no_orc", "regions": [{"kind": "text", "base": hex(MODULE_PC & ~0xFFFF), "size": 0x10000}],
              "orc": None}
    s, t = blocked(b, build, modules=[no_orc])
    frames, stop = walk(s, t, record=True)
    assert [f.pc for f in frames] == [MODULE_PC, b.addr["kthread"] + 0x30, b.addr["ret_from_fork_asm"] + 8]
    assert frames[0].reliable and not frames[1].reliable and not frames[2].reliable
    assert frames[1].source is Source.FP_GUESS and "orc_fp_entry" in frames[1].provenance.rule
    assert stop.reason is StopReason.END_OF_STACK
    r = stack_walk_reliable(s.backend.unwinder(s.target(t, Options())), lambda pc: True)
    assert not r.ok and "guessed" in r.reason
    text = [line.text for line in s.backend.format_trace(frames, stop, s.target(t, Options()))]
    assert " ? kthread+0x30/0x100" in text


def test_backwards_sp_on_the_same_stack_is_refused():
    b = kernel()
    b.func("bad", 0x40, (0, OrcEntry(-32, 0, 3, 0, 2, False)))  # sp:sp-32: the CFA goes down
    s, t = blocked(b, lambda st, a: (st.put(TASK_LO + 0x3000, 0, 0, 0, 0, 0, 0, a["bad"] + 4),
                                     st.put(TASK_LO + 0x3000 + 56 - 40, a["kthread"] + 0x30))
                   and TASK_LO + 0x3000)
    frames, stop = walk(s, t)
    assert len(frames) == 1 and stop.reason is StopReason.TRANSITION_REFUSED
    assert "stack going in the wrong direction" in stop.detail


def test_stack_recursion_attempt_is_refused():
    """task -> IRQ -> back to the task stack: the visit mask refuses the task stack a second time."""
    b = kernel()
    b.func("to_irq", 0x40, (0, call(0, ORC_REG_SP_INDIRECT)))
    b.func("irq_fn", 0x40, (0, call(0, ORC_REG_SP_INDIRECT)))
    irq_sp = IRQ_LO + 0x1000
    task_sp = TASK_LO + 0x3000

    def build(st, a):
        st["task"].put(task_sp, irq_sp)
        st["irq"].put(irq_sp - 8, a["irq_fn"] + 4)
        st["irq"].put(irq_sp, TASK_LO + 0x3800)
        st["task"].put(TASK_LO + 0x3800 - 8, a["kthread"] + 0x30)
    s, t = running(b, {"rip": b.addr["to_irq"] + 4, "rsp": task_sp}, build,
                   stacks=(("task", TASK_LO), ("irq", IRQ_LO)))
    frames, stop = walk(s, t)
    assert [f.pc for f in frames] == [b.addr["to_irq"] + 4, b.addr["irq_fn"] + 4]
    assert stop.reason is StopReason.TRANSITION_REFUSED and "stack recursion" in stop.detail


def test_sp_off_every_stack_is_outside_stack():
    b = kernel()
    b.func("wild", 0x40, (0, call(0x7000)))
    s, t = blocked(b, lambda st, a: st.put(TASK_LO + 0x3000, 0, 0, 0, 0, 0, 0, a["wild"] + 4) and TASK_LO + 0x3000)
    frames, stop = walk(s, t)
    assert stop.reason is StopReason.OUTSIDE_STACK and len(frames) == 1


def test_fgraph_and_rethook_recovery():
    b = kernel()

    def build(st, a):
        tsp = TASK_LO + 0x3000
        st.put(tsp, 0, 0, 0, 0, 0, 0, a["__schedule"] + 0x50)
        sp = tsp + 56
        chain(st, sp, [(16, a["return_to_handler"]), (8, a["arch_rethook_trampoline"]),
                       (8, a["ret_from_fork_asm"] + 8)])
        return tsp
    tsp = TASK_LO + 0x3000
    retp1, retp2 = tsp + 56 + 8, tsp + 56 + 16
    b0 = kernel()
    s, t = blocked(b, build, fgraph=[{"ret": b0.addr["schedule"] + 0x10, "retp": retp1, "func": 0}],
                   kretprobes=[{"ret": b0.addr["arch_rethook_trampoline"], "fp": 0},
                               {"ret": b0.addr["kthread"] + 0x30, "fp": retp2}])
    frames, stop = walk(s, t, record=True)
    assert [f.pc for f in frames] == [b.addr["__schedule"] + 0x50, b.addr["schedule"] + 0x10,
                                      b.addr["kthread"] + 0x30, b.addr["ret_from_fork_asm"] + 8]
    assert frames[1].flags & Flag.FGRAPH and frames[2].flags & Flag.KRETPROBE and frames[1].reliable
    assert stop.clean
    # the kernel's printer shows "? return_to_handler" before the fgraph-recovered address, and the
    # rethook trampoline itself (it does not recover rethook); %pB looks up addr-1
    text = [line.text for line in s.backend.format_trace(frames, stop, s.target(t, Options()))]
    assert text[2:7] == [" __schedule+0x50/0x200", " ? ret_from_fork_asm+0x20/0x20", " schedule+0x10/0x40",
                         " return_to_handler+0x20/0x20", " ret_from_fork_asm+0x8/0x20"]


def test_rethook_without_instance_is_a_recovery_failure():
    b = kernel()

    def build(st, a):
        tsp = TASK_LO + 0x3000
        st.put(tsp, 0, 0, 0, 0, 0, 0, a["__schedule"] + 0x50)
        st.put(tsp + 56 + 8, a["arch_rethook_trampoline"])
        return tsp
    s, t = blocked(b, build)
    frames, stop = walk(s, t)
    assert len(frames) == 1 and stop.reason is StopReason.RECOVERY_FAILED


@pytest.mark.parametrize("hijack, lost", [("arch_rethook_trampoline", "kretprobes_lacks"),
                                          ("return_to_handler", "fgraph_lacks")])
def test_a_hijacked_return_whose_entries_the_dump_lacks_stops_on_what_is_missing(hijack, lost):
    b = kernel()

    def build(st, a):
        tsp = TASK_LO + 0x3000
        st.put(tsp, 0, 0, 0, 0, 0, 0, a["__schedule"] + 0x50)
        st.put(tsp + 56 + 8, a[hijack])
        return tsp
    why = "task->list node 0xffff888000123000: memory not in the dump (beyond the end of the file)"
    s, t = blocked(b, build, **{lost: why})
    frames, stop = walk(s, t)
    assert len(frames) == 1 and stop.reason is StopReason.MEMORY_FAULT
    assert stop.detail == f"{hijack} at {TASK_LO + 0x3000 + 56 + 8:#x}: {why}"


def test_bpf_walk_passes_sp_and_bp():
    b = kernel()
    s, t = blocked(b, sleeping)
    seen = []
    bpf_stack_walk(s.backend.unwinder(s.target(t, Options())), lambda ip, sp, bp: seen.append((ip, sp, bp)) or True)
    assert seen[0] == (b.addr["__schedule"] + 0x50, TASK_LO + 0x3000 + 56, 0xB0B0)


def test_unwinder_takes_a_table_directly():
    b = kernel()
    s, t = blocked(b, sleeping)
    from unwind.arch.x86_64.orc import OrcTable
    table = OrcTable.from_entries(b.rows, stext=TEXT, etext=TEXT + 0x100000)
    frames, stop = collect(OrcUnwinder(s.target(t, Options()), table))
    assert [f.pc for f in frames] == pcs(b, EXPECTED) and stop.clean


def test_blocked_trace_text():
    b = kernel()
    s, t = blocked(b, sleeping)
    r = s.replay(t)
    text = [line.text for line in s.backend.format_trace(r.frames, r.stop, r.target)]
    assert text == ["Call Trace:", " <TASK>", " __schedule+0x50/0x200", " schedule+0x10/0x40",
                    " do_nanosleep+0x20/0x80", " kthread+0x30/0x100", " ret_from_fork+0x10/0x40",
                    " ret_from_fork_asm+0x8/0x20", " </TASK>"]


def test_ftrace_trampoline_takes_the_entry_of_the_code_it_copies():
    """orc_ftrace_find(): an ip in an ops trampoline maps to ftrace_caller + offset (from the dump's list)."""
    b = kernel()
    b.func("ftrace_caller", 0x100, (0, call(8)), (0x90, call(24)))
    b.func("traced", 0x40, (0, call(8)))
    tramp = 0xFFFFFFFFC020C000

    def build(st, a):
        tsp = TASK_LO + 0x3000
        st.put(tsp, 0, 0, 0, 0, 0, 0, a["traced"] + 4)
        chain(st, tsp + 56, [(8, tramp + 0x99), (24, a["kthread"] + 0x30), (8, a["ret_from_fork_asm"] + 8)])
        return tsp
    sd = SynthDump("x86_64")
    st = sd.stack("task", TASK_LO, STACK, pid=7)
    sd.blocked_task(7, "worker", {"sp": build(st, b.addr)})
    sd.extra_meta["ftrace_trampolines"] = [{"addr": hex(tramp), "size": 0x150, "save_regs": False}]
    s = session(sd, b.image())
    frames, stop = walk(s, s.select(pid=7)[0], record=True)
    assert [f.pc for f in frames] == [b.addr["traced"] + 4, tramp + 0x99, b.addr["kthread"] + 0x30,
                                      b.addr["ret_from_fork_asm"] + 8]
    assert all(f.reliable for f in frames) and stop.clean
    assert "ftrace trampoline" in " ".join(frames[2].provenance.notes)


def test_inactive_task_frame_from_the_dump_offsets():
    """A made-up inactive_task_frame with bp/ret_addr further in (64 bytes): the dump's offsets say so."""
    b = kernel()

    def build(st, a):
        tsp = TASK_LO + 0x3000
        st.put(tsp, 15, 14, 13, 12, 11, 0, 0xB0B0, a["__schedule"] + 0x50)  # one more word before bp
        chain(st, tsp + 64, [(16, a["schedule"] + 0x10), (8, a["do_nanosleep"] + 0x20), (24, a["kthread"] + 0x30),
                             (8, a["ret_from_fork"] + 0x10), (8, a["ret_from_fork_asm"] + 0x8)])
        return tsp

    s, t = blocked(b, build)
    frames, _ = walk(s, t)
    assert [f.pc for f in frames] != pcs(b, EXPECTED)  # the table's layout reads the wrong words
    s, t = blocked(b, build)  # a Session reads its dump's layouts once: the changed dump gets a new one
    s.dump.info = s.dump.info._replace(offsets={"inactive_task_frame": StructOffsets(64, {"bp": 48, "ret_addr": 56})})
    r = s.replay(t)
    assert [f.pc for f in r.frames] == pcs(b, EXPECTED) and r.stop.clean
    assert r.basis["inactive_task_frame"].startswith("struct inactive_task_frame: 64 bytes, from dump")
    assert r.basis["pt_regs"].endswith("(6.1-7.2 table (168 bytes))") and r.basis["generation"] == "ORC v3"


def _user_syscall_dump(size: int, pad: int):
    """A task blocked in a syscall, no BTF and no offsets: its user pt_regs is ``size`` bytes (the IRET frame
    last, as the CPU pushes it) and ends ``pad`` bytes below the stack top (TOP_OF_KERNEL_STACK_PADDING)."""
    b = kernel()
    b.func("entry_SYSCALL_64", 0x80, (0, regs(0)))
    pt = TASK_LO + STACK - pad - size

    def build(st, a):
        tsp = pt - 56 - 16
        st.put(tsp, 0, 0, 0, 0, 0, 0, a["__schedule"] + 0x50)
        st.put(tsp + 56 + 8, a["entry_SYSCALL_64"] + 0x40)        # the call into the C handler
        st.put(pt + size - 40, 0x7F0000001000, USER_CS, 0x246, 0x7FFF0000, USER_SS)
        st.put(pt + size - 48, 0)                                   # orig_ax
        return tsp
    s, t = blocked(b, build)
    return b, s, t, pt


@pytest.mark.parametrize("size,pad", [(168, 0), (168, 16), (184, 16)])
def test_pt_regs_derived_from_the_user_regs_at_the_stack_top(size, pad):
    """6.12 (no padding), 7.x with CONFIG_X86_FRED (16 bytes of padding) and a made-up 184-byte pt_regs:
    sizeof and the IRET frame's place come from the stack, and the walk ends cleanly at the user regs."""
    b, s, t, pt = _user_syscall_dump(size, pad)
    r = s.replay(t)
    assert [f.pc for f in r.frames] == [b.addr["__schedule"] + 0x50, b.addr["entry_SYSCALL_64"] + 0x40]
    assert r.stop.reason is StopReason.USER_MODE and r.frames[-1].extra == {"user_regs": pt}
    assert r.basis["pt_regs"].startswith(f"struct pt_regs: {size} bytes, from derived (1 of 1 user pt_regs: "
                                         f"UNWIND_HINT_REGS return to a user IRET frame ending at top-{pad} "
                                         f"(TOP_OF_KERNEL_STACK_PADDING {pad})"), r.basis


def test_a_wrong_pt_regs_size_breaks_the_walk_without_the_derivation():
    """The 184-byte pt_regs read with the dump's (wrong) 168-byte offsets misses the user cs: the derived
    layout is what made the test above pass."""
    b, s, t, pt = _user_syscall_dump(184, 16)
    s.dump.info = s.dump.info._replace(offsets={"pt_regs": StructOffsets(168, {
        "r10": 56, "r13": 16, "di": 112, "dx": 96, "ax": 80, "bp": 32, "ip": 128, "cs": 136, "sp": 152})})
    r = s.replay(t)
    assert r.basis["pt_regs"].startswith("struct pt_regs: 168 bytes, from dump")
    assert r.stop.reason is not StopReason.USER_MODE


def test_a_capture_caught_mid_switch_stops_both_tasks_as_the_kernel_does():
    """A capture (the lab's JSON note) of cpu0 between ``__switch_to_asm()`` and ``__switch_to()``: the CPU's sp
    is on the stack of pid 18, whose ``on_cpu`` is set, while its current is still pid 7. The note says only
    ``on_cpu``; reading it pairs the two, and both walks end at once, as for the vmcore (test_mid_switch)."""
    b = kernel()
    sd = SynthDump("x86_64")
    sd.stack("task", TASK_LO, STACK, pid=7)
    nxt = sd.stack("task", TASK_LO + 2 * STACK, STACK, pid=18)
    tsp = TASK_LO + 2 * STACK + 0x3000
    sleeping(nxt, b.addr, tsp)
    sd.blocked_task(18, "rcu_preempt", {"sp": tsp}, on_cpu=True, last_cpu=0)
    sd.running_task(7, "exe", 0, {"cs": KERNEL_CS, "ss": KERNEL_SS, "rip": b.addr["__schedule"] + 0x50,
                                  "rsp": tsp + 56, "rbp": 0xB0B0})
    s = session(sd, b.image(3))
    prev, nxt_task = s.select(pid=7)[0], s.select(pid=18)[0]
    assert prev.extra["switching_to"] == 18 and nxt_task.extra["switching_from"] == 7
    for t in (prev, nxt_task):
        frames, stop = walk(s, t)
        assert frames == [] and stop.reason is StopReason.KERNEL_LIMIT and "switching" in stop.detail, stop
