"""The Markdown benchmark report (``report.md``) and its plots, written into a folder."""

from __future__ import annotations

from pathlib import Path

from .figures import batch_figures, depth_figures, depth_growth, fit_line, orc_figures, peer_figures, \
    replay_figures, table_figures, table_growth, targets
from .plots import write_plots
from .results import ARCH_ORDER, REPLAY_MODES, Results, fmt_num, fmt_rate, fmt_us, machine_text, md_table
from .speed import speed_lines

def report_lines(r: Results, plots: dict[str, str] | None, source: str,
                 speed_folder: Path | None = None) -> list[str]:
    """The Markdown report. ``plots`` maps plot files not drawn to why (``None``: no matplotlib);
    ``speed_folder`` holds the speed scripts' JSON (:func:`speed_lines`), shown first."""
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
        L.append(f"- **Load** (1-minute average): {fmt_num(r.load.get('start', 0), 2)} at the start, "
                 f"{fmt_num(r.load.get('end', 0), 2)} at the end"
                 + (f": other processes were competing for the {cores} cores, so the times are inflated "
                    "and noisy (`--cpu-time` and `--stat min` are less disturbed)" if busy else ""))
    speed = speed_lines(speed_folder) if speed_folder is not None else []
    L += ["", *speed]
    L += ["", "## Earlier targets (replay, ORC lookup, drgn with DWARF)" if speed else "## Targets", ""]
    L += md_table(("target", "goal", "measured", "ratio", "verdict"),
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
                     fmt_us(walk * a.frames / a.tasks) if walk and a.tasks else "–"]
            for m in REPLAY_MODES:
                per = a.modes.get(m)
                cells.append(f"{fmt_num(per * 1e6)} µs ({fmt_rate(1 / per)})" if per else "–")
            rows.append(cells)
        L += md_table(("arch", "tasks / frames", "walk per task",
                     *(f"{m}: µs/frame (frames/s)" for m in REPLAY_MODES)), rows)
        L += ["", "A task's walk also pays a fixed cost (the unwinder and its state set up once per task); with few "
              "frames per task it weighs on the per-frame figure, which divides the whole time by the frames."]
        L += ["", "Breakdown of `walk` (µs per frame): each task's set-up and first frame, the lookups and the "
              "reads, each timed alone over the same inputs; recovery (the unwinder's own logic per step) is the "
              "rest. Set-up includes the first frame's reads, so those count twice.", ""]
        rows = []
        for arch in (a for a in ARCH_ORDER if a in reps):
            a = reps[arch]
            f = (lambda v: fmt_num(v * 1e6) if v is not None else "–")
            rows.append([arch, f(a.modes.get("walk")), f(a.setup),
                         f(a.lookup) if a.lookup is not None else "none (frame records)",
                         f(a.reads), f(a.recovery), f(a.symbols)])
        L += md_table(("arch", "walk", "set-up", "lookup", "stack reads", "recovery", "symbolisation (alone)"), rows)
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
        L += md_table(("batch size", "orc_find_batch"), ((f"{n:,}", fmt_rate(v)) for n, v in batch))
    else:
        L.append("Batch-size sweep not measured: " + ("; ".join(r.skips("test_batch_size")) or "not run"))
    orc = orc_figures(r)
    if orc.rates:
        L += ["", f"`benches/bench_orc.py`, the same uniform text ips ({orc.batch_lookups:,} per batch round; "
              "the Python loops take a prefix of them)" + (f", {orc.table}" if orc.table else "") + ":", ""]
        rows = []
        for method, rate in sorted(orc.rates.items(), key=lambda kv: -kv[1]):
            rows.append([f"`{method}`", fmt_rate(rate), f"{fmt_num(1e9 / rate)} ns",
                         f"{fmt_num(rate / orc.c_floor)}×" if orc.c_floor else "–",
                         f"{fmt_num(rate / orc.rates['bisect'])}×" if "bisect" in orc.rates else "–"])
        L += md_table(("method", "lookups/s", "per lookup", "vs C bsearch", "vs bisect"), rows)
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
            rows.append([arch, ", ".join(f"{d}: {fmt_num(t / d * 1e6)}" for d, t in pts),
                         f"{fmt_num(fit.slope * 1e6)} µs/frame {'−' if fit.intercept < 0 else '+'} "
                         f"{fmt_num(abs(fit.intercept) * 1e6)} µs" if fit else "–",
                         depth_growth(pts)])
        L += md_table(("arch", "µs per frame at depth", "least squares: time on depth", "growth"), rows)
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
            rows.append([how, ", ".join(f"{n:,}: {fmt_num(t * 1e9)}" for n, t in pts), table_growth(pts)])
        L += md_table(("lookup", "ns per lookup at entries", "growth with the table"), rows)
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
            cell = (lambda tool: f"{fmt_us(p[tool])} ({b[tool].extra['frames']:,} frames)" if tool in p else "–")
            rows.append([arch, str(b[next(iter(b))].extra.get("tasks", "?")), cell("unwind"), cell("drgn"),
                         f"{fmt_num(ratio)}×" if ratio else "–", f"{fmt_num(per_task)}×" if per_task else "–"])
        L += md_table(("arch", "tasks", "unwind per frame", "drgn per frame", "drgn / unwind per frame",
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
