"""``unwind bench``: run the benchmarks (``benches/``) and write the benchmark report.

``unwind bench --report OUT/`` runs ``pytest benches/`` with pytest-benchmark
(progress on stderr), saves its JSON as ``OUT/benchmark.json`` and writes
``OUT/report.md`` with PNG plots beside it; ``--from-json F`` writes the
report from a saved JSON instead of running anything. The plots need
matplotlib (the ``[report]`` extra); without it the report is written
without them and says so.

The report reads the benches by their ``extra_info["kind"]`` (see
``docs/benchmarks.md``), the x86-64 ORC lookup benches of
``benches/bench_orc.py`` included. Every figure is the median of
the rounds (``--stat min`` or ``mean`` picks another statistic). Targets
come from issue 7 and are never adjusted: a missed target is printed with
the factor it is missed by.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

#: replay per frame, symbolisation and provenance off, on each arch (µs)
TARGET_US_PER_FRAME = 3.0
#: batch ``orc_find`` over 1 M uniform random text ips (lookups per second)
TARGET_BATCH_RATE = 30e6
#: how much faster per frame than drgn on the same tasks
TARGET_PEER_RATIO = 100.0

ARCH_ORDER = ("arm64", "x86_64", "riscv")
REPLAY_MODES = ("walk", "walk+symbols", "walk+provenance", "replay")
#: the per-bench statistics ``--stat`` may pick (pytest-benchmark's names)
STATS = ("median", "min", "mean")


class BenchError(Exception):
    """The suite could not run, or the JSON is not a pytest-benchmark result."""


@dataclass
class Bench:
    """One benchmark result: its name, seconds per call (the chosen statistic) and what it stored."""

    name: str
    fullname: str
    seconds: float
    rounds: int
    extra: dict[str, Any]

    @property
    def kind(self) -> str:
        """The ``extra_info["kind"]`` the bench declared (``"other"`` when none)."""
        return str(self.extra.get("kind", "other"))

    def per(self, key: str) -> float | None:
        """Seconds per unit of ``extra[key]`` (per frame, per lookup), or ``None``."""
        n = self.extra.get(key)
        return self.seconds / n if isinstance(n, (int, float)) and n > 0 else None

    def rate(self, key: str) -> float | None:
        """Units of ``extra[key]`` per second."""
        per = self.per(key)
        return 1.0 / per if per else None


@dataclass
class Results:
    """A pytest-benchmark JSON, read."""

    benches: list[Bench]
    machine: dict[str, Any]
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    quick: bool = False
    commit: str = ""
    datetime: str = ""
    load: dict[str, float] = field(default_factory=dict)
    stat: str = "median"
    timer: str = "perf_counter"

    def of(self, kind: str, **match: Any) -> list[Bench]:
        """The benches of ``kind`` whose extra info matches every ``key=value``."""
        return [b for b in self.benches if b.kind == kind and all(b.extra.get(k) == v for k, v in match.items())]

    def one(self, kind: str, **match: Any) -> Bench | None:
        """The first bench of ``kind`` matching, or ``None``."""
        found = self.of(kind, **match)
        return found[0] if found else None

    def skips(self, needle: str) -> list[str]:
        """Distinct skip reasons of benches whose node id contains ``needle``."""
        out: list[str] = []
        for s in self.skipped:
            if needle in s["bench"] and s["reason"] not in out:
                out.append(s["reason"])
        return out


def load_results(path: str | Path, stat: str = "median") -> Results:
    """Read a pytest-benchmark JSON (as ``--benchmark-json`` writes it), taking ``stat`` of each bench's rounds."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise BenchError(f"{path}: not a pytest-benchmark JSON (no 'benchmarks')")
    if stat not in STATS:
        raise BenchError(f"unknown statistic {stat!r} (one of {', '.join(STATS)})")
    benches = [Bench(b["name"], b.get("fullname", b["name"]), float(b["stats"][stat]),
                     int(b["stats"].get("rounds", 0)), dict(b.get("extra_info") or {}))
               for b in data["benchmarks"]]
    ours = data.get("unwind") or {}
    return Results(benches, dict(data.get("machine_info") or {}), list(ours.get("skipped", [])),
                   list(ours.get("failed", [])), bool(ours.get("quick", False)), str(ours.get("commit", "")),
                   str(data.get("datetime", "")), dict(ours.get("load") or {}), stat,
                   str(((data["benchmarks"] or [{}])[0].get("options") or {}).get("timer", "perf_counter")))


# --- formatting -------------------------------------------------------------------------------

