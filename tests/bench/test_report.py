"""``unwind bench --report`` from a saved run: the report, its targets and its plots.

``data/quick-run.json`` is the JSON of a real quick run of all the benches
(the replay benches on the first dump of each committed corpus, the peer on
four tasks of an x86-64 and an arm64 pair made with ``benches/peer_pair.py``),
made with::

    UNWIND_PEER_DUMPS=/tmp/peer UNWIND_BENCH_QUICK=1 python3 -m pytest benches/ \\
        --benchmark-json=tests/bench/data/quick-run.json \\
        --benchmark-min-rounds=1 --benchmark-max-time=0.02 --benchmark-warmup=off

with the per-round ``stats.data`` arrays removed to keep it small.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from unwind.dev.bench.figures import fit_line, replay_figures, targets
from unwind.dev.bench.report import write_report
from unwind.dev.bench.results import REPLAY_MODES, Results, fmt_num, load_results, machine_text
from unwind.cli.main import main

FIXTURE = Path(__file__).parent / "data" / "quick-run.json"


@pytest.fixture(scope="module")
def results() -> Results:
    return load_results(FIXTURE)


def _raw() -> dict:
    return json.loads(FIXTURE.read_text())


def test_replay_target_is_the_walk_per_frame_over_three_microseconds(results: Results) -> None:
    raw = next(b for b in _raw()["benchmarks"] if b["extra_info"].get("kind") == "replay"
               and b["extra_info"]["arch"] == "arm64" and b["extra_info"]["mode"] == "walk")
    us = raw["stats"]["median"] / raw["extra_info"]["frames"] * 1e6
    goal = next(t for t in targets(results) if t.name == "replay per frame, arm64")
    assert goal.measured.startswith(fmt_num(us))
    assert goal.ratio == f"{fmt_num(us / 3.0)}× the budget"
    assert goal.verdict == ("met" if us <= 3.0 else f"MISSED by {fmt_num(us / 3.0)}×")


def test_every_target_is_listed_with_a_verdict(results: Results) -> None:
    goals = targets(results)
    assert [g.name for g in goals] == [
        "replay per frame, arm64", "replay per frame, x86_64", "replay per frame, riscv", "batch orc_find",
        "batch orc_find vs C floor", "vs drgn per frame, x86_64", "vs drgn per frame, arm64"]
    for g in goals:
        assert g.verdict == "met" or g.verdict.startswith(("MISSED by", "not measured: "))
    # the 30 M/s target needs 1 M ips per call: a quick run has fewer, so it is not measured
    assert goals[3].verdict == "not measured: not run"


def test_peer_target_is_drgn_per_frame_over_ours(results: Results) -> None:
    raw = {b["extra_info"]["tool"]: b for b in _raw()["benchmarks"]
           if b["extra_info"].get("kind") == "peer" and b["extra_info"]["arch"] == "x86_64"}
    per = {tool: b["stats"]["median"] / b["extra_info"]["frames"] for tool, b in raw.items()}
    ratio = per["drgn"] / per["unwind"]
    goal = next(t for t in targets(results) if t.name == "vs drgn per frame, x86_64")
    assert goal.ratio == f"{fmt_num(ratio)}× faster"
    assert goal.verdict == ("met" if ratio >= 100 else f"MISSED by {fmt_num(100 / ratio)}×")


def test_c_floor_target_compares_batch_and_c_of_the_same_run(results: Results) -> None:
    raw = {b["extra_info"]["method"]: b for b in _raw()["benchmarks"] if b["extra_info"].get("kind") == "orc_lookup"}
    rate = {m: b["extra_info"]["lookups"] / b["stats"]["median"] for m, b in raw.items()}
    goal = next(t for t in targets(results) if t.name == "batch orc_find vs C floor")
    ratio = rate["orc_find_batch"] / rate["c_bsearch"]
    assert goal.ratio == f"{fmt_num(ratio)}×"
    assert goal.verdict == ("met" if ratio > 1 else f"MISSED by {fmt_num(1 / ratio)}×")


def test_breakdown_sums_to_the_walk(results: Results) -> None:
    reps = replay_figures(results)
    assert set(reps) == {"arm64", "x86_64", "riscv"}
    assert reps["arm64"].lookup is None and reps["riscv"].lookup is None  # frame records: no metadata lookup
    assert reps["x86_64"].lookup is not None
    for a in reps.values():
        assert a.reads is not None and a.setup is not None and a.recovery is not None
        rest = a.modes["walk"] - a.setup - a.reads - (a.lookup or 0.0)
        assert a.recovery == pytest.approx(max(rest, 0.0))
        assert set(a.modes) == set(REPLAY_MODES)


def test_report_names_machine_corpus_targets_and_plots(results: Results, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_report(results, tmp_path, "the fixture")
    text = path.read_text()
    assert text.startswith("# unwind benchmark report\n")
    assert f"**Machine**: {machine_text(results)}" in text
    assert "Python 3." in machine_text(results) and "numpy" in machine_text(results)
    assert "**Corpus**: corpora/arm64/6.12.117+deb13-arm64 (1 dump, 4 tasks, " in text
    assert "**Quick mode**" in text
    assert "| replay per frame, riscv | ≤ 3.00 µs/frame" in text
    assert "| `c_bsearch` |" in text and "| `orc_find_batch` |" in text
    for png in ("per_arch.png", "batch.png", "depth.png", "table_size.png", "peer.png"):
        assert f"]({png})" in text
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| x86_64 | 4 | " in text  # the peer table: four shared tasks
    assert "## Skipped" in text and "arm64 walks frame records: no metadata lookup to time" in text


def test_report_without_matplotlib_says_so(results: Results, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    text = write_report(results, tmp_path, "the fixture").read_text()
    assert "_(depth.png: matplotlib is not installed; `pip install '.[report]'` draws it)_" in text
    assert not list(tmp_path.glob("*.png"))
    assert "\n## Targets\n" in text and "issue 7" not in text and "+ -" not in text


def test_cli_from_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the plots are tested above: keep this one quick
    assert main(["bench", "--report", str(tmp_path / "out"), "--from-json", str(FIXTURE), "--stat", "min"]) == 0
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / 'out' / 'report.md'}" in err
    assert "replay per frame, arm64: " in err
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Every figure is the min of the benchmark's rounds, timed with `perf_counter` (wall clock)." in text


def test_cli_bad_json_is_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "benchmarks"}')
    assert main(["bench", "--report", str(tmp_path / "out"), "--from-json", str(bad)]) == 2
    assert "not a pytest-benchmark JSON" in capsys.readouterr().err
    assert main(["bench", "--report", str(tmp_path / "out"), "--from-json", str(tmp_path / "none.json")]) == 2


def test_fit_line_recovers_a_line() -> None:
    fit = fit_line([1, 2, 3, 4], [3.0, 5.0, 7.0, 9.0])
    assert fit is not None
    assert (fit.slope, fit.intercept, fit.r2) == pytest.approx((2.0, 1.0, 1.0))
    assert fit_line([1, 1], [2.0, 3.0]) is None
