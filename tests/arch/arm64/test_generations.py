"""arm64 per kernel generation: the walk followed, the pt_regs layout read and where it came from.

Each dump is built the way that generation's kernel lays out its stacks
(``asm/ptrace.h`` of the 6.1, 6.12 and 7.2 trees, entry.S's meta records), so
every expected trace is known by construction.
"""

from __future__ import annotations

import pytest

from tests.btfbuild import BtfBuilder
from unwind import Options, StopReason
from unwind.core.dumpinfo import StructOffsets
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from unwind.arch.arm64 import synth as S
from unwind.arch.arm64.structs import PtRegsLayout
from unwind.arch.arm64.synth import (KRETPROBE_TRAMPOLINE, RETURN_TO_HANDLER, TASK_LOW, Arm64Synth, fn, ret,
                                     sign)
from unwind.kernel.btf import Btf
from unwind.core.frame import Flag, Source
from unwind.session.replay import Session
from unwind.kernel.symbols import SymbolTable
from unwind.core.walk import collect

ALL = ["6.1", "6.12", "6.13", "6.17", "6.18", "7.2"]


def walk(sc, **opt):
    u = sc.session.backend.unwinder(sc.session.target(sc.task, Options(**opt)))
    frames, stop = collect(u)
    return u, frames, stop


@pytest.mark.parametrize("generation", ALL)
@pytest.mark.parametrize("release", [True, False], ids=["release", "no-release"])
@pytest.mark.parametrize("name", sorted(S.CLEAN_SCENARIOS))
def test_clean_scenarios_every_generation(name, generation, release):
    """With the release, or with none (the generation and the layout then come from the stacks)."""
    sc = S.CLEAN_SCENARIOS[name](generation)
    if not release:
        sc.session.dump.info = sc.session.dump.info._replace(release=None)
        dump = sc.session.dump
        dump.vmcoreinfo = VmcoreInfo({k: v for k, v in dump.vmcoreinfo.items() if k != "OSRELEASE"})
    u, frames, stop = walk(sc)
    assert [f.pc for f in frames] == sc.expected
    assert stop.reason is sc.stop and stop.clean


@pytest.mark.parametrize("generation", ["6.13", "6.18", "7.2"])
def test_no_btf_no_offsets_no_release_derives_pt_regs_and_crosses_pt_regs(generation):
    """The acceptance case: a 7.x dump with nothing but its stacks ends cleanly across its PT_REGS record."""
    sc = S.preempted_in_irq(generation, release=False)
    assert sc.session.image is None and sc.session.dump.info.offsets is None and not sc.session.dump.release
    u, frames, stop = walk(sc)
    assert [f.pc for f in frames] == sc.expected and stop.reason is StopReason.END_OF_STACK and stop.clean
    boundary = frames[sc.notes["boundary_index"]]
    assert boundary.source is Source.REGS_PC and boundary.flags & Flag.BOUNDARY
    want = {"6.13": 336, "6.18": 320, "7.2": 320}[generation]
    assert u.state.layout.size == want and u.state.layout.source.startswith("derived")
    assert u.generation.meta_records and "FRAME_META_TYPE_FINAL" in u.generation.why


def test_the_wrong_pt_regs_size_is_what_refuses_the_boundary():
    """The same 7.2 stacks read with 6.13's 336-byte pt_regs (given as the dump's offsets) stop at the record."""
    sc = S.preempted_in_irq("7.2")
    sc.session.dump.info = sc.session.dump.info._replace(offsets={"pt_regs": StructOffsets(
        336, {"regs": 0, "pc": 256, "pstate": 264, "stackframe": 296})})
    u, frames, stop = walk(sc)
    assert stop.reason is StopReason.TRANSITION_REFUSED and len(frames) == sc.notes["boundary_index"] + 1
    assert u.state.layout.source.startswith("dump")


def test_7x_with_its_release_and_no_btf_uses_the_derived_size():
    sc = S.preempted_in_irq("7.2")
    u, frames, stop = walk(sc)
    assert stop.clean and u.state.layout.size == 320 and u.basis()["generation"] == "v6.13+"


