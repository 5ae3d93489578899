"""The fuzzer (unwind fuzz): a seeded campaign over every family, its checks, and the kept
regression cases (the crash groups mutation campaigns found, and any case a campaign ever failed)."""

from __future__ import annotations

import argparse
import json
import lzma
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unwind.dev.fuzz import checks
from unwind.dev.fuzz.cases import CASE_CPU_LIMIT, FAMILIES, Fuzzer
from unwind.dev.fuzz.checks import OutOfDump, Outcome, _bad_value, instrument, one_line, query_btf, read_vmcore
from unwind.dev.fuzz.mutators import apply_edits, mutate_vmmem, near_miss_hex
from unwind.dev.fuzz.runner import fuzzer_of, run_cases
from unwind.dev.fuzz.seeds import BtfSeed, ReadWord, VmmemSeed, edited_dump, load_seeds, load_vmmem_seeds
from unwind.kernel.btf import Btf, BtfError
from unwind.core.memory import Memory, Segment
from unwind.session.result import Replay

from ..btfbuild import BtfBuilder
from .vmcore_seeds import write as write_vmcore_seeds

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "corpora"
REGRESSIONS = Path(__file__).with_name("regressions")
#: the default suite's campaign: every family, a few thousand cases in well under a minute
CASES = 2000


def _with_frames(r: Replay, frames: list) -> Replay:
    """``r`` with other frames (a replay made to differ)."""
    return Replay(r.target, frames, r.stop, r.reliable, r.basis)


def _btf_blob() -> bytes:
    b = BtfBuilder()
    u64 = b.int("unsigned long", 8)
    regs = b.struct("pt_regs", 24, [("sp", u64, 0), ("pc", u64, 8), ("pstate", u64, 16)])
    thread = b.struct("thread_struct", 32, [("s", b.array(u64, 4), 0)])
    b.struct("task_struct", 64, [("stack", b.ptr(regs), 0), ("pid", b.int("int", 4), 8), ("thread", thread, 16)])
    return b.blob()


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory) -> Fuzzer:
    vm = write_vmcore_seeds(tmp_path_factory.mktemp("vmcores"))
    f = Fuzzer(load_seeds(CORPUS), vmcore_seeds=[(p.name, p.read_bytes()) for p in vm],
               scratch=tmp_path_factory.mktemp("scratch"), btf_blobs=[_btf_blob()],
               vmmem_seeds=load_vmmem_seeds(CORPUS))
    f.keep = tmp_path_factory.mktemp("kept")
    return f


#: image cases in it (one costs ~50 dump cases: the long runs give them cases.IMAGE_SHARE)
IMAGE_SHARE = 0.005


def test_a_seeded_campaign_breaks_no_promise(fuzzer, monkeypatch):
    monkeypatch.setattr(fuzzer, "image_share", IMAGE_SHARE)
    summary = run_cases(fuzzer, 0, range(CASES))
    assert summary.failures == 0, "\n".join(f"{k}\n{v}" for k, v in summary.examples.items())
    for fam in FAMILIES[:-3]:  # every family ran, and the mutations reached the input checks
        assert sum(summary.counts[fam].values()) >= CASES // len(FAMILIES) // 3, fam
    assert sum(summary.counts["vmmem"].values()) == 10  # cases.VMMEM_SHARE of campaign 0's 2000 cases
    assert sum(summary.counts["container"].values()) >= 10  # about cases.CONTAINER_SHARE of them
    for fam in ("json", "elf", "btf", "vmcore", "image", "container"):
        assert summary.counts[fam]["rejected"] > 0, fam
    for fam in ("stack", "regs", "image", "vmmem"):  # a mutated image is also opened and replayed with
        assert summary.counts[fam]["ok"] > 0, fam


def test_a_case_is_reproducible(fuzzer):
    first = [(fuzzer.case(i, 7), fuzzer.last) for i in range(20)]
    again = [(fuzzer.case(i, 7), fuzzer.last) for i in range(20)]
    assert first == again
    for fam in ("vmmem", "container"):
        two = [(fuzzer.case(i, 7, fam), fuzzer.last) for i in range(2)] * 2
        assert [(fuzzer.case(i, 7, fam), fuzzer.last) for i in (0, 1, 0, 1)] == two