def _num(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, without exponent for everyday magnitudes."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    mag = math.floor(math.log10(abs(x)))
    return f"{x:,.{max(digits - 1 - mag, 0)}f}"


def _us(seconds: float) -> str:
    return f"{_num(seconds * 1e6)} µs"


def _rate(per_second: float) -> str:
    if per_second >= 1e6:
        return f"{_num(per_second / 1e6)} M/s"
    if per_second >= 1e3:
        return f"{_num(per_second / 1e3)} k/s"
    return f"{_num(per_second)} /s"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def machine_text(r: Results) -> str:
    """CPU model, cores, Python and numpy versions of the machine that ran the suite."""
    u = r.machine.get("unwind") or {}
    cpu = u.get("cpu_model") or (r.machine.get("cpu") or {}).get("brand_raw") or r.machine.get("processor") or "?"
    cores = u.get("cores") or (r.machine.get("cpu") or {}).get("count") or "?"
    py = u.get("python") or r.machine.get("python_version") or "?"
    return f"{cpu}, {cores} cores, Python {py}, numpy {u.get('numpy', '?')}"


# --- the figures ------------------------------------------------------------------------------

@dataclass
class Fit:
    """A least-squares line ``y = slope * x + intercept`` and its R²."""

    slope: float
    intercept: float
    r2: float


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Fit | None:
    """Least squares over the points; ``None`` for fewer than two distinct x."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys))
    return Fit(slope, intercept, 1 - ss_res / ss_tot if ss_tot else 1.0)


def depth_growth(pts: Sequence[tuple[int, float]]) -> str:
    """Does walk time grow linearly with depth?

    Judged by the straight-line fit (R² ≥ 0.98) and by the log-log slope over the deepest chains
    (512 frames and more, where a walk's fixed cost no longer shows): 1 is linear, above 1.2 grows faster.
    """
    fit = fit_line([d for d, _ in pts], [t for _, t in pts])
    tail = [(d, t) for d, t in pts if d >= 512] if sum(d >= 512 for d, _ in pts) >= 2 else pts
    loglog = fit_line([math.log2(d) for d, _ in tail], [math.log2(t) for _, t in tail])
    if fit is None or loglog is None:
        return "too few depths"
    how = f"R² {fit.r2:.3f}, log-log slope {loglog.slope:.2f} from {tail[0][0]} frames"
    if fit.r2 >= 0.98 and 0.8 <= loglog.slope <= 1.2:
        return f"linear ({how})"
    if loglog.slope > 1.2:
        return f"faster than linear ({how})"
    return f"not clearly linear ({how}): a noisy run?"


def table_growth(pts: Sequence[tuple[int, float]]) -> str:
    """Does the cost per lookup grow with log2(entries), or not at all?"""
    fit = fit_line([math.log2(n) for n, _ in pts], [t for _, t in pts])
    if fit is None:
        return "too few sizes"
    mean = sum(t for _, t in pts) / len(pts)
    span = math.log2(pts[-1][0] / pts[0][0])
    if abs(fit.slope * span) < 0.25 * mean:
        return f"flat ({_num(fit.slope * 1e9)} ns per doubling over {span:.0f} doublings)"
    if fit.slope > 0 and fit.r2 >= 0.8:
        return f"logarithmic (+{_num(fit.slope * 1e9)} ns per doubling, R² {fit.r2:.3f})"
    return f"unclear ({_num(fit.slope * 1e9)} ns per doubling, R² {fit.r2:.3f}): a noisy run?"


@dataclass
class ArchReplay:
    """Per-frame figures of one arch's corpus."""

    arch: str
    modes: dict[str, float]            # mode -> seconds per frame
    frames: int
    corpus: str
    dumps: list[str]
    tasks: int
    setup: float | None = None         # seconds per frame
    lookup: float | None = None
    reads: float | None = None
    symbols: float | None = None

    @property
    def recovery(self) -> float | None:
        """The walk less its set-up, lookups and reads: the unwinder's own logic per step (never below zero)."""
        walk = self.modes.get("walk")
        if walk is None or self.reads is None or self.setup is None:
            return None
        return max(walk - self.setup - self.reads - (self.lookup or 0.0), 0.0)


def replay_figures(r: Results) -> dict[str, ArchReplay]:
    """Per arch, per mode seconds per frame, and the breakdown."""
    out: dict[str, ArchReplay] = {}
    for b in r.of("replay"):
        arch = b.extra["arch"]
        per = b.per("frames")
        if per is None:
            continue
        a = out.setdefault(arch, ArchReplay(arch, {}, int(b.extra["frames"]), str(b.extra.get("corpus", "")),
                                            list(b.extra.get("dumps", [])), int(b.extra.get("tasks", 0))))
        a.modes[b.extra["mode"]] = per
    for b in r.of("phase"):
        a = out.get(b.extra["arch"])
        frames = b.extra.get("frames")
        if a is None or not frames:
            continue
        setattr(a, b.extra["phase"], b.seconds / frames)
    return out


def depth_figures(r: Results) -> dict[str, list[tuple[int, float]]]:
    """Per arch, ``(depth, seconds per walk)`` sorted by depth."""
    out: dict[str, list[tuple[int, float]]] = {}
    for b in r.of("depth"):
        out.setdefault(b.extra["arch"], []).append((int(b.extra["depth"]), b.seconds))
    return {k: sorted(v) for k, v in out.items()}


def table_figures(r: Results) -> dict[str, list[tuple[int, float]]]:
    """Per lookup method, ``(entries, seconds per lookup)`` sorted by entries."""
    out: dict[str, list[tuple[int, float]]] = {}
    for b in r.of("table_size"):
        per = b.per("lookups")
        if per is not None:
            out.setdefault(b.extra["how"], []).append((int(b.extra["entries"]), per))
    return {k: sorted(v) for k, v in out.items()}


def batch_figures(r: Results) -> list[tuple[int, float]]:
    """``(batch size, lookups per second)`` of ``orc_find_batch``."""
    return sorted((int(b.extra["batch"]), b.rate("lookups") or 0.0) for b in r.of("batch_size"))


def peer_figures(r: Results) -> dict[str, dict[str, float]]:
    """Per arch, per tool seconds per frame."""
    out: dict[str, dict[str, float]] = {}
    for b in r.of("peer"):
        per = b.per("frames")
        if per is not None:
            out.setdefault(b.extra["arch"], {})[b.extra["tool"]] = per
    return out


@dataclass
class OrcFigures:
    """What ``benches/bench_orc.py`` measured on the real table: lookups per second per method."""

    rates: dict[str, float]
    batch_lookups: int = 0
    table: str = ""

    @property
    def batch(self) -> float | None:
        """``orc_find_batch`` lookups per second over 1 M ips, when measured so."""
        return self.rates.get("orc_find_batch") if self.batch_lookups >= 1_000_000 else None

    @property
    def c_floor(self) -> float | None:
        """The compiled plain binary search (``c_bsearch``), lookups per second."""
        return self.rates.get("c_bsearch")


def orc_figures(r: Results, kind: str = "orc_lookup") -> OrcFigures:
    """Read ``bench_orc.py``'s results (``kind`` ``orc_lookup``, or ``orc_lookup_traces`` for the ips of
    real traces; one per ``method``)."""
    f = OrcFigures({})
    for b in r.of(kind):
        rate = b.rate("lookups")
        if rate is None:
            continue
        method = str(b.extra.get("method", b.name))
        f.rates[method] = rate
        f.table = f.table or str(b.extra.get("table", ""))
        if method == "orc_find_batch":
            f.batch_lookups = int(b.extra["lookups"])
    return f


# --- targets ----------------------------------------------------------------------------------

@dataclass
class Goal:
    """One target of issue 7 with its measured value."""

    name: str
    goal: str
    measured: str
    ratio: str
    verdict: str
    #: the same figure against drgn on equal inputs (issue 14)
    drgn: str = ""


def _verdict(met: bool, factor: float) -> str:
    return "met" if met else f"MISSED by {_num(factor)}×"


def targets(r: Results) -> list[Goal]:
    """Every target of issue 7, measured or not."""
    out: list[Goal] = []
    reps = replay_figures(r)
    for arch in ARCH_ORDER:
        a = reps.get(arch)
        name = f"replay per frame, {arch}"
        goal = f"≤ {_num(TARGET_US_PER_FRAME)} µs/frame (symbols, provenance off)"
        if a is None or "walk" not in a.modes:
            why = "; ".join(r.skips(f"test_replay[{arch}-walk]")) or "not run"
            out.append(Goal(name, goal, "not measured", "–", f"not measured: {why}"))
            continue
        us = a.modes["walk"] * 1e6
        ratio = us / TARGET_US_PER_FRAME
        beside = ", ".join(f"{m} {_num(a.modes[m] * 1e6)} µs" for m in REPLAY_MODES[1:] if m in a.modes)
        pts = depth_figures(r).get(arch)
        fit = fit_line([d for d, _ in pts], [t for _, t in pts]) if pts else None
        if fit is not None:
            beside += f"; marginal cost on synthetic chains {_num(fit.slope * 1e6)} µs/frame"
        out.append(Goal(name, goal, f"{_num(us)} µs/frame ({beside})", f"{_num(ratio)}× the budget",
                        _verdict(us <= TARGET_US_PER_FRAME, ratio)))
    orc = orc_figures(r)
    batch = dict(batch_figures(r))
    rate = orc.batch if orc.batch is not None else batch.get(1 << 20)
    where = "bench_orc.py" if orc.batch is not None else "test_batch_size[1048576]"
    goal = f"≥ {_num(TARGET_BATCH_RATE / 1e6)} M lookups/s (1 M uniform text ips, real table)"
    if rate is None:
        why = "; ".join(r.skips("test_orc_lookup[orc_find_batch]") + r.skips("test_batch_size")) or "not run"
        out.append(Goal("batch orc_find", goal, "not measured", "–", f"not measured: {why}"))
    else:
        other = batch.get(1 << 20) if orc.batch is not None else None
        if other is not None:
            where += f"; {_rate(other)} in test_batch_size[1048576] of the same run"
        out.append(Goal("batch orc_find", goal, f"{_rate(rate)} ({where})",
                        f"{_num(rate / TARGET_BATCH_RATE)}× the target",
                        _verdict(rate >= TARGET_BATCH_RATE, TARGET_BATCH_RATE / rate)))
    goal = "faster than the compiled plain binary search, same ips, same run"
    batch_rate = orc.rates.get("orc_find_batch")
    if batch_rate is None or orc.c_floor is None:
        why = "; ".join(r.skips("test_orc_lookup[c_bsearch]") + r.skips("test_orc_lookup[orc_find_batch]"))
        out.append(Goal("batch orc_find vs C floor", goal, "not measured", "–",
                        f"not measured: {why or 'bench_orc.py did not run'}"))
    else:
        ratio = batch_rate / orc.c_floor
        out.append(Goal("batch orc_find vs C floor", goal,
                        f"{_rate(batch_rate)} vs C {_rate(orc.c_floor)} ({orc.batch_lookups:,} ips)",
                        f"{_num(ratio)}×", _verdict(ratio > 1.0, 1.0 / ratio)))
    traced = orc_figures(r, "orc_lookup_traces")
    t_batch, t_c = traced.rates.get("orc_find_batch"), traced.c_floor
    if t_batch is not None:
        vs = f" vs C {_rate(t_c)}" if t_c is not None else ""
        out.append(Goal("batch orc_find, ips from real traces",
                        f"≥ {_num(TARGET_BATCH_RATE / 1e6)} M lookups/s and faster than C (1 M ips of real traces)",
                        f"{_rate(t_batch)}{vs} ({traced.batch_lookups:,} ips)",
                        f"{_num(t_batch / TARGET_BATCH_RATE)}× the 30 M/s target",
                        _verdict(t_batch >= TARGET_BATCH_RATE and (t_c is None or t_batch > t_c),
                                 TARGET_BATCH_RATE / t_batch)))
    peers = peer_figures(r)
    for arch in ("x86_64", "arm64"):
        p = peers.get(arch, {})
        name = f"vs drgn per frame, {arch}"
        goal = f"≥ {_num(TARGET_PEER_RATIO)}× faster than drgn stack_trace, same tasks"
        if "unwind" not in p or "drgn" not in p:
            why = "; ".join(r.skips(f"test_peer[{arch}")) or "not run"
            out.append(Goal(name, goal, "not measured", "–", f"not measured: {why}"))
            continue
        ratio = p["drgn"] / p["unwind"]
        out.append(Goal(name, goal, f"unwind {_us(p['unwind'])}/frame, drgn {_us(p['drgn'])}/frame",
                          f"{_num(ratio)}× faster", _verdict(ratio >= TARGET_PEER_RATIO, TARGET_PEER_RATIO / ratio)))
    return out


# --- issue 14: speed against drgn on equal inputs (benches/speed_peer.py, batch_replay.py, startup.py) ---

#: the issue-14 scripts ``unwind bench`` runs beside the suite, and the JSON each writes into the report folder
SPEED_SCRIPTS = (("speed_peer.py", "speed_peer.json"), ("batch_replay.py", "batch_replay.json"),
                 ("startup.py", "startup.json"), ("profile_replay.py", "profile.json"))
#: single-task replay, warm, through the public API, call-site check on (µs per frame, CPU)
TARGET_WARM_US = 2.0
#: what a fresh Session may add per frame (µs)
TARGET_FRESH_EXTRA_US = 0.5
#: batch replay including set-up (frames per second)
TARGET_BATCH_FRAMES = {"arm64": 3e6, "riscv": 3e6, "x86_64": 1.5e6}
#: a warm ``unwind replay DUMP`` (wall, ms)
TARGET_STARTUP_MS = 200.0


#: the figures of a peer child (benchkit.DRGN_CHILD, OURS_PEER_CHILD) summed over an arch's vmcores
_PEER_SUMMED = ("tasks", "frames", "warm", "warm_wall", "k_tasks", "k_frames", "k_warm", "k_warm_wall", "user_frames")
#: the sides of speed_peer.py on a peer vmcore
_PEER_SIDES = ("ours", "drgn equal", "drgn dwarf")


def _median(values: Iterable[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def _per(runs: list[dict[str, Any]], key: str, count: str = "frames", scale: float = 1e6) -> float | None:
    """Median over rounds of ``key`` / ``count`` (µs per frame by default); ``None`` when a round counted nothing."""
    if not runs or any(not r.get(count) or key not in r for r in runs):
        return None
    return _median(r[key] / r[count] * scale for r in runs)


def _pair(cpu: float | None, wall: float | None) -> str:
    if cpu is None:
        return "not measured"
    return f"{_num(cpu)} µs CPU" + (f" / {_num(wall)} µs wall" if wall is not None else "")


def _times(x: float | None, y: float | None) -> str:
    """``x / y`` as ``N×``, or a dash."""
    return f"{_num(x / y)}×" if x and y else "–"


@dataclass
class PeerArch:
    """speed_peer.py on one arch's peer vmcores: each side's rounds, summed over the vmcores."""

    arch: str
    sides: dict[str, list[dict[str, Any]]]
    #: per vmcore: the kernel pcs of ours against each drgn mode, and a few traces
    checks: dict[str, dict[str, Any]]
    left_out: dict[str, Any]

    def frame(self, side: str, wall: bool = False) -> float | None:
        """µs per kernel frame over the kernel-only tasks (no side walked a user frame of them)."""
        return _per(self.sides.get(side, []), "k_warm_wall" if wall else "k_warm", "k_frames")

    def task(self, side: str) -> float | None:
        """CPU µs per task over every task (drgn's walk on into user frames included)."""
        return _per(self.sides.get(side, []), "warm", "tasks")

    def first(self, side: str, key: str) -> Any:
        """``key`` of ``side``'s first round (counts are the same every round)."""
        runs = self.sides.get(side) or [{}]
        return runs[0].get(key, 0)


def peer_archs(peer: dict[str, Any] | None) -> dict[str, PeerArch]:
    """The peer figures of speed_peer.py's JSON, per arch."""
    out: dict[str, PeerArch] = {}
    for arch, by_core in ((peer or {}).get("peer") or {}).items():
        sides = {}
        for side in _PEER_SIDES:
            per_core = [runs.get(side, []) for runs in by_core.values()]
            n = min(map(len, per_core)) if per_core else 0
            sides[side] = [{k: sum(r[i].get(k, 0) for r in per_core) for k in _PEER_SUMMED} for i in range(n)]
        out[arch] = PeerArch(arch, sides, {c: v for c, v in (peer or {}).get("validation", {}).items() if c in by_core},
                             {c: v for c, v in (peer or {}).get("left_out", {}).items() if c in by_core})
    return out


def _single_goals(arch: str, corpus: list[dict[str, Any]], p: PeerArch | None) -> list[Goal]:
    """The single-task targets of ``arch``: warm and fresh Session, per frame."""
    fresh, warm = _per(corpus, "fresh"), _per(corpus, "warm")
    name = f"single-task warm, {arch}"
    goal = f"≤ {_num(TARGET_WARM_US)} µs/frame (CPU), Session.replay, call-site check on"
    if warm is None:
        return [Goal(name, goal, "not measured", "–", "not measured: speed_peer.json has no corpus run")]
    if p is not None and p.frame("drgn equal"):
        ours, drgn = p.frame("ours"), p.frame("drgn equal")
        vs = (f"{_times(ours, drgn)} drgn's time per frame (same {p.first('ours', 'k_tasks')} tasks: ours "
              f"{_num(ours or 0)}, drgn {_num(drgn or 0)} µs)")
    else:
        vs = "no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured"
    goals = [Goal(name, goal, f"{_pair(warm, _per(corpus, 'warm_wall'))} ({corpus[0]['tasks']:,} tasks, "
                  f"{corpus[0]['frames']:,} frames)", f"{_num(warm / TARGET_WARM_US)}× the budget",
                  _verdict(warm <= TARGET_WARM_US, warm / TARGET_WARM_US), vs)]
    if fresh is not None:
        extra = fresh - warm
        goals.append(Goal(f"single-task fresh Session, {arch}", f"≤ warm + {_num(TARGET_FRESH_EXTRA_US)} µs/frame",
                          f"{_pair(fresh, _per(corpus, 'fresh_wall'))}: warm + {_num(extra)} µs",
                          f"{_num(extra / TARGET_FRESH_EXTRA_US)}× the allowance",
                          _verdict(extra <= TARGET_FRESH_EXTRA_US, extra / TARGET_FRESH_EXTRA_US),
                          "– (a drgn Program keeps nothing per task to start afresh: see the warm row)"))
    return goals


def _batch_goal(arch: str, batch: dict[str, Any] | None) -> Goal:
    """The batch target of ``arch``: frames per CPU second including set-up."""
    target = TARGET_BATCH_FRAMES[arch]
    name, goal = f"batch replay, {arch}", f"≥ {_num(target / 1e6)} M frames/s (CPU) including set-up"
    b = (batch or {}).get("ours", {}).get(arch, [])
    if not b:
        return Goal(name, goal, "not measured", "–", "not measured: no batch_replay.json run")
    rate = _median(r["batched_frames"] / r["fresh"] for r in b if r.get("fresh"))
    warm_rate = _median(r["batched_frames"] / r["warm"] for r in b if r.get("warm"))
    share = b[0]["batched_tasks"] / b[0]["tasks"] if b[0]["tasks"] else 0
    peer = (batch or {}).get("peer", {})
    mine, drgn = peer.get(f"{arch} ours", []), peer.get(f"{arch} drgn", [])
    vs = "no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured"
    if mine and drgn:
        ours_rate = _per(mine, "batched_frames", "warm", 1.0)
        drgn_rate = _per(drgn, "k_frames", "k_warm", 1.0)
        vs = (f"{_times(ours_rate, drgn_rate)} drgn's frames/s (the vmcores' tasks, warm: "
              f"{_rate(ours_rate or 0)} against {_rate(drgn_rate or 0)})")
    return Goal(name, goal, f"{_rate(rate).replace('/s', ' frames/s')} fresh (sessions just opened), "
                f"{_rate(warm_rate).replace('/s', ' frames/s')} warm; {share:.0%} of {b[0]['tasks']:,} tasks "
                "in lockstep", f"{_num(rate / target)}× the target", _verdict(rate >= target, target / rate), vs)


def _startup_goals(start: dict[str, Any] | None) -> list[Goal]:
    """The start-up target per arch: a warm ``unwind replay DUMP``, wall."""
    goals = []
    drgn_load = {c["arch"]: c for c in (start or {}).get("commands", [])
                 if str(c.get("name", "")).startswith("drgn load") and "wall_ms" in c}
    for c in (start or {}).get("commands", []):
        if c.get("name") != "unwind replay DUMP" or "wall_ms" not in c:
            continue
        arch, wall, cpu = c["arch"], c["wall_ms"], c["cpu_ms"]
        peer_c = drgn_load.get(arch)
        vs = (f"{_num(wall / peer_c['wall_ms'])}× drgn's wall ({_num(peer_c['wall_ms'])} ms wall / "
              f"{_num(peer_c['cpu_ms'])} ms CPU to import drgn and load the same stop + image)") if peer_c else \
            ("no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured")
        met = wall <= TARGET_STARTUP_MS and (peer_c is None or wall <= peer_c["wall_ms"])
        goals.append(Goal(f"warm `unwind replay DUMP`, {arch}", f"≤ {_num(TARGET_STARTUP_MS)} ms wall and ≤ drgn's load",
                          f"{_num(wall)} ms wall / {_num(cpu)} ms CPU", f"{_num(wall / TARGET_STARTUP_MS)}× the budget",
                          _verdict(met, max(wall / TARGET_STARTUP_MS, wall / peer_c["wall_ms"] if peer_c else 0)), vs))
    return goals


def speed_goals(folder: Path) -> list[Goal]:
    """Every issue-14 target with its measured value, from the scripts' JSON in ``folder``."""
    peer, batch, start = (_load_json(folder / n) for n in ("speed_peer.json", "batch_replay.json", "startup.json"))
    if peer is None and batch is None and start is None:
        return []
    runs = (peer or {}).get("runs", {})
    archs = peer_archs(peer)
    goals: list[Goal] = []
    for arch in ARCH_ORDER:
        goals += _single_goals(arch, runs.get(f"{arch} corpus", []), archs.get(arch))
    goals += [_batch_goal(arch, batch) for arch in ARCH_ORDER]
    return goals + _startup_goals(start)


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _peer_lines(archs: dict[str, PeerArch], rounds: Any, corpus: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The per-frame and per-task comparison with drgn, its validation and a few traces."""
    L = ["", "### Against drgn, same tasks of the same vmcores", ""]
    L.append(f"`benches/speed_peer.py`, rounds: {rounds}. drgn 0.3.0 `stack_trace` **on equal inputs**: its only "
             "kernel file is the same slim image ours reads (ELF symbols, ORC on x86-64, no CFI, no DWARF), so "
             "it unwinds by ORC on x86-64 and by frame pointers on arm64 and looks nothing up per frame; the few "
             "task layouts `stack_trace` reads are copied in from the debug vmlinux by a type finder "
             "(`benches/benchkit.py` `DRGN_CHILD`). **drgn with DWARF**: the full debug vmlinux, as a user runs "
             "it: DWARF CFI, and every frame's inline scopes looked up in `.debug_info`, which is where its "
             "time goes (with the CFI removed but `.debug_info` kept it costs the same). Ours: "
             "`Session.replay(task, Options(), symbolize=False)` with the committed slim image. Every side in "
             "fresh child processes interleaved round by round, warm (one untimed walk first), fastest of the "
             "passes per child, median over rounds.")
    L.append("")
    L.append("Frames are counted alike on both sides: real frames (not drgn's inline ones) before the first pc "
             "outside the kernel half of the address space. drgn walks on into the user frames of a task that "
             "entered from user space (on x86-64 through whatever the user stack holds, up to its 1,024-frame "
             "limit), and that time is inside its `stack_trace`: so the per-frame figures are over the "
             "**kernel-only tasks** (no side walked a user frame of them), the per-task figures over **every "
             "task**, user frames included. The tasks are those drgn walks in both modes within 64 kernel "
             "frames (drgn's DWARF unwinder loops on some arm64 stacks).")
    L.append("")
    rows = []
    for arch in (a for a in ARCH_ORDER if a in archs):
        p = archs[arch]
        rows.append((arch, f"{p.first('ours', 'k_tasks')} of {p.first('ours', 'tasks')}",
                     f"{p.first('ours', 'k_frames')} / {p.first('drgn equal', 'k_frames')}",
                     _pair(p.frame("ours"), p.frame("ours", True)),
                     _pair(p.frame("drgn equal"), p.frame("drgn equal", True)),
                     _pair(p.frame("drgn dwarf"), p.frame("drgn dwarf", True)),
                     _times(p.frame("drgn equal"), p.frame("ours")), _times(p.frame("drgn dwarf"), p.frame("ours")),
                     _pair(_per(corpus.get(f"{arch} corpus", []), "warm"), _per(corpus.get(f"{arch} corpus", []),
                                                                                  "warm_wall"))))
    L.append("Per kernel frame, kernel-only tasks (the last column: ours warm on the committed dumps, as in the "
             "targets, for how much reading a vmcore adds to ours):")
    L.append("")
    L += _table(("arch", "tasks", "frames ours / drgn", "ours", "drgn, equal inputs (ORC / FP)",
                 "drgn, DWARF (full vmlinux)", "drgn equal ÷ ours", "drgn DWARF ÷ ours", "ours on the dumps"), rows)
    rows = []
    for arch in (a for a in ARCH_ORDER if a in archs):
        p = archs[arch]
        rows.append((arch, str(p.first("ours", "tasks")),
                     f"{p.first('ours', 'frames')} / {p.first('drgn equal', 'frames')} + "
                     f"{p.first('drgn equal', 'user_frames'):,} user",
                     *(f"{_num(v)} µs" if v else "–" for v in (p.task("ours"), p.task("drgn equal"), p.task("drgn dwarf"))),
                     _times(p.task("drgn equal"), p.task("ours")), _times(p.task("drgn dwarf"), p.task("ours"))))
    L += ["", "Per task (CPU), every task:", ""]
    L += _table(("arch", "tasks", "kernel frames ours / drgn (+ drgn's user frames)", "ours", "drgn, equal inputs",
                 "drgn, DWARF", "drgn equal ÷ ours", "drgn DWARF ÷ ours"), rows)
    L += ["", "Validation: the kernel pcs of each task, ours against drgn's (first round):", ""]
    for arch in (a for a in ARCH_ORDER if a in archs):
        for core, c in archs[arch].checks.items():
            L.append(f"- `{core}`: the same pcs as drgn on equal inputs on {c['drgn equal']['same']} of "
                     f"{c['drgn equal']['compared']} tasks, as drgn with DWARF on {c['drgn dwarf']['same']} of "
                     f"{c['drgn dwarf']['compared']}; left out: {_left_out(archs[arch].left_out.get(core))}")
    for arch in (a for a in ARCH_ORDER if a in archs):
        for core, c in archs[arch].checks.items():
            shown = c.get("samples", [])[:1] + c["drgn equal"].get("differ", [])[:1]
            for s in shown:
                L += ["", f"`{core}` task {s['task']} (pid, cpu when running): ours | drgn on equal inputs", "", "```"]
                for i in range(max(len(s["ours"]), len(s["drgn"]))):
                    L.append(f"{s['ours'][i] if i < len(s['ours']) else '':<50} "
                             f"{s['drgn'][i] if i < len(s['drgn']) else ''}".rstrip())
                L.append("```")
    return L


def _left_out(why: Any) -> str:
    if isinstance(why, dict):
        parts = [f"{n} ({k})" for k, n in why.items() if n]
        return ", ".join(parts) or "none"
    return str(why or "none")


def speed_lines(folder: Path) -> list[str]:
    """The issue-14 headline: targets and the drgn comparison, from the scripts' JSON in ``folder``."""
    goals = speed_goals(folder)
    if not goals:
        return []
    peer, start, prof = (_load_json(folder / n) for n in ("speed_peer.json", "startup.json", "profile.json"))
    L = ["## Issue 14: speed against drgn on equal inputs", ""]
    L.append("Measured by `benches/speed_peer.py`, `benches/batch_replay.py` and `benches/startup.py` (their "
             "JSON beside this report), each in fresh child processes interleaved round by round, so load "
             "from other processes falls on every side alike; medians over rounds. CPU time is the "
             "figure to read on this shared machine; wall time is given beside it. The drgn column is "
             "measured on the same tasks of the same vmcores, in the same run (below).")
    L.append("")
    L += _table(("target", "goal", "measured", "ratio to the goal", "against drgn (equal inputs)", "verdict"),
                ((g.name, g.goal, g.measured, g.ratio, g.drgn, g.verdict) for g in goals))
    archs = peer_archs(peer)
    if archs:
        L += _peer_lines(archs, (peer or {}).get("rounds"), (peer or {}).get("runs", {}))
    if start:
        L += ["", "### Start-up", ""]
        L.append(f"`benches/startup.py`, rounds: {start.get('rounds')}; every command a fresh process with warm "
                 "caches; median ms, wall / CPU (user + system of the child). 1-minute load "
                 f"{_num(start['load'][0], 2)} → {_num(start['load'][1], 2)} on {start.get('cores')} cores.")
        L.append("")
        L += _table(("arch", "command", "wall ms", "CPU ms"),
                    ((c["arch"], c["name"], _num(c["wall_ms"]) if "wall_ms" in c else "failed",
                      _num(c["cpu_ms"]) if "cpu_ms" in c else str(c.get("failed")))
                     for c in start.get("commands", [])))
    if prof:
        L += profile_lines(prof)
    L.append("")
    return L


def profile_lines(prof: dict[str, Any]) -> list[str]:
    """Where a warm single-task replay spends its time, per arch (benches/profile_replay.py's JSON)."""
    L = ["", "### Where the time goes: a warm single-task replay, profiled", ""]
    L.append(f"`benches/profile_replay.py`: cProfile of one warm pass of `Session.replay(task, Options(), "
             f"symbolize=False)` over every corpus task of the arch (after {prof.get('warm_passes', 1)} untimed "
             "pass), the functions with the largest cumulative time, as shares of the pass (cProfile's own "
             "overhead inflates calls that are many and short).")
    for arch in (a for a in ARCH_ORDER if a in prof.get("arches", {})):
        p = prof["arches"][arch]
        L += ["", f"{arch}: {p['tasks']:,} tasks, {p['frames']:,} frames, {_num(p['total'] * 1e3)} ms profiled "
              f"({_num(p['total'] / p['frames'] * 1e6)} µs/frame under the profiler)", ""]
        L += _table(("function", "calls", "calls/frame", "cumulative", "own"),
                    ((f"`{r['function']}`", f"{r['calls']:,}", _num(r['calls'] / p['frames'], 2),
                      f"{r['cumulative'] / p['total']:.0%}", f"{r['own'] / p['total']:.0%}") for r in p["top"]))
        if p.get("top_own"):
            L += ["", "Most time of their own: " + "; ".join(f"`{r['function']}` {r['own'] / p['total']:.0%}"
                                                         for r in p["top_own"]) + "."]
    return L


def run_speed_scripts(benches: Path, out: Path, drgn_python: str | None, rounds: int) -> None:
    """Run the issue-14 scripts of ``benches/`` (those present), each writing its JSON into ``out``."""
    for script, name in SPEED_SCRIPTS:
        path = benches / script
        if not path.is_file():
            print(f"unwind bench: {script} not found: its rows are not measured", file=sys.stderr)
            continue
        cmd = [sys.executable, str(path), "--json", str((out / name).resolve())]
        if script != "profile_replay.py":  # a profile is one pass, and drgn is not profiled
            cmd += ["--rounds", str(rounds)] + (["--drgn-python", drgn_python] if drgn_python else [])
        print(f"unwind bench: {' '.join(cmd)}", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=benches, stdout=sys.stderr)


# --- plots ------------------------------------------------------------------------------------

def _axes(ax: Any, xlabel: str, ylabel: str, title: str, xlog: bool = False, ylog: bool = False) -> None:
    """Label one plot's axes (log2 x, log10 y when asked) and draw its legend."""
    if xlog:
        ax.set_xscale("log", base=2)
    if ylog:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def _plot_per_arch(plt: Any, r: Results) -> Any:
    """Replay per frame per arch and mode, and the walk's breakdown."""
    reps = replay_figures(r)
    if not reps:
        return None
    arches = [a for a in ARCH_ORDER if a in reps]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    width = 0.8 / len(REPLAY_MODES)
    for i, mode in enumerate(REPLAY_MODES):
        xs = [j + (i - (len(REPLAY_MODES) - 1) / 2) * width for j in range(len(arches))]
        ys = [reps[a].modes.get(mode, 0.0) * 1e6 for a in arches]
        bars = ax.bar(xs, ys, width, label=mode)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.axhline(TARGET_US_PER_FRAME, color="red", linestyle="--", label=f"target {TARGET_US_PER_FRAME:g} µs")
    ax.set_xticks(range(len(arches)), arches)
    ax.set_ylabel(f"µs per frame ({r.stat})")
    ax.set_title("Replay per frame on the real corpora")
    ax.legend(fontsize=8)
    bottoms = [0.0] * len(arches)
    for part in ("setup", "lookup", "reads", "recovery"):
        ys = [((getattr(reps[a], part) or 0.0) * 1e6) for a in arches]
        bx.bar(range(len(arches)), ys, 0.5, bottom=bottoms, label=part)
        bottoms = [b + y for b, y in zip(bottoms, ys)]
    walks = [reps[a].modes.get("walk", 0.0) * 1e6 for a in arches]
    bx.hlines(walks, [j - 0.3 for j in range(len(arches))], [j + 0.3 for j in range(len(arches))],
              colors="black", linewidth=2, zorder=3, label="walk as measured")
    bx.axhline(TARGET_US_PER_FRAME, color="red", linestyle="--")
    bx.set_ylim(0, max(max(bottoms), max(walks)) * 1.12)
    bx.set_xticks(range(len(arches)), arches)
    bx.set_ylabel("µs per frame")
    bx.set_title("walk = setup + lookup + stack reads + recovery")
    bx.legend(fontsize=8)
    return fig


def _plot_batch(plt: Any, r: Results) -> Any:
    """ORC batch lookup throughput against batch size."""
    batch = batch_figures(r)
    if not batch:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.4))
    ax.plot([b for b, _ in batch], [v / 1e6 for _, v in batch], "o-", label="orc_find_batch")
    orc = orc_figures(r)
    if orc.c_floor is not None:
        ax.axhline(orc.c_floor / 1e6, color="gray", linestyle=":", label="plain binary search in C (1 M ips)")
    ax.axhline(TARGET_BATCH_RATE / 1e6, color="red", linestyle="--", label="target 30 M/s")
    _axes(ax, "ips per call (batch size)", "million lookups per second (log)",
          "ORC batch lookup throughput against batch size", xlog=True, ylog=True)
    return fig


def _plot_depth(plt: Any, r: Results) -> Any:
    """Walk cost and per-frame cost against depth."""
    depth = depth_figures(r)
    if not depth:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    for arch in (a for a in ARCH_ORDER if a in depth):
        pts = depth[arch]
        ax.plot([d for d, _ in pts], [t * 1e3 for _, t in pts], "o-", label=arch)
        bx.plot([d for d, _ in pts], [t / d * 1e6 for d, t in pts], "o-", label=arch)
    _axes(ax, "frames (depth)", "ms per walk", "Walk cost against depth (log-log: slope 1 = linear)",
          xlog=True, ylog=True)
    bx.set_xscale("log", base=2)
    bx.set_xlabel("frames (depth)")
    bx.set_ylabel("µs per frame")
    bx.set_ylim(bottom=0)
    bx.set_title("Per-frame cost against depth (flat = linear walk)")
    bx.legend(fontsize=8)
    return fig


def _plot_table_size(plt: Any, r: Results) -> Any:
    """ORC lookup cost against table size."""
    tables = table_figures(r)
    if not tables:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for how, pts in sorted(tables.items()):
        ax.plot([n for n, _ in pts], [t * 1e9 for _, t in pts], "o-", label=how)
    _axes(ax, "ORC entries (subsampled real table)", "ns per lookup", "Lookup cost against table size",
          xlog=True, ylog=True)
    return fig


def _plot_peer(plt: Any, r: Results) -> Any:
    """Per-frame cost against drgn on the same tasks."""
    peers = {a: p for a, p in peer_figures(r).items() if "unwind" in p and "drgn" in p}
    if not peers:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.4))
    arches = sorted(peers)
    for i, tool in enumerate(("unwind", "drgn")):
        xs = [j + (i - 0.5) * 0.35 for j in range(len(arches))]
        bars = ax.bar(xs, [peers[a][tool] * 1e6 for a in arches], 0.35, label=tool)
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(arches)), arches)
    ax.set_ylabel("µs per frame (log)")
    ax.set_title("Per-frame cost: unwind against drgn stack_trace, same tasks")
    ax.legend(fontsize=8)
    return fig


