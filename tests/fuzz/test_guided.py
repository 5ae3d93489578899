"""The coverage-guided engine (``unwind fuzz --engine atheris``, :mod:`unwind.dev.fuzz.guided`): its
structure-aware steps, the checks on each input, and a short libFuzzer run when atheris is installed
(the ``[fuzz]`` extra)."""

from __future__ import annotations

import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from unwind.dev.fuzz.cases import Fuzzer
from unwind.dev.fuzz.guided import STEPS, Guided
from unwind.dev.fuzz.seeds import load_seeds

CORPUS = Path(__file__).resolve().parents[2] / "corpora"


@pytest.fixture(scope="module")
def guided() -> Guided:
    seeds = [s for s in load_seeds(CORPUS) if s.name.startswith("6.12.")]
    return Guided(Fuzzer(seeds), _flip)


def _flip(data: bytes, max_size: int) -> bytes:
    """A byte mutation in place of libFuzzer's (``atheris.Mutate`` works only inside a run)."""
    return data[:-1] + bytes([data[-1] ^ 1])[:max_size]


def test_a_dump_is_a_seed_again_and_junk_is_not(guided):
    seed = guided.fuzzer.seeds[0]
    again = guided.seed_of(seed.writer().to_bytes())
    assert again is not None and again.arch == seed.arch and again.image_path == seed.image_path
    assert again.segments == seed.segments and again.meta["tasks"] == seed.meta["tasks"]
    assert guided.seed_of(b"\x7fELF junk") is None


def test_every_seed_passes_the_checks(guided):
    for s in guided.fuzzer.seeds:
        guided.one_input(s.writer().to_bytes())
    assert guided.outcomes["ok"] == len(guided.fuzzer.seeds), guided.summary()


def test_structure_aware_steps_make_dumps(guided):
    data = guided.fuzzer.seeds[0].writer().to_bytes()
    outs = [guided.mutate(data, 4 * len(data), k) for k in range(40)]
    assert all(isinstance(o, bytes) and len(o) <= 4 * len(data) for o in outs)
    assert sum(o != data for o in outs) >= 35
    assert set(guided.steps) > {"bytes"} and sum(guided.steps[k] for k in STEPS) >= 20, guided.steps


def test_an_input_that_breaks_a_promise_is_kept(guided, tmp_path, monkeypatch):
    monkeypatch.setattr(guided.fuzzer, "keep", tmp_path)
    monkeypatch.setattr(guided, "check", lambda data: {}["missing"])  # as a KeyError in replay would
    guided.one_input(b"the input")
    kept = list(tmp_path.glob("guided-*.bin.xz"))
    assert len(kept) == 1 and lzma.decompress(kept[0].read_bytes()) == b"the input"
    assert "outcome: traceback" in kept[0].with_suffix("").with_suffix(".txt").read_text()


@pytest.mark.slow
def test_a_short_libfuzzer_run(tmp_path):
    pytest.importorskip("atheris")
    run = subprocess.run([sys.executable, "-m", "unwind.cli.main", "fuzz", "--corpus", str(CORPUS), "--engine", "atheris",
                          "--runs", "60", "--work", str(tmp_path / "w"), "--keep", str(tmp_path / "kept")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Done 60 runs" in run.stderr
    assert not (tmp_path / "kept").exists()
