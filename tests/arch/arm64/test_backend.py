"""The arm64 backend through the core: kernel-style text, adapters, --explain and the CLI."""

from __future__ import annotations

import json

import pytest

from unwind import Options, StopReason, bpf_stack_walk, stack_walk, stack_walk_reliable
from unwind.arch.arm64 import synth as S
from unwind.arch.arm64.ptrauth import genmask_ull, kernel_pac_mask, ptrauth_strip_kernel_insn_pac
from unwind.arch.arm64.synth import RETURN_TO_HANDLER, ret, sign
from unwind.cli.main import main
from unwind.session.output import replay_text


def lines(sc, **opt):
    r = sc.session.replay(sc.task, Options(**opt))
    return [line.text for line in sc.session.backend.format_trace(r.frames, r.stop, r.target)], r


# -- PAC ---------------------------------------------------------------------

@pytest.mark.parametrize("mask", [S.PAC_MASK_52, S.PAC_MASK_48])
def test_strip_rule(mask):
    k = ret(1)
    assert ptrauth_strip_kernel_insn_pac(k, mask) == k  # unsigned: unchanged
    assert ptrauth_strip_kernel_insn_pac(sign(k, 0x1F2E, mask), mask) == k
    user = 0x0000_FFFF_A000_1234
    assert ptrauth_strip_kernel_insn_pac(user | (0x5A << 56) & mask, mask) == user & ~mask  # bit 55 clear
    assert ptrauth_strip_kernel_insn_pac(k, 0) == k


def test_mask_sources():
    assert kernel_pac_mask({"NUMBER(KERNELPACMASK)": "0xfff0000000000000"})[0] == 0xFFF0000000000000
    assert kernel_pac_mask({"NUMBER(KERNELPACMASK)": "0x0", "NUMBER(TCR_EL1_T1SZ)": "0xc"})[0] == 0
    assert kernel_pac_mask({"NUMBER(TCR_EL1_T1SZ)": "0xc"})[0] == genmask_ull(63, 52) == 0xFFF0000000000000
    assert kernel_pac_mask({"NUMBER(TCR_EL1_T1SZ)": "0x10"})[0] == 0xFFFF000000000000
    assert kernel_pac_mask({"NUMBER(VA_BITS)": "48"})[0] == 0xFFFF000000000000
    assert kernel_pac_mask({}) == (0, "no PAC mask in VMCOREINFO: return addresses are used as read")


# -- text ----------------------------------------------------------------------

def test_v6_12_text_has_no_markers():
    out, _ = lines(S.el1_exception("6.12"))
    assert out[0] == "Call trace:"
    assert out[1:] == [" func50+0xc/0x100", " func10+0x40/0x100", " func11+0x40/0x100", " func12+0x40/0x100",
                       " func20+0x8/0x100", " func22+0x40/0x100", " func23+0x40/0x100"]


def test_v6_13_text_has_source_and_recovery_markers():
    out, _ = lines(S.el1_exception("6.13"))
    assert out[1] == " func50+0xc/0x100 (P)" and out[5] == " func20+0x8/0x100 (P)"
    assert out[2] == " func10+0x40/0x100"
    out, _ = lines(S.fgraph_hijack("6.13"))
    assert out[1] == " func1+0x40/0x100 (T)" and out[2] == " func2+0x40/0x100 (F)" and out[4].endswith(" (F)")
    out, _ = lines(S.kretprobe_hijack("6.13"))
    assert out[2].endswith(" (K)")
    out, _ = lines(S.fgraph_hijack("6.12"))
    assert not any("(" in line for line in out)


def test_unknown_symbol_prints_the_address():
    sc = S.deep_chain("6.12", depth=2)
    r = sc.session.replay(sc.task, Options())
    r.frames[1].symbol = None
    r.target.symbols = None
    out = sc.session.backend.format_trace(r.frames, r.stop, r.target)
    assert out[2].text == f" {sc.expected[1]:#x}"


# -- adapters --------------------------------------------------------------------

def unwinder(sc, **opt):
    return sc.session.backend.unwinder(sc.session.target(sc.task, Options(**opt)))


@pytest.mark.parametrize("generation", ["6.12", "6.13"])
def test_plain_adapter(generation):
    sc = S.irq_to_task(generation)
    pcs: list[int] = []
    stop = stack_walk(unwinder(sc), lambda pc: pcs.append(pc) is None)
    assert pcs == sc.expected and stop.reason is StopReason.END_OF_STACK


@pytest.mark.parametrize("generation", ["6.12", "6.13"])
def test_reliable_adapter(generation):
    ok = stack_walk_reliable(unwinder(S.fgraph_hijack(generation)), lambda pc: True)
    assert ok.ok
    bad = stack_walk_reliable(unwinder(S.el1_exception(generation)), lambda pc: True)
    assert not bad.ok and "exception boundary" in bad.reason  # the running CPU's first frame
    a, st = S.Arm64Synth(generation), None
    st = a.task_stack(7, S.TASK_LOW)
    a.chain(st, [S.TASK_LOW + 0x3000], [ret(1)], S.TASK_LOW + 0x3004)
    a.blocked(7, "t", fp=S.TASK_LOW + 0x3000, pc=ret(2), sp=S.TASK_LOW + 0x2FF0)
    s = a.session(S.FUNCS)
    bad = stack_walk_reliable(s.backend.unwinder(s.target(s.select(pid=7)[0], Options())), lambda pc: True)
    assert not bad.ok and "misaligned" in bad.reason