def test_vmmem_mutates_the_words_a_clean_load_read(fuzzer):
    """The recorded words are what the reader read: task_structs (their pids among them), the
    page tables (no virtual address), stacks (bulk); each edit is one of them, or a segment word."""
    seed = next(s for s in fuzzer.vmmem_seeds if s.name.endswith("amd64/vmcore/kdump-000")).recorded(fuzzer.scratch)
    assert len(seed.words) > 500 and len(seed.bulk) > 60 and 0xFFFF888000000000 in seed.deltas
    assert any(w.vaddr is None and w.width == 8 for w in seed.words)  # page-table entries
    read = {w.offset for w in seed.words}
    edits = [e for i in range(50) for e in mutate_vmmem(random.Random(i), seed)]
    assert sum(off in read for off, _, _ in edits) > len(edits) // 2
    assert all(any(o <= off < o + e - s for s, e, o in seed.extents) for off, _, _ in edits)


def test_container_damages_xz_and_gzip_files(fuzzer):
    """The container family's files are xz and gzip dumps; most are refused in one line by their
    decompression, and some (junk after an intact stream) open and are replayed."""
    outs, magics = [], set()
    for i in range(60):
        outs.append(fuzzer.case(i, 11, "container"))
        magics.add(bytes(fuzzer.last[:2]))
    assert {b"\xfd7", b"\x1f\x8b"} <= magics
    assert {o.kind for o in outs} == {"ok", "rejected"}
    assert any("corrupt compressed dump" in o.detail for o in outs)


def test_some_vmcore_cases_are_xz_files(fuzzer):
    """A share of the vmcore family's files (cases.VMCORE_XZ_SHARE) are xz-compressed as a whole, half of them
    with the xz stream damaged: read through the xz source, some open and some are refused in one line."""
    kinds: dict[str, int] = {}
    for i in range(150):
        out = fuzzer.case(i, 13, "vmcore")
        if fuzzer.last[:6] == lzma.compress(b"")[:6]:
            kinds[out.kind] = kinds.get(out.kind, 0) + 1
    assert set(kinds) == {"ok", "rejected"} and sum(kinds.values()) >= 10, kinds


# --- the checks themselves fire -------------------------------------------------------------------

def test_a_read_past_a_segment_is_caught():
    mem = instrument(Memory([Segment(0x1000, bytes(16))]))
    data = mem.segments[0].data
    assert data[8:16] == bytes(8)
    for bad in (lambda: data[8:24], lambda: data[16], lambda: data[-1:]):
        with pytest.raises(OutOfDump):
            bad()


def test_exceptions_hangs_and_bad_values_are_outcomes(fuzzer):
    assert fuzzer.guarded("x", "t", lambda: {}["k"]).kind == "traceback"
    slow = Fuzzer([], cpu_limit=0.2)

    def spin() -> Outcome:
        while True:
            pass
    assert slow.guarded("x", "t", spin).kind == "hang"
    from unwind.core.frame import Frame, Source
    assert _bad_value([Frame(-1, None, None, Source.REGS_PC, None)]) is not None
    assert _bad_value([Frame(2**64, 0, 0, Source.REGS_PC, None)]) is not None
    assert _bad_value([Frame(2**64 - 1, 0, 0, Source.REGS_PC, None)]) is None


def test_a_walk_over_its_frame_limit_is_a_runaway(fuzzer, monkeypatch):
    seed = next(s for s in fuzzer.seeds if s.arch == "arm64")
    monkeypatch.setattr(checks, "frame_limit", lambda *a: 0)
    out = fuzzer.check(seed.writer().to_bytes(), seed.name, seed.image_path, "stack")
    assert out.kind == "runaway"


