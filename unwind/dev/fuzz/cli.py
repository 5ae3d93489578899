"""``unwind fuzz``: its command line."""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

from . import guided
from .cases import CASE_CPU_LIMIT, FAMILIES, VMMEM_CPU_LIMIT
from .runner import campaign, fuzzer_of


def cmd_fuzz(args: argparse.Namespace) -> int:
    """``unwind fuzz``: run a campaign, print (and write) the summary table; exit 1 on any failure."""
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise OSError(f"no corpus folder {corpus}")
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.RLIM_INFINITY))
    if args.engine == "atheris":
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        return guided.run(fuzzer_of(args), work, args.max_time, args.runs, [])
    return campaign(args)


def _case_index(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a case index (0 or more)")
    return n


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fuzz`` to the top-level parser."""
    f = sub.add_parser("fuzz", help="mutate the corpus dumps and check replay never breaks its promises")
    f.add_argument("--corpus", default="corpora", help="corpus folder (default: corpora)")
    f.add_argument("--cases", type=int, default=2000, help="number of cases (default 2000)")
    f.add_argument("--seed", type=int, default=0, help="campaign seed: the same seed runs the same cases")
    f.add_argument("--start", type=_case_index, default=0, metavar="N",
                   help="first case index: runs cases N to N+cases-1 of the campaign, so a long campaign can be "
                        "run in sittings on one commit and its reports summed (default 0)")
    f.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    f.add_argument("--chunk", type=int, default=5000, help="cases per progress report (default 5000)")
    f.add_argument("--cpu-limit", type=float, default=CASE_CPU_LIMIT,
                   help=f"CPU seconds a case may take before it counts as a hang (default {CASE_CPU_LIMIT})")
    f.add_argument("--vmmem-cpu-limit", type=float, default=VMMEM_CPU_LIMIT,
                   help=f"the same for a vmmem case, which loads a whole vmcore (default {VMMEM_CPU_LIMIT})")
    f.add_argument("--family", choices=FAMILIES,
                   help="run only this family's cases (case i is then family's case i of the campaign)")
    f.add_argument("--vmcore-seeds", metavar="DIR",
                   help="small vmcore files for the vmcore family (python -m tests.fuzz.vmcore_seeds DIR writes some)")
    f.add_argument("--btf", metavar="ELF", action="append",
                   help="a vmlinux (or any ELF with .BTF) whose BTF seeds the btf family (repeatable)")
    f.add_argument("--keep", metavar="DIR", help="write each failing case's input and outcome into DIR "
                   "(copy them to tests/fuzz/regressions/ to keep them as regression cases)")
    f.add_argument("--save-regressions", metavar="DIR",
                   help="add each failing case to the regression folder DIR (tests/fuzz/regressions), as the "
                        "default suite replays it: its input file, or its case number in DIR/campaign.json (the random "
                        "engine's cases)")
    f.add_argument("--report", metavar="OUT", help="write the summary table (markdown) to OUT as it goes")
    f.add_argument("--engine", choices=("random", "atheris"), default="random",
                   help="random: numbered, reproducible cases (default); atheris: coverage-guided by libFuzzer "
                        "(the [fuzz] extra), the same checks on every input")
    f.add_argument("--max-time", type=int, default=600, help="atheris: seconds to run (default 600)")
    f.add_argument("--runs", type=int, help="atheris: stop after this many inputs")
    f.add_argument("--work", metavar="DIR", default="fuzz-work",
                   help="atheris: libFuzzer's inputs (the seeds, then every input that found new code) "
                        "and artifacts (default fuzz-work)")
    f.set_defaults(func=cmd_fuzz)
