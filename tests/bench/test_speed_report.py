"""The speed section of the benchmark report, from the JSON of real runs of the speed scripts.

``data/speed/speed_peer.json`` is a real run of ``benches/speed_peer.py`` (every arch; drgn 0.3.0 in
each configuration on the committed vmcores), ``data/speed/profile.json`` of ``benches/profile_replay.py``
(every arch, twelve functions each) and ``data/speed/triage.json`` of ``benches/triage_throughput.py``,
made with::

    python benches/speed_peer.py --rounds 3 \\
        --drgn-python /path/to/venv-with-drgn/bin/python --json tests/bench/data/speed/speed_peer.json
    python benches/profile_replay.py --json tests/bench/data/speed/profile.json
    python benches/triage_throughput.py --rounds 3 --json tests/bench/data/speed/triage.json

The expected figures are computed here from the children's raw numbers, not taken from the report code.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from unwind.dev.bench.results import fmt_num
from unwind.dev.bench.speed import DRGN_CONFIGS, profile_lines, speed_goals, speed_lines, triage_lines

DATA = Path(__file__).parent / "data" / "speed"


def _raw() -> dict:
    return json.loads((DATA / "speed_peer.json").read_text())


def _per_kernel_frame(arch: str, side: str) -> float:
    """µs per kernel frame of the kernel-only tasks, every vmcore of the arch summed, median over rounds."""
    cores = _raw()["peer"][arch].values()
    rounds = min(len(c[side]) for c in cores)
    return statistics.median(sum(c[side][i]["k_warm"] for c in cores) / sum(c[side][i]["k_frames"] for c in cores)
                             * 1e6 for i in range(rounds))


def test_every_speed_target_is_listed_with_a_verdict() -> None:
    goals = speed_goals(DATA)
    names = [g.name for g in goals]
    runs = _raw()["runs"]
    builds = [("", "")] + [(" compiled", " (compiled build)")] * any(k.endswith(" compiled") for k in runs)
    assert names == [f"single-task {kind}, {arch}{of}" for arch in ("arm64", "x86_64", "riscv") for run, of in builds
                     if f"{arch} corpus{run}" in runs
                     for kind in ("warm", "fresh Session")] + [f"batch replay, {arch}" for arch in ("arm64", "x86_64", "riscv")]
    for g in goals:
        assert g.verdict == "met" or g.verdict.startswith(("MISSED by", "not measured: "))


def test_the_warm_target_is_set_against_drgns_bare_unwinder_on_the_same_tasks() -> None:
    warm = next(g for g in speed_goals(DATA) if g.name == "single-task warm, arm64")
    ours, drgn = _per_kernel_frame("arm64", "ours"), _per_kernel_frame("arm64", "drgn regs")
    assert warm.drgn.startswith(f"{fmt_num(ours / drgn)}× drgn's time per frame from `pt_regs`")
    runs = _raw()["runs"]["arm64 corpus"]
    us = statistics.median(r["warm"] / r["frames"] * 1e6 for r in runs)
    assert warm.measured.startswith(f"{fmt_num(us)} µs CPU")
    assert warm.verdict == ("met" if us <= 2.0 else f"MISSED by {fmt_num(us / 2.0)}×")


def _row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_peer_table_has_every_configuration_per_kernel_frame_and_its_ratio_to_ours() -> None:
    text = "\n".join(speed_lines(DATA))
    assert text.count("per kernel frame |") == 2  # one table: arm64 and x86_64 columns
    ours = {arch: _per_kernel_frame(arch, "ours") for arch in ("arm64", "x86_64")}
    for side, name in (("ours", "ours, warm (pure-Python build)"), ("drgn regs", "drgn from `pt_regs` (its bare unwinder)"),
                       ("drgn types", "drgn from the task, types from DWARF in C"),
                       ("drgn dwarf", "drgn as users run it, DWARF CFI")):
        cells = _row(text, name)
        for i, arch in enumerate(("arm64", "x86_64")):
            us = _per_kernel_frame(arch, side)
            assert cells[1 + 2 * i].startswith(f"{fmt_num(us)} µs CPU"), (side, arch)
            assert cells[2 + 2 * i] == f"{fmt_num(us / ours[arch])}×", (side, arch)
    orc = _row(text, "drgn as users run it, ORC preferred")
    assert orc[1] == "no ORC on arm64"
    assert orc[3].startswith(f"{fmt_num(_per_kernel_frame('x86_64', 'drgn orc'))} µs CPU")
    compiled = _row(text, "ours, warm (compiled build)")
    for i, arch in enumerate(("arm64", "x86_64")):
        if any("ours compiled" in c for c in _raw()["peer"][arch].values()):
            us = _per_kernel_frame(arch, "ours compiled")
            assert compiled[1 + 2 * i].startswith(f"{fmt_num(us)} µs CPU")
            assert compiled[2 + 2 * i] == f"{fmt_num(us / ours[arch])}×"
        else:
            assert compiled[1 + 2 * i] == "not measured"
    fresh = _row(text, "ours, fresh Session (pure-Python build)")
    cores = _raw()["peer"]["x86_64"].values()
    us = statistics.median(sum(c["ours"][i]["k_fresh"] for c in cores) / sum(c["ours"][i]["k_frames"] for c in cores)
                           * 1e6 for i in range(min(len(c["ours"]) for c in cores)))
    assert fresh[3].startswith(f"{fmt_num(us)} µs CPU")
    assert "kernel-only tasks" in text and "equal inputs" not in text
    for _, name, _ in DRGN_CONFIGS:
        assert f"- **{name}**: " in text  # what each configuration does per frame


def test_the_peer_validation_compares_ours_with_every_drgn_configuration() -> None:
    raw = _raw()
    text = "\n".join(speed_lines(DATA))
    for core, check in raw["validation"].items():
        line = next(line for line in text.splitlines() if line.startswith(f"- `{core}`: the same pcs as ours"))
        for side in ("drgn regs", "drgn types", "drgn dwarf"):
            assert f"{side[5:]} {check[side]['same']} of {check[side]['compared']}" in line


def test_triage_throughput_is_reported_per_core() -> None:
    raw = json.loads((DATA / "triage.json").read_text())
    cpu = statistics.median(r["cpu"] for r in raw["runs"])
    row = _row("\n".join(triage_lines(raw)), f"{raw['runs'][0]['dumps']:,}" +
               (f" ({raw['runs'][0]['failed']} failed)" if raw["runs"][0]["failed"] else ""))
    assert row[2] == f"{fmt_num(cpu)} s"
    assert row[4] == fmt_num(raw["runs"][0]["dumps"] / cpu)
    assert row[5] == f"{raw['runs'][0]['tasks'] / cpu:,.0f}"


def test_the_profile_section_lists_the_top_functions() -> None:
    prof = json.loads((DATA / "profile.json").read_text())
    lines = profile_lines(prof)
    top = prof["arches"]["riscv"]["top"][0]
    assert any(f"`{top['function']}`" in line and f"{top['cumulative'] / prof['arches']['riscv']['total']:.0%}" in line
               for line in lines)


def test_a_batch_run_without_a_warm_process_is_judged_on_a_processs_first_batch(tmp_path: Path) -> None:
    """Without a warm-process figure the verdict reads the ``fresh`` one (a process's first batch); the ``next``
    one (a later batch on sessions just opened) is shown beside it, not judged (rates known by construction)."""
    run = {"tasks": 1000, "batched_tasks": 900, "frames": 3_500_000, "batched_frames": 3_000_000,
           "fresh": 2.0, "next": 0.5, "warm": 0.25}
    (tmp_path / "batch_replay.json").write_text(json.dumps({"ours": {"arm64": [run] * 3}, "peer": {}}))
    goal = next(g for g in speed_goals(tmp_path) if g.name == "batch replay, arm64")
    assert goal.measured == ("1.50 M frames/s fresh (the process's first batch, sessions just opened), "
                             "6.00 M frames/s next (a later batch, sessions just opened), 12.0 M frames/s warm; "
                             "90% of 1,000 tasks in lockstep")
    assert goal.verdict == "MISSED by 2.00×"


def test_the_batch_target_is_judged_on_a_first_batch_in_a_warm_process_and_shows_the_processs_first(
        tmp_path: Path) -> None:
    """With a warm-process run (a first batch of its kernels in a process that walked a batch before) the verdict
    reads it; the process's very first batch is shown beside it (rates known by construction)."""
    run = {"tasks": 1000, "batched_tasks": 900, "frames": 3_500_000, "batched_frames": 3_000_000,
           "fresh": 2.0, "next": 0.5, "warm": 0.25}
    warm_process = [{"tasks": 1000, "batched_tasks": 900, "frames": 3_500_000, "batched_frames": 3_000_000,
                     "fresh": fresh} for fresh in (0.75, 1.0, 2.0)]
    (tmp_path / "batch_replay.json").write_text(json.dumps({"ours": {"arm64": [run] * 3},
                                                            "warm_process": {"arm64": warm_process}, "peer": {}}))
    goal = next(g for g in speed_goals(tmp_path) if g.name == "batch replay, arm64")
    assert goal.measured.startswith("3.00 M frames/s fresh in a warm process (judged: ")
    assert "1.50 M frames/s fresh (the process's first batch, sessions just opened), " in goal.measured
    assert goal.ratio == "1.00× the target"
    assert goal.verdict == "met"