def test_a_batch_replay_unlike_the_task_replay_is_caught(fuzzer, monkeypatch):
    """``replay --all`` walks in one batch (``Session.replay_all``): a batch that lost a frame differs."""
    from unwind.session.replay import Session

    seed = next(s for s in fuzzer.seeds if s.arch == "arm64")
    real = Session.replay_all

    def lossy(self, *a, **kw):
        return [_with_frames(r, r.frames[:-1]) for r in real(self, *a, **kw)]
    assert fuzzer.check(seed.writer().to_bytes(), seed.name, seed.image_path, "stack").kind == "ok"
    monkeypatch.setattr(Session, "replay_all", lossy)
    out = fuzzer.check(seed.writer().to_bytes(), seed.name, seed.image_path, "stack")
    assert out.kind == "batch-differs", out


@pytest.fixture(scope="module")
def vmseed(fuzzer) -> VmmemSeed:
    """The smallest vmcore slice (the x86-64 kdump), recorded."""
    return next(s for s in fuzzer.vmmem_seeds if s.name.endswith("amd64/vmcore/kdump-000")).recorded(fuzzer.scratch)


def _vmcase(fuzzer: Fuzzer, seed: VmmemSeed, limit: float | None = None) -> Outcome:
    return fuzzer.guarded("vmmem", "t", lambda: fuzzer.check_vmcore(seed.raw, seed), limit or fuzzer.vmmem_cpu_limit)


def test_vmmem_checks_fire(fuzzer, vmseed, monkeypatch):
    """A clean vmcore is ok; each check fires on a load or replay made to break it."""
    from unwind.core.frame import Frame, Source
    from unwind.kernel.model import Kernel
    from unwind.session.replay import Session

    assert _vmcase(fuzzer, vmseed).kind == "ok"
    with monkeypatch.context() as m:  # a walk that spins for 5 s of CPU, far past the bound, before it walks
        def spin(self, *a, **kw):
            end = time.process_time() + 5
            while time.process_time() < end:
                pass
            return replay_all(self, *a, **kw)
        replay_all = Session.replay_all
        m.setattr(Session, "replay_all", spin)
        assert _vmcase(fuzzer, vmseed, 0.05).kind == "hang"
    with monkeypatch.context() as m:
        m.setattr(checks, "frame_limit", lambda *a: 0)
        assert _vmcase(fuzzer, vmseed).kind == "runaway"
    with monkeypatch.context() as m:
        real = Session.replay_all
        m.setattr(Session, "replay_all", lambda self, *a, **kw: [
            _with_frames(r, r.frames[:-1]) for r in real(self, *a, **kw)])
        assert _vmcase(fuzzer, vmseed).kind == "batch-differs"
    with monkeypatch.context() as m:
        replay = Session.replay
        m.setattr(Session, "replay", lambda self, *a, **kw: _with_frames(
            replay(self, *a, **kw), [Frame(2**64, 0, 0, Source.REGS_PC, None)]))
        assert _vmcase(fuzzer, vmseed).kind == "bad-value"
    with monkeypatch.context() as m:
        m.setattr(Kernel, "modules", lambda self: {}["a KeyError"])
        assert _vmcase(fuzzer, vmseed).kind == "traceback"
    with monkeypatch.context() as m:  # a walk that reads 8 bytes past the end of its task's stack
        def overrun(self, task, *a, **kw):
            seg = self.dump.task_memory(task).segments[0]
            return seg.data[len(seg.data) - 8:len(seg.data) + 8]
        m.setattr(Session, "replay", overrun)
        assert _vmcase(fuzzer, vmseed).kind == "out-of-dump"


def test_a_failing_case_is_kept(fuzzer, tmp_path):
    fuzzer.keep, kept = tmp_path, fuzzer.keep
    try:
        fuzzer.last = b"bytes of the case"
        path = fuzzer.keep_case(Outcome("json", "traceback", "KeyError: 'ret'"), fuzzer.seeds[0], "json-1-2")
    finally:
        fuzzer.keep = kept
    assert lzma.decompress(path.read_bytes()) == b"bytes of the case"
    assert "KeyError" in path.with_suffix("").with_suffix(".txt").read_text()


# --- regression cases -----------------------------------------------------------------------------

EDITS = json.loads((REGRESSIONS / "edits.json").read_text())["cases"]


