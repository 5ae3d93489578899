"""The fuzzer (unwind fuzz): a seeded campaign over every family, its checks, and the kept
regression cases (issue 13's crash groups and any case a campaign ever failed)."""

from __future__ import annotations

import argparse
import json
import lzma
import random
import subprocess
import sys
from pathlib import Path

import pytest

from unwind import fuzz as F
from unwind.memory import Memory, Segment

from ..btfbuild import BtfBuilder
from .vmcore_seeds import write as write_vmcore_seeds

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "corpora"
REGRESSIONS = Path(__file__).with_name("regressions")
#: the default suite's campaign: every family, a few thousand cases in well under a minute
CASES = 2000


def _btf_blob() -> bytes:
    b = BtfBuilder()
    u64 = b.int("unsigned long", 8)
    regs = b.struct("pt_regs", 24, [("sp", u64, 0), ("pc", u64, 8), ("pstate", u64, 16)])
    thread = b.struct("thread_struct", 32, [("s", b.array(u64, 4), 0)])
    b.struct("task_struct", 64, [("stack", b.ptr(regs), 0), ("pid", b.int("int", 4), 8), ("thread", thread, 16)])
    return b.blob()


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory) -> F.Fuzzer:
    vm = write_vmcore_seeds(tmp_path_factory.mktemp("vmcores"))
    f = F.Fuzzer(F.load_seeds(CORPUS), vmcore_seeds=[(p.name, p.read_bytes()) for p in vm],
                 scratch=tmp_path_factory.mktemp("scratch"), btf_blobs=[_btf_blob()])
    f.keep = tmp_path_factory.mktemp("kept")
    return f


#: image cases in it (one costs ~50 dump cases: the long runs give them F.IMAGE_SHARE)
IMAGE_SHARE = 0.005


def test_a_seeded_campaign_breaks_no_promise(fuzzer, monkeypatch):
    monkeypatch.setattr(fuzzer, "image_share", IMAGE_SHARE)
    summary = F.run_cases(fuzzer, 0, range(CASES))
    assert summary.failures == 0, "\n".join(f"{k}\n{v}" for k, v in summary.examples.items())
    for fam in F.FAMILIES[:-1]:  # every family ran, and the mutations reached the input checks
        assert sum(summary.counts[fam].values()) >= CASES // len(F.FAMILIES) // 3, fam
    for fam in ("json", "elf", "btf", "vmcore", "image"):
        assert summary.counts[fam]["rejected"] > 0, fam
    for fam in ("stack", "regs", "image"):  # a mutated image is also opened and replayed with
        assert summary.counts[fam]["ok"] > 0, fam


def test_a_case_is_reproducible(fuzzer):
    first = [(fuzzer.case(i, 7), fuzzer.last) for i in range(20)]
    again = [(fuzzer.case(i, 7), fuzzer.last) for i in range(20)]
    assert first == again


# --- the checks themselves fire -------------------------------------------------------------------

def test_a_read_past_a_segment_is_caught():
    mem = F.instrument(Memory([Segment(0x1000, bytes(16))]))
    data = mem.segments[0].data
    assert data[8:16] == bytes(8)
    for bad in (lambda: data[8:24], lambda: data[16], lambda: data[-1:]):
        with pytest.raises(F.OutOfDump):
            bad()


def test_exceptions_hangs_and_bad_values_are_outcomes(fuzzer):
    assert fuzzer.guarded("x", "t", lambda: {}["k"]).kind == "traceback"
    slow = F.Fuzzer([], cpu_limit=0.2)

    def spin() -> F.Outcome:
        while True:
            pass
    assert slow.guarded("x", "t", spin).kind == "hang"
    from unwind.frame import Frame, Source
    assert F._bad_value([Frame(-1, None, None, Source.REGS_PC, None)]) is not None
    assert F._bad_value([Frame(2**64, 0, 0, Source.REGS_PC, None)]) is not None
    assert F._bad_value([Frame(2**64 - 1, 0, 0, Source.REGS_PC, None)]) is None


def test_a_walk_over_its_frame_limit_is_a_runaway(fuzzer, monkeypatch):
    seed = next(s for s in fuzzer.seeds if s.arch == "arm64")
    monkeypatch.setattr(F, "frame_limit", lambda *a: 0)
    out = fuzzer.check(seed.writer().to_bytes(), seed.name, seed.image_path, "stack")
    assert out.kind == "runaway"


