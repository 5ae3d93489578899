"""The report's plots (matplotlib, the ``[report]`` extra): one function per plot, and
:func:`write_plots` that saves them or says why not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .figures import TARGET_BATCH_RATE, TARGET_US_PER_FRAME, batch_figures, depth_figures, orc_figures, peer_figures, \
    replay_figures, table_figures
from .results import ARCH_ORDER, REPLAY_MODES, Results

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