def test_reliable_gives_up_at_the_v6_13_pt_regs_boundary_of_a_blocked_task():
    a = S.Arm64Synth("6.13")
    st = a.task_stack(7, S.TASK_LOW)
    base = S.TASK_LOW + 0x2000
    st.put(S.TASK_LOW + 0x2400, a.final_fp(st), ret(3))
    at = a.pt_regs(st, base, pc=ret(2), x29=S.TASK_LOW + 0x2400, x30=0)
    st.put(S.TASK_LOW + 0x1F00, at, ret(1))
    a.blocked(7, "t", fp=S.TASK_LOW + 0x1F00, pc=ret(0), sp=S.TASK_LOW + 0x1EF0)
    s = a.session(S.FUNCS)
    u = s.backend.unwinder(s.target(s.select(pid=7)[0], Options()))
    seen: list[int] = []
    res = stack_walk_reliable(u, lambda pc: seen.append(pc) is None)
    assert not res.ok and seen == [ret(0), ret(1)] and f"{ret(2):#x}" in res.reason


def test_bpf_adapter_passes_pc_zero_fp():
    sc = S.deep_chain("6.13", depth=3)
    got: list[tuple[int, int, int]] = []
    bpf_stack_walk(unwinder(sc), lambda ip, sp, fp: got.append((ip, sp, fp)) is None)
    ctx_fp = sc.task.context["fp"]
    fps = [ctx_fp + 0x30 * i for i in range(3)]
    assert got[0] == (ret(63), 0, ctx_fp)
    assert got[1:] == [(sc.expected[1], 0, fps[1]), (sc.expected[2], 0, fps[2]),
                       (sc.expected[3], 0, sc.synth.final_fp_of(7))]


@pytest.mark.parametrize("generation", ["6.1", "6.13"])
@pytest.mark.parametrize("build, lost, trampoline", [(S.fgraph_hijack, "fgraph", "return_to_handler"),
                                                     (S.kretprobe_hijack, "kretprobes", "__kretprobe_trampoline")])
def test_a_hijacked_return_whose_entries_the_dump_lacks_stops_on_what_is_missing(generation, build, lost,
                                                                                 trampoline):
    sc = build(generation)
    why = "task->ret_stack 0xffff000004560000: memory not in the dump (beyond the end of the file)"
    task = sc.task.replace(**{lost: [], f"{lost}_lacks": why})
    r = sc.session.replay(task, Options())
    assert [f.pc for f in r.frames] == sc.expected[:1]
    assert r.stop.reason is StopReason.MEMORY_FAULT
    keyed = sc.task.context["fp"] + 0x40  # the caller's record, which the hijacked entry is keyed by
    assert r.stop.detail == f"{trampoline} at fp {keyed:#x}: {why}"


# -- --explain ---------------------------------------------------------------------

def test_explain_shows_raw_and_stripped_lr_record_stack_and_recovery():
    sc = S.fgraph_hijack("6.13")
    r = sc.session.replay(sc.task, Options(record=True))
    text = "\n".join(replay_text(sc.session, r, explain=True))
    raw = sign(RETURN_TO_HANDLER, 0x99)
    fp0 = sc.task.context["fp"]
    assert f"= {raw:#x}  (record.lr (raw))" in text
    assert f"lr raw {raw:#x} -> stripped {RETURN_TO_HANDLER:#x}" in text
    assert f"read {fp0:#x}+8" in text and f"record at {fp0:#x} on the task stack" in text
    assert f"recovered: return_to_handler -> {ret(2):#x} from fgraph ret_stack entry 1" in text
    assert "PAC mask 0xfff0000000000000 from NUMBER(KERNELPACMASK)" in text


def test_explain_shows_stack_transitions_and_pt_regs():
    sc = S.el1_exception("6.13")
    r = sc.session.replay(sc.task, Options(record=True))
    text = "\n".join(replay_text(sc.session, r, explain=True))
    assert "stack transition: irq@cpu0 -> task@cpu0 (one-way)" in text
    assert "FRAME_META_TYPE_PT_REGS" in text and "(pt_regs.pc)" in text and "(pt_regs.regs[29])" in text


def test_no_provenance_unless_recording():
    sc = S.el1_exception("6.13")
    r = sc.session.replay(sc.task, Options())
    assert all(f.provenance is None for f in r.frames)


# -- CLI ---------------------------------------------------------------------------

def test_cli_replay_json_and_text(tmp_path, capsys):
    sc = S.kretprobe_hijack("6.13")
    path = tmp_path / "kr.core"
    path.write_bytes(sc.synth.sd.to_bytes())
    assert main(["replay", str(path), "--all", "--json", "--system-map", str(_system_map(tmp_path))]) == 0
    obj = json.loads(capsys.readouterr().out.splitlines()[0])
    assert [f["pc"] for f in obj["frames"]] == [hex(p) for p in sc.expected]
    assert obj["frames"][1]["flags"] == ["pac-stripped", "kretprobe"]
    assert main(["replay", str(path), "--task", "12", "--explain", "--reliable"]) == 0
    out = capsys.readouterr().out
    assert "Call trace:" in out and "(K)" in out and "-- reliable: yes" in out


def _system_map(tmp_path):
    p = tmp_path / "System.map"
    p.write_text("".join(f"{a:016x} T {n}\n" for a, n in S.FUNCS))
    return p