def test_a_batch_replay_unlike_the_task_replay_is_caught(fuzzer, monkeypatch):
    """``replay --all`` walks in one batch (``Session.replay_all``): a batch that lost a frame differs."""
    import dataclasses

    from unwind.replay import Session

    seed = next(s for s in fuzzer.seeds if s.arch == "arm64")
    real = Session.replay_all

    def lossy(self, *a, **kw):
        return [dataclasses.replace(r, frames=r.frames[:-1]) for r in real(self, *a, **kw)]
    assert fuzzer.check(seed.writer().to_bytes(), seed.name, seed.image_path, "stack").kind == "ok"
    monkeypatch.setattr(Session, "replay_all", lossy)
    out = fuzzer.check(seed.writer().to_bytes(), seed.name, seed.image_path, "stack")
    assert out.kind == "batch-differs", out


def test_a_failing_case_is_kept(fuzzer, tmp_path):
    fuzzer.keep, kept = tmp_path, fuzzer.keep
    try:
        fuzzer.last = b"bytes of the case"
        path = fuzzer.keep_case(F.Outcome("json", "traceback", "KeyError: 'ret'"), fuzzer.seeds[0], "json-1-2")
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
    out = fuzzer.check(F.edited_dump(seed, case), seed.name, seed.image_path, "regression")
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


@pytest.mark.parametrize("path", KEPT, ids=[p.name for p in KEPT])
def test_kept_cases_stay_fixed(fuzzer, path):
    """Every case a campaign failed (``unwind fuzz --keep``), replayed as it was written."""
    info = dict(line.split(": ", 1) for line in path.with_suffix("").with_suffix(".txt").read_text().splitlines()
                if ": " in line and line.split(": ", 1)[0] in ("family", "seed"))
    data = lzma.decompress(path.read_bytes())
    seed = next(s for s in fuzzer.seeds if s.name == info["seed"])
    if info["family"] == "btf":
        out = fuzzer.guarded("btf", path.name, lambda: _btf(data))
    elif info["family"] == "vmcore":
        out = fuzzer.guarded("vmcore", path.name, lambda: _vmcore(fuzzer, data))
    else:
        out = fuzzer.guarded(info["family"], path.name, lambda: fuzzer.check(data, seed.name, seed.image_path))
    assert out.kind in ("ok", "rejected"), out


def _btf(data: bytes) -> F.Outcome:
    try:
        btf = F.Btf(data)
    except F.BtfError as e:
        return F._one_line("btf", e)
    F.query_btf(random.Random(0), btf, F.BtfSeed(data, ["task_struct", "pt_regs"], ["frame_type"]))
    return F.Outcome("btf", "ok")


def _vmcore(fuzzer: F.Fuzzer, data: bytes) -> F.Outcome:
    path = fuzzer.scratch / "kept-vmcore"
    path.write_bytes(data)
    error = F.read_vmcore(path)
    return F.Outcome("vmcore", "ok") if error is None else F._one_line("vmcore", error)


@pytest.mark.parametrize("value", ["0x", "0xzz", "0x1f"])
def test_a_near_miss_of_a_broken_hex_string_is_made(value):
    # found by the long campaign (seed 2026, case 22724): an earlier mutation had left "0x" and the
    # mutator itself raised int("0x", 16)
    for n in range(64):
        got = F.near_miss_hex(random.Random(n), value)
        assert got != value or value.upper() == value
        if isinstance(got, int):
            assert got == (int(value[2:], 16) if value == "0x1f" else -1)


def test_start_runs_the_campaign_from_a_case_index(tmp_path):
    """``--start N --cases K`` runs cases N..N+K-1 of the campaign, as the in-process fuzzer does."""
    report = tmp_path / "report.md"
    run = subprocess.run([sys.executable, "-m", "unwind.cli", "fuzz", "--corpus", str(CORPUS), "--cases", "3",
                          "--start", "40", "--chunk", "2", "--seed", "5", "--report", str(report)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    text = report.read_text()
    assert "cases: 3 of 3 (cases 40 to 42 of campaign 5)," in text
    fuzzer = F._fuzzer(argparse.Namespace(btf=None, vmcore_seeds=None, corpus=str(CORPUS), cpu_limit=F.CASE_CPU_LIMIT,
                                          keep=None))
    assert F.run_cases(fuzzer, 5, range(40, 43)).table() in text
    bad = subprocess.run([sys.executable, "-m", "unwind.cli", "fuzz", "--corpus", str(CORPUS), "--start", "-1"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "-1 is not a case index" in bad.stderr
