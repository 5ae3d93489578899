"""The figures the report reads from the suite's benches (replay per arch and mode, depth and table
growth, batch sizes, drgn), and the targets they are held to (:func:`targets`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .results import ARCH_ORDER, REPLAY_MODES, Results, fmt_num, fmt_rate, fmt_us

#: replay per frame, symbolisation and provenance off, on each arch (µs)
TARGET_US_PER_FRAME = 3.0
#: batch ``orc_find`` over 1 M uniform random text ips (lookups per second)
TARGET_BATCH_RATE = 30e6
#: how much faster per frame than drgn on the same tasks
TARGET_PEER_RATIO = 100.0


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
        return f"flat ({fmt_num(fit.slope * 1e9)} ns per doubling over {span:.0f} doublings)"
    if fit.slope > 0 and fit.r2 >= 0.8:
        return f"logarithmic (+{fmt_num(fit.slope * 1e9)} ns per doubling, R² {fit.r2:.3f})"
    return f"unclear ({fmt_num(fit.slope * 1e9)} ns per doubling, R² {fit.r2:.3f}): a noisy run?"


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
    """One target of the suite with its measured value."""

    name: str
    goal: str
    measured: str
    ratio: str
    verdict: str
    #: the same figure against drgn's bare unwinder (from ``pt_regs``, same tasks, same run)
    drgn: str = ""


def verdict(met: bool, factor: float) -> str:
    """``met``, or by what factor the target is missed."""
    return "met" if met else f"MISSED by {fmt_num(factor)}×"


def targets(r: Results) -> list[Goal]:
    """Every target of the suite, measured or not."""
    out: list[Goal] = []
    reps = replay_figures(r)
    for arch in ARCH_ORDER:
        a = reps.get(arch)
        name = f"replay per frame, {arch}"
        goal = f"≤ {fmt_num(TARGET_US_PER_FRAME)} µs/frame (symbols, provenance off)"
        if a is None or "walk" not in a.modes:
            why = "; ".join(r.skips(f"test_replay[{arch}-walk]")) or "not run"
            out.append(Goal(name, goal, "not measured", "–", f"not measured: {why}"))
            continue
        us = a.modes["walk"] * 1e6
        ratio = us / TARGET_US_PER_FRAME
        beside = ", ".join(f"{m} {fmt_num(a.modes[m] * 1e6)} µs" for m in REPLAY_MODES[1:] if m in a.modes)
        pts = depth_figures(r).get(arch)
        fit = fit_line([d for d, _ in pts], [t for _, t in pts]) if pts else None
        if fit is not None:
            beside += f"; marginal cost on synthetic chains {fmt_num(fit.slope * 1e6)} µs/frame"
        out.append(Goal(name, goal, f"{fmt_num(us)} µs/frame ({beside})", f"{fmt_num(ratio)}× the budget",
                        verdict(us <= TARGET_US_PER_FRAME, ratio)))
    orc = orc_figures(r)
    batch = dict(batch_figures(r))
    rate = orc.batch if orc.batch is not None else batch.get(1 << 20)
    where = "bench_orc.py" if orc.batch is not None else "test_batch_size[1048576]"
    goal = f"≥ {fmt_num(TARGET_BATCH_RATE / 1e6)} M lookups/s (1 M uniform text ips, real table)"
    if rate is None:
        why = "; ".join(r.skips("test_orc_lookup[orc_find_batch]") + r.skips("test_batch_size")) or "not run"
        out.append(Goal("batch orc_find", goal, "not measured", "–", f"not measured: {why}"))
    else:
        other = batch.get(1 << 20) if orc.batch is not None else None
        if other is not None:
            where += f"; {fmt_rate(other)} in test_batch_size[1048576] of the same run"
        out.append(Goal("batch orc_find", goal, f"{fmt_rate(rate)} ({where})",
                        f"{fmt_num(rate / TARGET_BATCH_RATE)}× the target",
                        verdict(rate >= TARGET_BATCH_RATE, TARGET_BATCH_RATE / rate)))
    goal = "faster than the compiled plain binary search, same ips, same run"
    batch_rate = orc.rates.get("orc_find_batch")
    if batch_rate is None or orc.c_floor is None:
        why = "; ".join(r.skips("test_orc_lookup[c_bsearch]") + r.skips("test_orc_lookup[orc_find_batch]"))
        out.append(Goal("batch orc_find vs C floor", goal, "not measured", "–",
                        f"not measured: {why or 'bench_orc.py did not run'}"))
    else:
        ratio = batch_rate / orc.c_floor
        out.append(Goal("batch orc_find vs C floor", goal,
                        f"{fmt_rate(batch_rate)} vs C {fmt_rate(orc.c_floor)} ({orc.batch_lookups:,} ips)",
                        f"{fmt_num(ratio)}×", verdict(ratio > 1.0, 1.0 / ratio)))
    traced = orc_figures(r, "orc_lookup_traces")
    t_batch, t_c = traced.rates.get("orc_find_batch"), traced.c_floor
    if t_batch is not None:
        vs = f" vs C {fmt_rate(t_c)}" if t_c is not None else ""
        out.append(Goal("batch orc_find, ips from real traces",
                        f"≥ {fmt_num(TARGET_BATCH_RATE / 1e6)} M lookups/s and faster than C (1 M ips of real traces)",
                        f"{fmt_rate(t_batch)}{vs} ({traced.batch_lookups:,} ips)",
                        f"{fmt_num(t_batch / TARGET_BATCH_RATE)}× the 30 M/s target",
                        verdict(t_batch >= TARGET_BATCH_RATE and (t_c is None or t_batch > t_c),
                                 TARGET_BATCH_RATE / t_batch)))
    peers = peer_figures(r)
    for arch in ("x86_64", "arm64"):
        p = peers.get(arch, {})
        name = f"vs drgn per frame, {arch}"
        goal = f"≥ {fmt_num(TARGET_PEER_RATIO)}× faster than drgn stack_trace, same tasks"
        if "unwind" not in p or "drgn" not in p:
            why = "; ".join(r.skips(f"test_peer[{arch}")) or "not run"
            out.append(Goal(name, goal, "not measured", "–", f"not measured: {why}"))
            continue
        ratio = p["drgn"] / p["unwind"]
        out.append(Goal(name, goal, f"unwind {fmt_us(p['unwind'])}/frame, drgn {fmt_us(p['drgn'])}/frame",
                          f"{fmt_num(ratio)}× faster", verdict(ratio >= TARGET_PEER_RATIO, TARGET_PEER_RATIO / ratio)))
    return out