@pytest.mark.parametrize("case", EDITS, ids=[c["group"] for c in EDITS])
def test_issue_13_groups_on_real_seeds(fuzzer, case):
    # the cases were recorded on the trixie 6.12 seeds; the 6.1/7.2 samples have stops of the same names
    seed = next(s for s in fuzzer.seeds if s.name.endswith(case["seed"]) and s.name.startswith("6.12."))
    out = fuzzer.check(edited_dump(seed, case), seed.name, seed.image_path, "regression")
    if case["expect"] == "ok":
        assert out.kind == "ok", out
    else:
        assert out.kind == "rejected" and case["expect"].removeprefix("rejected:").strip() in out.detail, out


CAMPAIGN = json.loads((REGRESSIONS / "campaign.json").read_text())["cases"]


@pytest.mark.parametrize("case", CAMPAIGN, ids=[c["case"] for c in CAMPAIGN])
def test_campaign_cases_stay_fixed(fuzzer, case):
    """A failed case whose input is not kept as a file, replayed by its number on its seed."""
    campaign, index = map(int, case["case"].split(":"))
    out = fuzzer.case(index, campaign, seed_name=case["seed"])
    assert out.family == case["family"] and out.kind in ("ok", "rejected"), out


KEPT = sorted(REGRESSIONS.glob("*.bin.xz"))


def _kept_info(path: Path) -> dict[str, str]:
    """The family and seed a kept case's ``.txt`` names."""
    return dict(line.split(": ", 1) for line in path.with_suffix("").with_suffix(".txt").read_text().splitlines()
                if ": " in line and line.split(": ", 1)[0] in ("family", "seed"))


def test_a_failing_case_is_saved_where_the_suite_replays_it(fuzzer, tmp_path, monkeypatch):
    """``unwind fuzz --save-regressions DIR``: a failing case's input is written into DIR as the kept-case test
    below reads it; a case with no input file is added to DIR's campaign.json, once, as the campaign-case test
    reads it; passing cases write nothing."""
    monkeypatch.setattr(fuzzer, "regressions", tmp_path)
    monkeypatch.setattr(fuzzer, "keep", None)

    def run(data: bytes | None):
        def case(rng, seed, fam):
            fuzzer.last = data or b""
            if data is None or data.startswith(b"bad"):
                raise RuntimeError("a bug in the reader")
            return Outcome(fam, "ok", "", 0)
        monkeypatch.setattr(fuzzer, "_run", case)

    run(b"good input")
    assert fuzzer.case(2, 7, family="stack").kind == "ok"
    assert list(tmp_path.iterdir()) == []
    run(b"bad input")
    assert fuzzer.case(3, 7, family="stack").kind == "traceback"
    kept = tmp_path / "stack-7-3.bin.xz"
    assert lzma.decompress(kept.read_bytes()) == b"bad input"
    info = _kept_info(kept)
    assert info["family"] == "stack" and any(s.name == info["seed"] for s in fuzzer.seeds), info
    run(None)
    for _ in range(2):
        assert fuzzer.case(4, 7, family="json").kind == "traceback"
    book = json.loads((tmp_path / "campaign.json").read_text())
    assert [(c["case"], c["family"]) for c in book["cases"]] == [("7:4", "json")]
    assert any(s.name == book["cases"][0]["seed"] for s in fuzzer.seeds)
    assert "RuntimeError" in book["cases"][0]["found"]
    assert book["about"] == json.loads((REGRESSIONS / "campaign.json").read_text())["about"]


