"""Where the kernel itself prints little or nothing: the riscv IRQ-stack limit, CPUs in
user mode or firmware, exited tasks. Expected answers come from the kernel's printed traces in the
corpora, the dumps' own registers formatted as the kernel's format strings say, and the kernel
sources cited per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.core.frame import Flag
from unwind.session.replay import load_session
from unwind.core.target import Options
from unwind.core.walk import StopReason

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "corpora/x86_64/6.12.117+deb13-amd64"
ARM64 = ROOT / "corpora/arm64/6.12.117+deb13-arm64"
RISCV = ROOT / "corpora/riscv/6.12.117+deb13-riscv64"


def _kernel_traces_ending_at_call_on_irq_stack():
    for dump in sorted(RISCV.glob("stop-*.bin.xz")):
        s = load_session(dump)
        for o in s.dump.oracles():
            if o.get("source") == "ftrace-stacktrace" and o.get("cpu") is not None:
                last = s.symbols.lookup(int(o["frames"][-1], 0))
                if last is not None and last.name == "call_on_irq_stack":
                    yield dump, o["cpu"]


RISCV_IRQ = list(_kernel_traces_ending_at_call_on_irq_stack())


def test_the_corpus_has_riscv_kernel_traces_cut_at_call_on_irq_stack():
    assert len(RISCV_IRQ) >= 3


@pytest.mark.parametrize("dump,cpu", RISCV_IRQ, ids=[f"{d.name}-cpu{c}" for d, c in RISCV_IRQ])
def test_riscv_kernel_limit_is_clean_but_truncated(dump, cpu, capsys):
    """6.12's own trace (the ftrace oracle) ends at call_on_irq_stack: faithful replay ends there too,
    with exit 0 and a truncated stop; --complete goes on to a clean end past it."""
    assert main(["replay", "--cpu", str(cpu), str(dump)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "call_on_irq_stack+" in out[-2]
    assert out[-1].startswith("-- stop: the kernel's unwinder stops here: ") and out[-1].endswith("(clean, truncated)")
    assert "empty window" in out[-1] and "--complete" in out[-1]
    s = load_session(dump)
    task = s.select(cpu=cpu)[0]
    r = s.replay(task, Options(complete=True))
    assert r.stop.clean and not r.stop.truncated and any(f.flags & Flag.COMPLETE for f in r.frames)


def test_zombie_says_its_stack_is_freed(capsys):
    """pid 6389 is a zombie whose task->stack the capture read as NULL; the kernel's sysrq-t printed
    nothing for it (sched_show_task(): `if (!try_get_task_stack(p)) return;`)."""
    dump = X86 / "stop-015-random.bin.xz"
    s = load_session(dump)
    assert not [o for o in s.dump.oracles() if o.get("pid") == 6389]
    assert main(["replay", "--task", "6389", "--reliable", str(dump)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pid 6389 (dd) blocked:"
    assert out[1].startswith("-- stop: task has exited; its stack is freed: ") and out[1].endswith("(clean)")
    assert out[2].startswith("-- reliable: no: try_get_task_stack()")


def test_arm64_el0_cpu_prints_no_call_trace(capsys):
    """6.12 dump_backtrace(): `if (regs && user_mode(regs)) return;` comes before `Call trace:`."""
    dump = ARM64 / "stop-032-random-drgn.bin.xz"
    s = load_session(dump)
    assert s.dump.cpus[1].mode == "user" and s.dump.cpus[1].regs["pstate"] & 0xF == 0   # EL0t
    assert main(["replay", "--cpu", "1", str(dump)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "Call trace:" not in out and "reached user-mode registers" in out[1]


def test_x86_user_mode_cpu_prints_its_registers_as_show_regs():
    """show_regs() of user regs: __show_regs(SHOW_REGS_USER) and no trace (dumpstack.c, process_64.c);
    the lines are the kernel's format strings applied to the dump's NT_PRSTATUS and MSRs."""
    dump = X86 / "stop-000-random.bin.xz"
    s = load_session(dump)
    r = s.dump.cpus[0].regs
    sysregs = {k: int(v, 0) for k, v in s.dump.meta["cpus"][0]["sysregs"].items()}
    assert r["cs"] & 3 == 3
    want = [f"RIP: {r['cs']:04x}:{r['rip']:#x}",
            f"RSP: {r['ss']:04x}:{r['rsp']:016x} EFLAGS: {r['eflags']:08x}"
            + (f" ORIG_RAX: {r['orig_rax']:016x}" if r["orig_rax"] != 2**64 - 1 else ""),
            f"RAX: {r['rax']:016x} RBX: {r['rbx']:016x} RCX: {r['rcx']:016x}",
            f"RDX: {r['rdx']:016x} RSI: {r['rsi']:016x} RDI: {r['rdi']:016x}",
            f"RBP: {r['rbp']:016x} R08: {r['r8']:016x} R09: {r['r9']:016x}",
            f"R10: {r['r10']:016x} R11: {r['r11']:016x} R12: {r['r12']:016x}",
            f"R13: {r['r13']:016x} R14: {r['r14']:016x} R15: {r['r15']:016x}",
            f"FS:  {sysregs['fs_base']:016x} GS:  {sysregs['gs_base']:016x}"]
    rep = s.replay(s.select(cpu=0)[0])
    lines = [line.text for line in s.backend.format_trace(rep.frames, rep.stop, rep.target)]
    assert lines == want


def test_riscv_cpu_in_firmware_entered_from_the_kernel(capsys):
    """stop-019 cpu0 is at OpenSBI's M-mode trap entry (priv 3) with ra/sp still the kernel's. The kernel
    prints nothing for it; complete mode walks from ra and reaches the user-mode pt_regs of the page
    fault the S-mode trap registers record (scause 0xf, sepc): an answer the capture read independently."""
    dump = RISCV / "stop-019-random.bin.xz"
    assert main(["replay", "--cpu", "0", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "user mode" not in out and "-- stop: the CPU is in firmware: cpu0 at M-mode pc 0x80000408" in out
    assert "entered from the kernel" in out and "(clean)" in out
    s = load_session(dump)
    sysregs = {k: int(v, 0) for k, v in s.dump.meta["cpus"][0]["sysregs"].items()}
    assert sysregs["priv"] == 3 and sysregs["scause"] == 0xF
    r = s.replay(s.select(cpu=0)[0], Options(complete=True))
    assert r.frames[0].pc == s.dump.cpus[0].regs["ra"]
    assert all(f.flags & Flag.COMPLETE for f in r.frames)
    assert r.stop.reason is StopReason.USER_MODE and f"epc {sysregs['sepc']:#x} in user mode" in r.stop.detail
    assert [f.pc for f in r.frames].count(r.frames[0].pc) == 1


def test_riscv_cpu_in_firmware_on_its_own_stack(capsys):
    dump = RISCV / "stop-001-random.bin.xz"
    for extra in ([], ["--complete"]):
        assert main(["replay", "--cpu", "0", *extra, str(dump)]) == 0
        out = capsys.readouterr().out
        assert "firmware's own: no kernel caller in the registers (clean)" in out and "[<" not in out


@pytest.mark.slow
@pytest.mark.parametrize("dump,binary", [
    ("stop-001-random.bin.xz", "/usr/share/qemu/opensbi-riscv64-generic-fw_dynamic.bin"),
    ("stop-031-ftrace-hrtimer_expire_entry.bin.xz", "~/.cache/unwind/kernels/6.12.117+deb13-riscv64/busybox"),
    ("stop-033-ftrace-hrtimer_expire_entry.bin.xz", "~/.cache/unwind/kernels/6.12.117+deb13-riscv64/busybox"),
])
def test_riscv_ra_equal_to_pc_follows_a_call(dump, binary):
    """cpu0's ra == pc in these dumps is the real state, not a capture artefact: the instruction before
    pc (in the firmware QEMU ran, or trixie's static busybox) is a jal that set ra to pc, and the
    callee has just returned. Needs QEMU's OpenSBI and `unwind kernels fetch --arch riscv`."""
    import capstone
    from elftools.elf.elffile import ELFFile

    path = Path(binary).expanduser()
    if not path.exists():
        pytest.skip(f"{path} not here")
    regs = load_session(RISCV / dump).dump.cpus[0].regs
    pc = regs["pc"]
    assert regs["ra"] == pc
    if path.suffix == ".bin":
        base, data = 0x80000000, path.read_bytes()
    else:
        seg = next(s for s in ELFFile(path.open("rb")).iter_segments()
                   if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1)
        base, data = seg["p_vaddr"], seg.data()
    md = capstone.Cs(capstone.CS_ARCH_RISCV, capstone.CS_MODE_RISCV64 | capstone.CS_MODE_RISCVC)
    before = [i for n in (2, 4) for i in md.disasm(data[pc - n - base:pc - base], pc - n)
              if i.address + i.size == pc]
    assert any(i.mnemonic in ("jal", "c.jal", "jalr", "c.jalr") for i in before)