def _arm64_btf(*, stackframe_at: int, size: int, meta: bool) -> Btf:
    """``struct pt_regs`` as BTF, written from asm/ptrace.h (offsets by hand, not from the table)."""
    b = BtfBuilder()
    u64, s32, u32 = b.int("u64", 8), b.int("s32", 4), b.int("u32", 4)
    regs = b.array(u64, 31)
    user = b.struct("", 272, [("regs", regs, 0), ("sp", u64, 248), ("pc", u64, 256), ("pstate", u64, 264)])
    anon = b.struct("", 272, [("user_regs", user, 0), ("", user, 0)], kind="union")
    if meta:
        rec = b.struct("frame_record", 16, [("fp", u64, 0), ("lr", u64, 8)])
        sf = b.struct("frame_record_meta", 24, [("record", rec, 0), ("type", u64, 16)])
    else:
        sf = b.array(u64, 2)
    b.struct("pt_regs", size, [("", anon, 0), ("orig_x0", u64, 272), ("syscallno", s32, 280), ("pmr", u32, 284),
                               ("sdei_ttbr1", u64, 288), ("stackframe", sf, stackframe_at)])
    return Btf(b.blob())


class _BtfImage:
    machine = "EM_AARCH64"
    has_text = False

    def __init__(self, btf: Btf) -> None:
        self.btf = btf

    def text(self, addr: int, size: int) -> None:
        return None


def test_btf_gives_the_layout_and_the_generation():
    """A kernel whose pt_regs moved stackframe (304, 344 bytes): only BTF knows; it also says meta records,
    though the release says 6.12."""
    a = Arm64Synth("7.2")
    a.layout = PtRegsLayout(size=344, regs=0, pc=256, pstate=264, stackframe=304, source="test")
    a.sd.release = "6.12.99-backported"
    a.sd.vmcoreinfo["OSRELEASE"] = a.sd.release
    st = a.task_stack(21, TASK_LOW)
    regs_base = TASK_LOW + 0x3000
    caller = regs_base + 344
    st.put(caller, a.final_fp(st), ret(31))
    frame_at = a.pt_regs(st, regs_base, pc=fn(30) + 8, x29=caller, x30=ret(31))
    st.put(regs_base - 0x40, frame_at, ret(1))
    a.blocked(21, "t", fp=regs_base - 0x40, pc=ret(0), sp=regs_base - 0x60)
    table = SymbolTable([(f, "T", n) for f, n in S.FUNCS] + [(RETURN_TO_HANDLER, "T", "return_to_handler"),
                                                             (S.TEXT + 0x100000, "T", "_etext")])
    s = Session(a.dump(), _BtfImage(_arm64_btf(stackframe_at=304, size=344, meta=True)), table)  # type: ignore[arg-type]
    r = s.replay(s.select(pid=21)[0], Options(record=True))
    assert [f.pc for f in r.frames] == [ret(0), ret(1), fn(30) + 8, ret(31)] and r.stop.clean
    assert r.basis["pt_regs"].startswith("struct pt_regs: 344 bytes, stackframe at 304, from btf")
    assert r.basis["generation"] == "v6.13+" and "frame_record_meta" in r.basis["generation_why"]
    assert "(P)" in "\n".join(line.text for line in s.backend.format_trace(r.frames, r.stop, r.target))


def test_btf_of_a_6_12_kernel_says_no_meta_records():
    sc = S.deep_chain("6.12", depth=3)
    s = Session(sc.session.dump, _BtfImage(_arm64_btf(stackframe_at=304, size=336, meta=False)),
                sc.session.symbols)  # type: ignore[arg-type]
    r = s.replay(sc.task)
    assert [f.pc for f in r.frames] == sc.expected and r.stop.clean
    assert r.basis["generation"] == "v6.8-v6.12" and "u64[2]" in r.basis["generation_why"]


def test_v6_1_hands_the_first_pc_over_unrecovered():
    """v6.1 unwind() consumes the first pc before any recovery; from v6.4 unwind() (v6.8+ do_kunwind())
    recovers it first."""
    for gen, first in (("6.1", RETURN_TO_HANDLER), ("6.5", ret(9)), ("6.12", ret(9))):
        a = Arm64Synth(gen)
        st = a.task_stack(7, TASK_LOW)
        fp = TASK_LOW + 0x3000
        st.put(fp, a.final_fp(st), ret(1))
        a.blocked(7, "t", fp=fp, pc=RETURN_TO_HANDLER, sp=fp - 0x10,
                  fgraph=[{"ret": ret(9), "retp": fp, "func": fn(8)}])
        sc = S._scenario(a, [], StopReason.END_OF_STACK, pid=7)
        _, frames, stop = walk(sc)
        assert [f.pc for f in frames] == [first, ret(1)] and stop.clean, gen