@pytest.mark.parametrize("path", KEPT, ids=[p.name for p in KEPT])
def test_kept_cases_stay_fixed(fuzzer, path):
    """Every case a campaign failed (``unwind fuzz --keep``), replayed as it was written."""
    info = _kept_info(path)
    data = lzma.decompress(path.read_bytes())
    if info["family"] == "vmmem":  # the edits of a vmcore slice (its 10 MB are not kept)
        vmseed = next(s for s in fuzzer.vmmem_seeds if s.name == info["seed"])
        edits = [tuple(e) for e in json.loads(data)["edits"]]
        out = fuzzer.guarded("vmmem", path.name, lambda: fuzzer.check_vmcore(apply_edits(vmseed.raw, edits), vmseed),
                             fuzzer.vmmem_cpu_limit)
        assert out.kind in ("ok", "rejected"), out
        return
    seed = next(s for s in fuzzer.seeds if s.name == info["seed"])
    if info["family"] == "btf":
        out = fuzzer.guarded("btf", path.name, lambda: _btf(data))
    elif info["family"] == "vmcore":
        out = fuzzer.guarded("vmcore", path.name, lambda: _vmcore(fuzzer, data))
    elif info["family"] == "container":  # the compressed file as the campaign wrote it
        out = fuzzer.guarded("container", path.name, lambda: fuzzer.check_container(data, seed))
    else:
        out = fuzzer.guarded(info["family"], path.name, lambda: fuzzer.check(data, seed.name, seed.image_path))
    assert out.kind in ("ok", "rejected"), out


def _btf(data: bytes) -> Outcome:
    try:
        btf = Btf(data)
    except BtfError as e:
        return one_line("btf", e)
    query_btf(random.Random(0), btf, BtfSeed(data, ["task_struct", "pt_regs"], ["frame_type"]))
    return Outcome("btf", "ok")


def _vmcore(fuzzer: Fuzzer, data: bytes) -> Outcome:
    path = fuzzer.scratch / "kept-vmcore"
    path.write_bytes(data)
    error = read_vmcore(path)
    return Outcome("vmcore", "ok") if error is None else one_line("vmcore", error)


@pytest.mark.parametrize("value", ["0x", "0xzz", "0x1f"])
def test_a_near_miss_of_a_broken_hex_string_is_made(value):
    # found by the long campaign (seed 2026, case 22724): an earlier mutation had left "0x" and the
    # mutator itself raised int("0x", 16)
    for n in range(64):
        got = near_miss_hex(random.Random(n), value)
        assert got != value or value.upper() == value
        if isinstance(got, int):
            assert got == (int(value[2:], 16) if value == "0x1f" else -1)


