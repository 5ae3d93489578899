"""A campaign of ``unwind fuzz``: cases counted per family and outcome (:class:`Summary`), run in
this process or in worker processes, with the report written as it goes."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from unwind.formats.image import Image

from .cases import FAMILIES, VMMEM_CPU_LIMIT, Fuzzer
from .checks import Outcome
from .seeds import load_seeds, load_vmcore_seeds, load_vmmem_seeds


@dataclass
class Summary:
    """Counts per family and outcome, with one example of each non-ok outcome signature."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    cpu_seconds: float = 0.0

    def add(self, o: Outcome) -> None:
        """Count one outcome."""
        self.counts.setdefault(o.family, Counter())[o.kind] += 1
        if o.kind not in ("ok", "rejected"):
            sig = f"{o.family} {o.kind}: {o.detail.splitlines()[-1] if o.detail else ''}"
            self.examples.setdefault(sig[:300], o.detail)

    def merge(self, other: "Summary") -> None:
        """Add another worker's counts."""
        for fam, c in other.counts.items():
            self.counts.setdefault(fam, Counter()).update(c)
        for k, v in other.examples.items():
            self.examples.setdefault(k, v)
        self.cpu_seconds += other.cpu_seconds

    @property
    def failures(self) -> int:
        """Cases that broke a promise."""
        return sum(n for c in self.counts.values() for k, n in c.items() if k not in ("ok", "rejected"))

    def table(self) -> str:
        """The summary table (markdown)."""
        kinds = ("traceback", "hang", "runaway", "out-of-dump", "bad-value", "batch-differs")
        rows = ["| family | cases | rejected (one line) | " + " | ".join(kinds) + " |",
                "|---|---|---|" + "---|" * len(kinds)]
        total: Counter[str] = Counter()
        for fam in FAMILIES:
            c = self.counts.get(fam, Counter())
            total.update(c)
            rows.append(f"| {fam} | {sum(c.values())} | {c['rejected']} | "
                        + " | ".join(str(c[k]) for k in kinds) + " |")
        rows.append(f"| **all** | {sum(total.values())} | {total['rejected']} | "
                    + " | ".join(str(total[k]) for k in kinds) + " |")
        return "\n".join(rows)


def run_cases(fuzzer: Fuzzer, seed_value: int, indices: range,
              progress: Callable[[int, Summary], None] | None = None, family: str | None = None) -> Summary:
    """Run cases ``indices`` of campaign ``seed_value`` in this process (all of ``family`` if given)."""
    summary = Summary()
    t0 = time.process_time()
    for n, i in enumerate(indices):
        summary.add(fuzzer.case(i, seed_value, family))
        if progress is not None and n % 1000 == 999:
            summary.cpu_seconds = time.process_time() - t0
            progress(n + 1, summary)
    summary.cpu_seconds = time.process_time() - t0
    return summary


_WORKER: Fuzzer | None = None


def fuzzer_of(args: argparse.Namespace) -> Fuzzer:
    """The fuzzer ``args`` describe: corpus seeds, vmcore seeds, BTF of the given ELF files."""
    blobs = []
    for path in args.btf or []:
        sec = Image(path).section(".BTF")
        if sec is None:
            raise OSError(f"{path} has no .BTF section")
        blobs.append(sec[1])
    vmcores = load_vmcore_seeds(Path(args.vmcore_seeds)) if args.vmcore_seeds else None
    fuzzer = Fuzzer(load_seeds(Path(args.corpus)), args.cpu_limit, vmcores, btf_blobs=blobs,
                    vmmem_seeds=load_vmmem_seeds(Path(args.corpus)))
    fuzzer.keep = Path(args.keep) if args.keep else None
    fuzzer.regressions = Path(args.save_regressions) if getattr(args, "save_regressions", None) else None
    fuzzer.vmmem_cpu_limit = getattr(args, "vmmem_cpu_limit", VMMEM_CPU_LIMIT)
    return fuzzer


def _worker_init(args: argparse.Namespace) -> None:
    global _WORKER
    _WORKER = fuzzer_of(args)


def _worker_run(args: tuple[int, int, int, str | None]) -> Summary:
    seed_value, start, stop, family = args
    assert _WORKER is not None
    return run_cases(_WORKER, seed_value, range(start, stop), family=family)


def campaign(args: argparse.Namespace) -> int:
    """Run the campaign ``args`` describe, print (and write) the summary table; 1 on any failure."""
    start_wall = time.time()
    summary = Summary()
    out = Path(args.report) if args.report else None
    chunk, first, end = args.chunk, args.start, args.start + args.cases
    jobs = [(args.seed, a, min(a + chunk, end), args.family) for a in range(first, end, chunk)]
    span = f" (cases {first} to {end - 1} of campaign {args.seed})" if first else ""

    def report(done: int) -> None:
        wall = time.time() - start_wall
        text = (f"# unwind fuzz\n\ncommand: `{' '.join(sys.argv)}`\n\ncases: {done} of {args.cases}{span}, "
                f"wall {wall:.0f} s, CPU {summary.cpu_seconds:.0f} s, "
                f"{done / max(summary.cpu_seconds, 1e-9):.0f} cases per CPU second\n\n{summary.table()}\n")
        if summary.examples:
            text += "\n## failures (one example per signature)\n\n" + "\n".join(
                f"- {k}\n\n```\n{v}\n```" for k, v in sorted(summary.examples.items()))
        if out is not None:
            out.write_text(text)
        print(text if done == args.cases else f"{done} cases, {summary.failures} failures, {wall:.0f} s",
              file=sys.stderr if done != args.cases else sys.stdout, flush=True)

    done = 0
    if args.jobs <= 1:
        fuzzer = fuzzer_of(args)
        for job in jobs:
            summary.merge(run_cases(fuzzer, job[0], range(job[1], job[2]), family=job[3]))
            done = job[2] - first
            report(done)
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.jobs, _worker_init, (args,)) as pool:
            for part in pool.imap(_worker_run, jobs):
                summary.merge(part)
                done += sum(part.counts[f].total() for f in part.counts)
                report(done)
    return 1 if summary.failures else 0
