"""The speed section of the benchmark report, from the JSON of real runs of the speed scripts.

``data/speed/speed_peer.json`` is a real run of ``benches/speed_peer.py`` (every arch; drgn 0.3.0 on
the lab's vmcores of the committed stops) and ``data/speed/profile.json`` of ``benches/profile_replay.py``
(every arch, twelve functions each), made with::

    python benches/speed_peer.py --rounds 1 \\
        --drgn-python /path/to/venv-with-drgn/bin/python --json tests/bench/data/speed/speed_peer.json
    python benches/profile_replay.py --json tests/bench/data/speed/profile.json

The expected figures are computed here from the children's raw numbers, not taken from the report code.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from unwind.dev.bench.results import fmt_num
from unwind.dev.bench.speed import profile_lines, speed_goals, speed_lines

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
    assert names == [f"single-task {kind}, {arch}" for arch in ("arm64", "x86_64", "riscv")
                     for kind in ("warm", "fresh Session")] + [f"batch replay, {arch}" for arch in ("arm64", "x86_64", "riscv")]
    for g in goals:
        assert g.verdict == "met" or g.verdict.startswith(("MISSED by", "not measured: "))


def test_the_warm_target_is_set_against_drgn_on_the_same_tasks() -> None:
    warm = next(g for g in speed_goals(DATA) if g.name == "single-task warm, arm64")
    ours, drgn = _per_kernel_frame("arm64", "ours"), _per_kernel_frame("arm64", "drgn equal")
    assert warm.drgn.startswith(f"{fmt_num(ours / drgn)}× drgn's time per frame")
    runs = _raw()["runs"]["arm64 corpus"]
    us = statistics.median(r["warm"] / r["frames"] * 1e6 for r in runs)
    assert warm.measured.startswith(f"{fmt_num(us)} µs CPU")
    assert warm.verdict == ("met" if us <= 2.0 else f"MISSED by {fmt_num(us / 2.0)}×")


def test_the_peer_table_gives_both_drgn_rows_per_kernel_frame() -> None:
    text = "\n".join(speed_lines(DATA))
    row = next(line for line in text.splitlines() if line.startswith("| x86_64 |") and "µs CPU" in line)
    for side in ("ours", "drgn equal", "drgn dwarf"):
        assert f"{fmt_num(_per_kernel_frame('x86_64', side))} µs CPU" in row
    assert "kernel-only tasks" in text
    assert "same pcs as drgn on equal inputs" in text


def test_the_profile_section_lists_the_top_functions() -> None:
    prof = json.loads((DATA / "profile.json").read_text())
    lines = profile_lines(prof)
    top = prof["arches"]["riscv"]["top"][0]
    assert any(f"`{top['function']}`" in line and f"{top['cumulative'] / prof['arches']['riscv']['total']:.0%}" in line
               for line in lines)