def test_start_runs_the_campaign_from_a_case_index(tmp_path):
    """``--start N --cases K`` runs cases N..N+K-1 of the campaign, as the in-process fuzzer does."""
    report = tmp_path / "report.md"
    run = subprocess.run([sys.executable, "-m", "unwind.cli.main", "fuzz", "--corpus", str(CORPUS), "--cases", "3",
                          "--start", "40", "--chunk", "2", "--seed", "5", "--report", str(report)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    text = report.read_text()
    assert "cases: 3 of 3 (cases 40 to 42 of campaign 5)," in text
    fuzzer = fuzzer_of(argparse.Namespace(btf=None, vmcore_seeds=None, corpus=str(CORPUS), cpu_limit=CASE_CPU_LIMIT,
                                           keep=None))
    assert run_cases(fuzzer, 5, range(40, 43)).table() in text
    bad = subprocess.run([sys.executable, "-m", "unwind.cli.main", "fuzz", "--corpus", str(CORPUS), "--start", "-1"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "-1 is not a case index" in bad.stderr


# --- vmmem cases, as edits of a committed vmcore slice ---------------------------------------------

def _task_word(session, seed: VmmemSeed, pid: int, member: str) -> ReadWord:
    """The recorded word of ``task_struct.member`` of task ``pid`` in the clean load of ``seed``."""
    k = session.dump.kernel
    task = next(t for t in session.dump.kernel_tasks() if t.pid == pid)
    addr = task.addr + k.btf.member("task_struct", member).offset
    return next(w for w in seed.words if w.vaddr == addr)


@pytest.fixture(scope="module")
def clean_kdump(vmseed, tmp_path_factory):
    from unwind.session.replay import Session

    path = tmp_path_factory.mktemp("vmmem") / "kdump-000.elf"
    path.write_bytes(vmseed.raw)
    return Session.load(path, vmlinux=vmseed.image_path)


def test_vmmem_a_pid_past_pid_max_limit_is_no_task(fuzzer, vmseed, clean_kdump, tmp_path):
    # found by the vmmem family (campaign 1, case 4): convert wrote the pid into a note whose schema
    # refuses it (a pydantic ValidationError)
    from unwind.session.replay import Session

    word = _task_word(clean_kdump, vmseed, 1, "pid")
    data = apply_edits(vmseed.raw, [(word.offset, word.width, 44308592)])
    assert fuzzer.guarded("vmmem", "pid", lambda: fuzzer.check_vmcore(data, vmseed)).kind == "ok"
    (tmp_path / "v.elf").write_bytes(data)
    s = Session.load(tmp_path / "v.elf", vmlinux=vmseed.image_path)
    # no task: listed by its address on a line saying why (ps), its walk stopping on it
    assert 1 not in {t.pid for t in s.dump.tasks()} and len(s.dump.tasks()) == len(clean_kdump.dump.tasks())
    assert [t.lacks.what for t in s.dump.tasks() if t.pid is None and t.lacks is not None] == \
        ["pid 44308592 is past PID_MAX_LIMIT (4194304): not a task"]


def test_vmmem_a_task_stack_running_past_the_address_space_is_no_stack(fuzzer, vmseed, clean_kdump, tmp_path):
    # found by the vmmem family (campaign 1, case 19): task->stack + THREAD_SIZE past 2**64 was a
    # stack range no note can hold
    from unwind.session.replay import Session

    word = _task_word(clean_kdump, vmseed, 1, "stack")
    data = apply_edits(vmseed.raw, [(word.offset, word.width, 2**64 - 0x1000)])
    assert fuzzer.guarded("vmmem", "stack", lambda: fuzzer.check_vmcore(data, vmseed)).kind == "ok"
    (tmp_path / "v.elf").write_bytes(data)
    task = next(t for t in Session.load(tmp_path / "v.elf", vmlinux=vmseed.image_path).dump.tasks() if t.pid == 1)
    assert not [s for s in task.stacks if s.kind == "task"] and "runs past the address space" in task.extra["note"]


def test_vmmem_a_module_region_larger_than_any_module_leaves_the_module_out(fuzzer, tmp_path):
    # found by a directed vmmem sweep of the x86-64 slice's struct module words: mod->mem[].size of
    # 2**31 or more went into the note convert writes, whose schema refuses it (a ValidationError)
    from unwind.session.replay import Session

    seed = next(s for s in fuzzer.vmmem_seeds if s.name.endswith("amd64/vmcore/stop-001-random")).recorded(fuzzer.scratch)
    (tmp_path / "clean.elf").write_bytes(seed.raw)
    clean = Session.load(tmp_path / "clean.elf", vmlinux=seed.image_path)
    k = clean.dump.kernel
    mod = clean.dump.modules[0]
    addr = mod.addr + k.btf.member("module", "mem[0].size").offset
    off, size, vaddr = next(b for b in seed.bulk if b[2] is not None and b[2] <= addr < b[2] + b[1])
    data = apply_edits(seed.raw, [(off + addr - vaddr, 4, 2**31)])
    assert fuzzer.guarded("vmmem", "module", lambda: fuzzer.check_vmcore(data, seed), fuzzer.vmmem_cpu_limit).kind == "ok"
    (tmp_path / "v.elf").write_bytes(data)
    s = Session.load(tmp_path / "v.elf", vmlinux=seed.image_path)
    assert [m.name for m in s.dump.modules] == [m.name for m in clean.dump.modules[1:]]
    assert any(f"module {mod.name}: its text region of 0x80000000 bytes" in w for w in s.warnings)


def test_a_dynamic_ftrace_trampoline_of_no_size_or_a_huge_one_is_left_out():
    """create_trampoline() copies ftrace_caller (a few hundred bytes): ops whose trampoline_size is 0
    or past MAX_TRAMPOLINE_BYTES hold no trampoline the walk could be in."""
    from unwind.kernel.btf import Btf
    from unwind.kernel.model import ftrace_trampolines

    b = BtfBuilder()
    u64, u32 = b.int("unsigned long", 8), b.int("unsigned int", 4)
    b.struct("ftrace_ops", 32, [("next", u64, 0), ("flags", u64, 8), ("trampoline", u64, 16),
                                ("trampoline_size", u32, 24)])
    head, end, base = 0x1000, 0x2000, 0x3000
    words = {head: base}
    for i, size in enumerate((0x150, 0, 2**32 - 1)):
        ops = base + 0x40 * i
        words.update({ops: ops + 0x40 if i < 2 else end, ops + 16: 0xFFFFFFFFC0000000 + 0x1000 * i, ops + 24: size})
    mem = Memory([Segment(0x1000, b"".join(words.get(a, 0).to_bytes(8, "little") for a in range(0x1000, 0x4000, 8)))])

    class Reader:
        btf = Btf(b.blob())
        read, read_u64 = mem.read, mem.read_u64

        @staticmethod
        def symbol(name: str) -> int | None:
            return {"ftrace_ops_list": head, "ftrace_list_end": end}.get(name)
    got = ftrace_trampolines(Reader())  # type: ignore[arg-type]
    assert [(t.addr, t.size) for t in got] == [(0xFFFFFFFFC0000000, 0x150)]


def test_vmmem_a_crash_note_whose_pid_is_no_pid_gives_the_cpu_no_pid(fuzzer, vmseed, clean_kdump, tmp_path):
    """kdump's CPUs saved their registers in crash_notes (crash_save_cpu()), in memory: a pr_pid past
    PID_MAX_LIMIT there is no pid (convert wrote it into a note its schema refuses)."""
    from unwind.session.replay import Session

    k = clean_kdump.dump.kernel
    note = (k.read_u64(k.symbol("crash_notes")) + k.per_cpu_offset[0]) % 2**64
    pid = note + 12 + 8 + 32  # Elf64_Nhdr, "CORE\0" padded, elf_prstatus.pr_pid
    off, size, vaddr = next(b for b in vmseed.bulk if b[2] is not None and b[2] <= pid < b[2] + b[1])
    data = apply_edits(vmseed.raw, [(off + pid - vaddr, 4, 2**31 + 5)])
    assert fuzzer.guarded("vmmem", "crash note", lambda: fuzzer.check_vmcore(data, vmseed),
                          fuzzer.vmmem_cpu_limit).kind == "ok"
    (tmp_path / "v.elf").write_bytes(data)
    cpus = Session.load(tmp_path / "v.elf", vmlinux=vmseed.image_path).dump.cpus
    assert [c.pid for c in cpus] == [None] + [c.pid for c in clean_kdump.dump.cpus[1:]]


def test_vmmem_a_last_cpu_past_nr_cpus_is_not_said(fuzzer, vmseed, clean_kdump, tmp_path):
    # found by the seeded campaign on the riscv true kdump (case 0:280): a task's thread_info.cpu of 900640
    # went into the note convert writes, whose schema refuses it (set_task_cpu() sets a possible CPU only)
    from unwind.session.replay import Session

    k = clean_kdump.dump.kernel
    pid = next(t.pid for t in clean_kdump.dump.tasks() if not t.running and t.pid and t.cpu is not None)
    word = _task_word(clean_kdump, vmseed, pid, "thread_info.cpu" if k.has("task_struct", "thread_info.cpu") else "cpu")
    data = apply_edits(vmseed.raw, [(word.offset, word.width, 900640)])
    assert fuzzer.guarded("vmmem", "cpu", lambda: fuzzer.check_vmcore(data, vmseed)).kind == "ok"
    (tmp_path / "v.elf").write_bytes(data)
    task = next(t for t in Session.load(tmp_path / "v.elf", vmlinux=vmseed.image_path).dump.tasks() if t.pid == pid)
    assert task.cpu is None and not task.running


class _SpinsWhenCollected:
    """Spins for a second of CPU in ``__del__``, where Python drops whatever is raised (as in a gc callback)."""

    def __del__(self) -> None:
        end = time.process_time() + 1
        while time.process_time() < end:
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_timeout_dropped_where_it_landed_is_still_a_hang():
    def run() -> Outcome:
        _SpinsWhenCollected()  # collected at once: the bound passes inside its __del__, which drops the raise
        return Outcome("case", "ok")
    assert checks.guarded("case", "label", run, 0.05).kind == "hang"
    assert checks.guarded("case", "label", lambda: Outcome("case", "ok"), 5).kind == "ok"
