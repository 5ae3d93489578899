"""``unwind bench``: its command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .figures import targets
from .report import write_report
from .results import STATS, BenchError, load_results
from .speed import speed_goals
from .suite import find_benches, run_speed_scripts, run_suite

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
    b.add_argument("--speed", action="store_true", help="also run the speed scripts (speed_peer.py, "
                   "batch_replay.py, startup.py; their JSON goes into OUT and heads the report)")
    b.add_argument("--speed-rounds", type=int, default=3, metavar="N", help="rounds of each speed script (default 3)")
    b.add_argument("--drgn-python", metavar="PY", help="a Python with drgn installed, for the speed section's drgn rows")
    b.set_defaults(func=cmd_bench)
