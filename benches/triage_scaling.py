"""Fleet-triage scaling: dumps/s and tasks/s on one core, all local cores, and a Dask LocalCluster.

The committed corpora are repeated to ``--dumps`` paths per round; every engine triages the same
paths, in rounds interleaved engine by engine so that load from other processes falls on all of
them alike. Prints a table and writes JSON::

    python benches/triage_scaling.py --dumps 5000 --rounds 2 --json out.json --markdown out.md

Figures: wall time per engine (what a fleet run waits for), CPU time of the one-core run (its
cost per dump), peak RSS per worker, the scaling ratio to the one-core run of the same round, and
Dask's own overhead per unit of work (a no-op mapped over as many units).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from unwind.cli.triage import CHUNK, bucket

ROOT = Path(__file__).resolve().parents[1]


def _paths(n: int) -> list[str]:
    base = sorted(str(p) for p in (ROOT / "corpora").glob("*/*/stop-*.bin.xz"))
    return [base[i % len(base)] for i in range(n)]


def _maxrss_self() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _noop(chunk: list[str]) -> int:
    return len(chunk)


def _run_dask(paths: list[str], workers: int) -> dict[str, Any]:
    import distributed
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        t0 = time.monotonic()
        t = bucket(paths, scheduler=client)
        wall = time.monotonic() - t0
        rss = client.run(_maxrss_self)
        # Dask's own cost per unit of work: the same number of units, doing nothing
        units = [paths[i:i + CHUNK] for i in range(0, len(paths), CHUNK)]
        t1 = time.monotonic()
        client.gather(client.map(_noop, units, pure=False))
        noop = (time.monotonic() - t1) / len(units)
    return {"wall": wall, "tasks": t.to_json()["tasks"], "rss": max(rss.values()), "unit_overhead": noop}


def _run_local(paths: list[str], workers: int) -> dict[str, Any]:
    cpu0 = time.process_time()
    t0 = time.monotonic()
    t = bucket(paths, workers=workers)
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    rss = _maxrss_self() if workers == 1 else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"wall": wall, "cpu": cpu if workers == 1 else None, "tasks": t.to_json()["tasks"], "rss": rss}


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print the table, write JSON/markdown."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dumps", type=int, default=5000, help="dumps per engine per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--markdown", metavar="OUT")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    paths = _paths(args.dumps)
    bucket(paths[:100], workers=1)  # warm the image and symbol caches once, as a fleet worker is after its first dump
    engines: dict[str, Callable[[list[str]], dict[str, Any]]] = {
        "one core (in-process)": lambda p: _run_local(p, 1),
        f"local, {cores} processes": lambda p: _run_local(p, cores),
        "Dask LocalCluster, 1 worker": lambda p: _run_dask(p, 1),
        "Dask LocalCluster, 2 workers": lambda p: _run_dask(p, 2),
    }
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        row = {}
        for name, run in engines.items():
            row[name] = run(paths)
            print(f"round {r}: {name}: {row[name]['wall']:.1f} s", file=sys.stderr)
        rounds.append(row)
    out: dict[str, Any] = {"dumps_per_round": len(paths), "rounds": args.rounds, "cores": cores,
                           "load_avg_end": os.getloadavg()[0], "engines": {}}
    lines = [f"{len(paths)} dumps x {args.rounds} rounds per engine, {cores} cores, load average at the end "
             f"{out['load_avg_end']:.1f}", "",
             "| engine | wall s (median) | dumps/s | tasks/s | vs one core | peak RSS / worker |",
             "|---|---|---|---|---|---|"]
    one = "one core (in-process)"
    for name in engines:
        walls = [rd[name]["wall"] for rd in rounds]
        ratios = [rd[one]["wall"] / rd[name]["wall"] for rd in rounds]
        tasks = rounds[0][name]["tasks"]
        wall = statistics.median(walls)
        info = {"wall": walls, "ratio_to_one_core": ratios, "tasks": tasks,
                "dumps_per_s": len(paths) / wall, "tasks_per_s": tasks / wall,
                "rss": max(rd[name]["rss"] for rd in rounds)}
        if name == one:
            info["cpu"] = [rd[name]["cpu"] for rd in rounds]
            info["cpu_per_dump"] = statistics.median(info["cpu"]) / len(paths)
        if "unit_overhead" in rounds[0][name]:
            info["unit_overhead"] = statistics.median(rd[name]["unit_overhead"] for rd in rounds)
        out["engines"][name] = info
        lines.append(f"| {name} | {wall:.1f} | {info['dumps_per_s']:.0f} | {info['tasks_per_s']:.0f} | "
                     f"{statistics.median(ratios):.2f}x | {info['rss'] / 2**20:.0f} MiB |")
    cpu = out["engines"][one]["cpu_per_dump"]
    over = min(v.get("unit_overhead", 1e9) for v in out["engines"].values())
    lines += ["", f"one-core CPU per dump: {cpu * 1e3:.1f} ms; Dask overhead per unit of {CHUNK} dumps: "
              f"{over * 1e3:.2f} ms"]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