def test_v6_1_kretprobe_miss_goes_on_with_pc_0():
    """v6.1-v6.7 set pc to kretprobe_find_ret_addr()'s 0 and walk on; v6.8+ (kunwind) stop with -EINVAL."""
    for gen in ("6.1", "6.5", "6.12"):
        a = Arm64Synth(gen)
        st = a.task_stack(7, TASK_LOW)
        fps = [TASK_LOW + 0x3000, TASK_LOW + 0x3040]
        a.chain(st, fps, [sign(KRETPROBE_TRAMPOLINE, 3), ret(2)], a.final_fp(st))
        a.blocked(7, "t", fp=fps[0], pc=ret(0), sp=fps[0] - 0x10, kretprobes=[])
        sc = S._scenario(a, [], StopReason.END_OF_STACK, pid=7)
        _, frames, stop = walk(sc)
        if gen != "6.12":
            assert [f.pc for f in frames] == [ret(0), 0, ret(2)] and stop.clean, gen
        else:
            assert [f.pc for f in frames] == [ret(0)] and stop.reason is StopReason.RECOVERY_FAILED


def test_v6_1_fgraph_search_starts_at_the_bottom():
    """Two entries with the same retp: v6.1 takes the bottom one, v6.11+ the top one (skipping none here)."""
    got = {}
    for gen in ("6.1", "6.5", "6.12"):
        a = Arm64Synth(gen)
        st = a.task_stack(7, TASK_LOW)
        fp = TASK_LOW + 0x3000
        st.put(fp, a.final_fp(st), RETURN_TO_HANDLER)
        a.blocked(7, "t", fp=fp, pc=ret(0), sp=fp - 0x10,
                  fgraph=[{"ret": ret(4), "retp": a.final_fp(st), "func": fn(4)},
                          {"ret": ret(5), "retp": a.final_fp(st), "func": fn(5)}])
        _, frames, stop = walk(S._scenario(a, [], StopReason.END_OF_STACK, pid=7))
        got[gen] = [f.pc for f in frames]
    assert got == {"6.1": [ret(0), ret(4)], "6.5": [ret(0), ret(4)], "6.12": [ret(0), ret(5)]}


@pytest.mark.parametrize("release,name", [("6.1", "v6.1-v6.3"), ("6.3", "v6.1-v6.3"), ("6.4", "v6.4-v6.7"),
                                          ("6.7", "v6.4-v6.7"), ("6.8", "v6.8-v6.12"), ("6.13", "v6.13+")])
def test_generation_names_follow_the_boundaries(release, name):
    """v6.4 (first pc recovered, insn PAC strip), v6.8 (kunwind) and v6.13 (meta records)."""
    sc = S.deep_chain(release, depth=2)
    r = sc.session.replay(sc.task)
    assert r.basis["generation"] == name and r.stop.clean


def test_v6_4_strips_a_user_pointer_with_the_whole_mask():
    """A bit-55-clear lr: v6.1-v6.3 clear only GENMASK(54, vabits) of the mask, v6.4+ all of it."""
    from unwind.arch.arm64.ptrauth import ptrauth_clear_pac, ptrauth_strip_kernel_insn_pac

    got = {}
    for gen in ("6.1", "6.5"):
        a = Arm64Synth(gen)
        st = a.task_stack(7, TASK_LOW)
        fps = [TASK_LOW + 0x3000, TASK_LOW + 0x3040]
        lr = (1 << 60) | 0x1234
        a.chain(st, fps, [lr, ret(2)], a.final_fp(st))
        a.blocked(7, "t", fp=fps[0], pc=ret(0), sp=fps[0] - 0x10)
        _, frames, _ = walk(S._scenario(a, [], StopReason.END_OF_STACK, pid=7))
        got[gen] = frames[1].pc
        mask = int(a.sd.vmcoreinfo["NUMBER(KERNELPACMASK)"], 16)
    assert got == {"6.1": ptrauth_clear_pac(lr, mask), "6.5": ptrauth_strip_kernel_insn_pac(lr, mask)}
    assert got["6.1"] != got["6.5"]