#: each plot file, what draws it (``None`` without data), and why it is missing then
PLOTS: tuple[tuple[str, Any, Any], ...] = (
    ("per_arch.png", _plot_per_arch, lambda r: "no replay results (no committed corpus or backend)"),
    ("batch.png", _plot_batch, lambda r: "no batch-size results"),
    ("depth.png", _plot_depth, lambda r: "no depth results"),
    ("table_size.png", _plot_table_size, lambda r: "no table-size results"),
    ("peer.png", _plot_peer, lambda r: "; ".join(r.skips("test_peer")) or "no peer results"),
)


def write_plots(r: Results, out: Path) -> dict[str, str]:
    """Write the PNGs that have data; returns ``{file: why not}`` for those not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    missing: dict[str, str] = {}
    for name, draw, why_not in PLOTS:
        fig = draw(plt, r)
        if fig is None:
            missing[name] = why_not(r)
            continue
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    return missing


# --- the report -------------------------------------------------------------------------------

def report_lines(r: Results, plots: dict[str, str] | None, source: str,
                 speed_folder: Path | None = None) -> list[str]:
    """The Markdown report. ``plots`` maps plot files not drawn to why (``None``: no matplotlib);
    ``speed_folder`` holds the issue-14 scripts' JSON (:func:`speed_lines`), shown first."""
    L: list[str] = ["# unwind benchmark report", ""]
    L.append(f"- **Machine**: {machine_text(r)}")
    when = f" on {r.datetime}" if r.datetime else ""
    L.append(f"- **Run**: {source}{when}" + (f", commit {r.commit}" if r.commit else ""))
    if r.quick:
        L.append("- **Quick mode** (`UNWIND_BENCH_QUICK=1`): tiny inputs; the figures only show the "
                 "pipeline works, they are not measurements to quote.")
    reps = replay_figures(r)
    corpora = sorted({f"{a.corpus} ({len(a.dumps)} dump{'s' * (len(a.dumps) != 1)}, {a.tasks:,} tasks, "
                      f"{a.frames:,} frames)" for a in reps.values()})
    L.append("- **Corpus**: " + ("; ".join(corpora) if corpora else "none measured"))
    tables = {str(b.extra.get("table")) for b in r.of("batch_size") + r.of("table_size") if b.extra.get("table")}
    if tables:
        L.append("- **ORC table**: " + "; ".join(sorted(tables)))
    peers = {str(b.extra.get("pair")) for b in r.of("peer")}
    if peers:
        L.append("- **Peer pair**: " + "; ".join(sorted(peers)))
    L.append(f"- Every figure is the {r.stat} of the benchmark's rounds, timed with `{r.timer}`"
             + (" (CPU time of the bench process: what other processes take of the cores is not counted)"
                if "process_time" in r.timer else " (wall clock)") + ".")
    if r.load:
        cores = (r.machine.get("unwind") or {}).get("cores") or 0
        busy = any(v > 1 + 0.25 * cores for v in r.load.values()) if cores else False  # the suite itself is ~1
        L.append(f"- **Load** (1-minute average): {_num(r.load.get('start', 0), 2)} at the start, "
                 f"{_num(r.load.get('end', 0), 2)} at the end"
                 + (f": other processes were competing for the {cores} cores, so the times are inflated "
                    "and noisy (`--cpu-time` and `--stat min` are less disturbed)" if busy else ""))
    speed = speed_lines(speed_folder) if speed_folder is not None else []
    L += ["", *speed]
    L += ["", "## Earlier targets (replay, ORC lookup, drgn with DWARF)" if speed else "## Targets", ""]
    L += _table(("target", "goal", "measured", "ratio", "verdict"),
                ((t.name, t.goal, t.measured, t.ratio, t.verdict) for t in targets(r)))

    def plot(name: str, caption: str) -> None:
        if plots is None:
            L.append(f"_({name}: matplotlib is not installed; `pip install '.[report]'` draws it)_")
        elif name in plots:
            L.append(f"_({name} not drawn: {plots[name]})_")
        else:
            L.append(f"![{caption}]({name})")
        L.append("")

    L += ["", "## Replay per frame", ""]
    if reps:
        rows = []
        for arch in (a for a in ARCH_ORDER if a in reps):
            a = reps[arch]
            walk = a.modes.get("walk")
            cells = [arch, f"{a.tasks:,} / {a.frames:,}",
                     _us(walk * a.frames / a.tasks) if walk and a.tasks else "–"]
            for m in REPLAY_MODES:
                per = a.modes.get(m)
                cells.append(f"{_num(per * 1e6)} µs ({_rate(1 / per)})" if per else "–")
            rows.append(cells)
        L += _table(("arch", "tasks / frames", "walk per task",
                     *(f"{m}: µs/frame (frames/s)" for m in REPLAY_MODES)), rows)
        L += ["", "A task's walk also pays a fixed cost (the unwinder and its state set up once per task); with few "
              "frames per task it weighs on the per-frame figure, which divides the whole time by the frames."]
        L += ["", "Breakdown of `walk` (µs per frame): each task's set-up and first frame, the lookups and the "
              "reads, each timed alone over the same inputs; recovery (the unwinder's own logic per step) is the "
              "rest. Set-up includes the first frame's reads, so those count twice.", ""]
        rows = []
        for arch in (a for a in ARCH_ORDER if a in reps):
            a = reps[arch]
            f = (lambda v: _num(v * 1e6) if v is not None else "–")
            rows.append([arch, f(a.modes.get("walk")), f(a.setup),
                         f(a.lookup) if a.lookup is not None else "none (frame records)",
                         f(a.reads), f(a.recovery), f(a.symbols)])
        L += _table(("arch", "walk", "set-up", "lookup", "stack reads", "recovery", "symbolisation (alone)"), rows)
    else:
        L.append("Not measured.")
    for arch in ARCH_ORDER:
        for why in r.skips(f"test_replay[{arch}"):
            L.append(f"- {arch}: skipped: {why}")
    L.append("")
    plot("per_arch.png", "µs per frame per arch")

    L += ["## ORC lookup", ""]
    batch = batch_figures(r)
    if batch:
        L += _table(("batch size", "orc_find_batch"), ((f"{n:,}", _rate(v)) for n, v in batch))
    else:
        L.append("Batch-size sweep not measured: " + ("; ".join(r.skips("test_batch_size")) or "not run"))
    orc = orc_figures(r)
    if orc.rates:
        L += ["", f"`benches/bench_orc.py`, the same uniform text ips ({orc.batch_lookups:,} per batch round; "
              "the Python loops take a prefix of them)" + (f", {orc.table}" if orc.table else "") + ":", ""]
        rows = []
        for method, rate in sorted(orc.rates.items(), key=lambda kv: -kv[1]):
            rows.append([f"`{method}`", _rate(rate), f"{_num(1e9 / rate)} ns",
                         f"{_num(rate / orc.c_floor)}×" if orc.c_floor else "–",
                         f"{_num(rate / orc.rates['bisect'])}×" if "bisect" in orc.rates else "–"])
        L += _table(("method", "lookups/s", "per lookup", "vs C bsearch", "vs bisect"), rows)
    else:
        why = "; ".join(r.skips("test_orc_lookup")) or "not in this run"
        L.append(f"\n`benches/bench_orc.py` (orc_find, orc_find_batch, searchsorted, bisect, C bsearch): {why}.")
    L.append("")
    plot("batch.png", "lookup throughput against batch size")

    L += ["## Scaling", "", "### Walk cost against depth", ""]
    depth = depth_figures(r)
    if depth:
        rows = []
        for arch in (a for a in ARCH_ORDER if a in depth):
            pts = depth[arch]
            fit = fit_line([d for d, _ in pts], [t for _, t in pts])
            rows.append([arch, ", ".join(f"{d}: {_num(t / d * 1e6)}" for d, t in pts),
                         f"{_num(fit.slope * 1e6)} µs/frame {'−' if fit.intercept < 0 else '+'} "
                         f"{_num(abs(fit.intercept) * 1e6)} µs" if fit else "–",
                         depth_growth(pts)])
        L += _table(("arch", "µs per frame at depth", "least squares: time on depth", "growth"), rows)
    else:
        L.append("Not measured.")
    for arch in ARCH_ORDER:
        for why in r.skips(f"test_depth[{arch}"):
            L.append(f"- {arch}: skipped: {why}")
    L.append("")
    plot("depth.png", "walk cost against depth")

    L += ["### Lookup cost against table size", ""]
    tables_f = table_figures(r)
    if tables_f:
        rows = []
        for how, pts in sorted(tables_f.items()):
            rows.append([how, ", ".join(f"{n:,}: {_num(t * 1e9)}" for n, t in pts), table_growth(pts)])
        L += _table(("lookup", "ns per lookup at entries", "growth with the table"), rows)
        L += ["", "A plain binary search (`bisect`, `searchsorted`) pays a constant per doubling of the table: "
              "logarithmic. `orc_find` first narrows to the 256-byte text block (`.orc_lookup`), so it searches "
              "only the entries of one block; `orc_find_batch` resolves an ip by a population count in its "
              "32-byte sub-block, independent of table size."]
    else:
        L.append("Not measured: " + ("; ".join(r.skips("test_table_size")) or "not run"))
    L.append("")
    plot("table_size.png", "lookup cost against table size")

    L += ["## Peer: drgn", ""]
    pf = peer_figures(r)
    if pf:
        rows = []
        for arch, p in sorted(pf.items()):
            b = {x.extra["tool"]: x for x in r.of("peer", arch=arch)}
            ratio = p["drgn"] / p["unwind"] if "drgn" in p and "unwind" in p else None
            per_task = b["drgn"].seconds / b["unwind"].seconds if ratio else None
            cell = (lambda tool: f"{_us(p[tool])} ({b[tool].extra['frames']:,} frames)" if tool in p else "–")
            rows.append([arch, str(b[next(iter(b))].extra.get("tasks", "?")), cell("unwind"), cell("drgn"),
                         f"{_num(ratio)}×" if ratio else "–", f"{_num(per_task)}×" if per_task else "–"])
        L += _table(("arch", "tasks", "unwind per frame", "drgn per frame", "drgn / unwind per frame",
                     "drgn / unwind per task"), rows)
        L += ["", "Each side divides its time by the frames it walked (drgn's inlined-call frames not counted; "
              "drgn also walks on into user frames). drgn reads DWARF CFI, falling back to ORC."]
    else:
        L.append("Not measured: " + ("; ".join(r.skips("test_peer")) or "not run"))
    L.append("")
    plot("peer.png", "per-frame cost against drgn")

    if r.failed:
        L += ["## Failed", "", "These benches raised: their figures are missing above.", ""]
        L += [f"- `{f['bench']}`: {f['reason']}" for f in r.failed]
        L.append("")
    if r.skipped:
        L += ["## Skipped", ""]
        seen: dict[str, int] = {}
        for s in r.skipped:
            seen[s["reason"]] = seen.get(s["reason"], 0) + 1
        L += [f"- {n} bench{'es' if n > 1 else ''}: {why}" for why, n in seen.items()]
        L.append("")
    return L


def write_report(r: Results, out: Path, source: str) -> Path:
    """Write ``out/report.md`` and its plots; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        plots = None
    else:
        plots = write_plots(r, out)
    path = out / "report.md"
    path.write_text("\n".join(report_lines(r, plots, source, out)) + "\n")
    return path


def find_benches(explicit: str | None) -> Path:
    """The ``benches/`` folder: ``--benches``, else ``./benches``, else the one beside the package."""
    here = Path(__file__).resolve().parent.parent / "benches"
    cands = [Path(explicit)] if explicit else [Path.cwd() / "benches", here]
    for c in cands:
        if (c / "benchkit.py").is_file():
            return c
    raise BenchError("no benches/ folder found (run from the source tree, or give --benches DIR; "
                     "--from-json F reports a saved run)")


def run_suite(benches: Path, json_out: Path, quick: bool, select: str | None, cpu_time: bool) -> int:
    """Run ``pytest benches/`` writing ``json_out``; pytest's progress goes to stderr. Its exit status.

    ``cpu_time`` times with ``time.process_time`` instead of the wall clock.
    """
    try:
        import pytest_benchmark  # noqa: F401
    except ImportError:
        raise BenchError("running the suite needs pytest-benchmark: pip install '.[report]'") from None
    benches = benches.resolve()
    cmd = [sys.executable, "-m", "pytest", str(benches), "-p", "no:cacheprovider", "-v", "-rs",
           f"--benchmark-json={json_out.resolve()}", "--benchmark-columns=median,rounds"]
    if select:
        cmd += ["-k", select]
    if cpu_time:
        cmd.append("--benchmark-timer=time.process_time")
    env = dict(os.environ)
    if quick:
        env["UNWIND_BENCH_QUICK"] = "1"
    print(f"unwind bench: {' '.join(cmd)}", file=sys.stderr, flush=True)
    # run inside benches/: from the source tree's root, its unwind/ folder would shadow an installed package
    return subprocess.run(cmd, cwd=benches, stdout=sys.stderr, env=env).returncode


def cmd_bench(args: argparse.Namespace) -> int:
    """``unwind bench``: run (or read) the benchmarks and write the report."""
    try:
        return _bench(args)
    except BenchError as e:
        print(f"unwind: error: {e}", file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace) -> int:
    out = Path(args.report)
    status = 0
    if args.from_json:
        results = load_results(args.from_json, args.stat)
        source = f"saved results {args.from_json}"
    else:
        out.mkdir(parents=True, exist_ok=True)
        json_out = out / "benchmark.json"
        benches = find_benches(args.benches)
        status = run_suite(benches, json_out, args.quick, args.select, args.cpu_time)
        if args.speed:
            run_speed_scripts(benches, out, args.drgn_python, args.speed_rounds)
        if not json_out.exists():
            raise BenchError(f"the suite wrote no results (pytest exit status {status})")
        results = load_results(json_out, args.stat)
        flags = "".join(f" {f}" for f, on in (("--quick", args.quick), ("--cpu-time", args.cpu_time),
                                               ("--speed", args.speed)) if on)
        if args.speed:
            flags += f" --speed-rounds {args.speed_rounds}" + (" --drgn-python PY" if args.drgn_python else "")
        source = f"`unwind bench --report {args.report}{flags}`"
    path = write_report(results, out, source)
    print(f"unwind bench: wrote {path}", file=sys.stderr)
    for t in speed_goals(out) + targets(results):
        print(f"  {t.name}: {t.measured} [{t.ratio}] {t.verdict}", file=sys.stderr)
    return 1 if status not in (0, 5) else 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``bench`` to the top-level parser."""
    b = sub.add_parser("bench", help="run the latency benchmarks and write the report with plots")
    b.add_argument("--report", required=True, metavar="OUT", help="folder for report.md, the PNGs and the JSON")
    b.add_argument("--from-json", metavar="F", help="report a saved pytest-benchmark JSON instead of running")
    b.add_argument("--benches", metavar="DIR", help="the benches/ folder (default: ./benches or the source tree's)")
    b.add_argument("--quick", action="store_true", help="tiny inputs (checks the pipeline; not for quoting)")
    b.add_argument("--cpu-time", action="store_true",
                   help="time with the CPU time of the bench process (a machine shared with busy processes)")
    b.add_argument("--stat", choices=STATS, default="median",
                   help="statistic of each bench's rounds (default median)")
    b.add_argument("-k", dest="select", metavar="EXPR", help="only the benches pytest -k EXPR selects")
    b.add_argument("--speed", action="store_true", help="also run the issue-14 scripts (speed_peer.py, "
                   "batch_replay.py, startup.py; their JSON goes into OUT and heads the report)")
    b.add_argument("--speed-rounds", type=int, default=3, metavar="N", help="rounds of each issue-14 script (default 3)")
    b.add_argument("--drgn-python", metavar="PY", help="a Python with drgn installed, for the issue-14 drgn rows")
    b.set_defaults(func=cmd_bench)
