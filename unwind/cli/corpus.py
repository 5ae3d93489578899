"""``unwind slim`` and ``unwind diff``: corpus tools built on replay."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unwind.session.replay import Replay, Session, load_session
from unwind.core.target import Options, Task

if TYPE_CHECKING:
    from unwind.session.oracle_log import LogComparison


@dataclass
class OracleResult:
    """One oracle trace compared with the replay of the same task."""

    dump: str
    source: str
    who: str
    category: str
    expected: list[int]
    got: list[int]
    #: replay frames above the oracle's first pc left out of the comparison (ftrace-stacktrace only)
    cut: int = 0
    #: ``%pS`` of ``expected`` and ``got`` (hex without an image)
    expected_names: list[str] = field(default_factory=list)
    got_names: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        """The replay mode the oracle is compared with."""
        return "faithful replay" if self.source in KERNEL_SOURCES else "complete replay"

    @property
    def oracle_label(self) -> str:
        """Who produced the oracle: the kernel's printout, gdb or drgn."""
        return f"kernel ({self.source})" if self.source in KERNEL_SOURCES else self.source

    @property
    def explained(self) -> bool:
        """Exact, or a difference the backend documents."""
        return self.category != "unexplained"


@dataclass
class DiffReport:
    """All comparisons over a set of dumps."""

    results: list[OracleResult] = field(default_factory=list)
    #: ``(path, why)`` of each dump that could not be read: reported, and the run goes on
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, Counter[str]]:
        """Per oracle source, how many comparisons fell in each category."""
        out: dict[str, Counter[str]] = {}
        for r in self.results:
            out.setdefault(r.source, Counter())[r.category] += 1
        return out

    @property
    def ok(self) -> bool:
        """No unexplained difference."""
        return all(r.explained for r in self.results)


#: oracles that are the kernel's own printed trace: compared with faithful replay
KERNEL_SOURCES = ("sysrq-t", "sysrq-l", "ftrace-stacktrace", "dump_backtrace")


def _find_task(session: Session, oracle: dict[str, Any]) -> Task | None:
    tasks = session.dump.tasks()
    if oracle.get("cpu") is not None:
        hit = [t for t in tasks if t.running and t.cpu == oracle["cpu"]]
    else:
        hit = [t for t in tasks if t.pid == oracle.get("pid") and not t.running]
        hit = hit or [t for t in tasks if t.pid == oracle.get("pid")]
    return hit[0] if hit else None


def oracle_options(oracle: dict[str, Any]) -> Options:
    """The replay mode an oracle stands for: faithful for the kernel's own traces, else complete."""
    return Options(complete=oracle.get("source", "?") not in KERNEL_SOURCES)


def compare_oracle(session: Session, oracle: dict[str, Any], replay: Replay | None = None) -> OracleResult | None:
    """Replay the oracle's task in the mode the oracle stands for and categorise any difference
    (``replay``: that replay, already made)."""
    task = _find_task(session, oracle)
    if task is None:
        return None
    source = oracle.get("source", "?")
    options = oracle_options(oracle)
    r = replay if replay is not None else session.replay(task, options, symbolize=False)
    got = [f.pc for f in r.frames if f.reliable or options.complete]
    expected = [int(x, 0) if isinstance(x, str) else int(x) for x in oracle.get("frames", [])]
    cut = 0
    if source == "ftrace-stacktrace" and expected and expected[0] in got:
        # The trigger's walk runs inside the tracer and skips its own top frames by count
        # (kernel/trace/trace_events_trigger.c STACK_SKIP, +1 __ftrace_trace_stack, +1
        # stack_trace_save), while the dump is taken as the trigger is entered: the replay's frames
        # above the oracle's first pc are the tracer's (riscv: stacktrace_trigger+0) and are not
        # compared; from there on it must be equal pc for pc.
        cut = got.index(expected[0])
        got = got[cut:]
    if got == expected:
        category = "exact"
    else:
        category = session.backend.categorize(oracle, expected, r) or "unexplained"
    who = f"cpu{task.cpu}" if oracle.get("cpu") is not None else f"pid {task.pid}"

    def names(pcs: list[int]) -> list[str]:
        """``%pS`` of each pc: ``name+off/size``, the bare address outside every symbol."""
        out = []
        for pc in pcs:
            sym = session.symbols.lookup(pc) if session.symbols is not None else None
            out.append(str(sym) if sym is not None and sym.offset < sym.size else hex(pc))
        return out

    return OracleResult(session.dump.path, source, f"{who} ({task.comm})", category, expected, got, cut,
                        names(expected), names(got))


def compare_oracles(session: Session, oracles: list[dict[str, Any]]) -> list[OracleResult | None]:
    """:func:`compare_oracle` of each oracle, the tasks of each mode replayed in one batch."""
    found = [_find_task(session, oracle) for oracle in oracles]
    replays: dict[int, Replay] = {}
    for complete in (False, True):
        which = [i for i, (o, t) in enumerate(zip(oracles, found))
                 if t is not None and oracle_options(o).complete == complete]
        if not which:
            continue
        batch = session.replay_all(Options(complete=complete), [found[i] for i in which], symbolize=False)
        replays.update(zip(which, batch))
    return [compare_oracle(session, o, replays.get(i)) for i, o in enumerate(oracles)]


def dump_paths(args: list[str]) -> list[str]:
    """The dumps named on the command line, a folder standing for every dump below it."""
    out: list[str] = []
    for a in args:
        out.extend(paths_under(a) if Path(a).is_dir() else [a])
    return out


def diff_dumps(paths: list[str], vmlinux: str | None = None) -> DiffReport:
    """Compare every oracle in every dump; a dump that cannot be read is recorded and skipped."""
    from .main import INPUT_ERRORS

    report = DiffReport()
    for p in dump_paths(paths):
        try:
            session = load_session(p, vmlinux=vmlinux)
            results = compare_oracles(session, session.dump.oracles())
        except INPUT_ERRORS as e:
            report.unreadable.append((p, str(e).splitlines()[0] if str(e) else type(e).__name__))
            continue
        report.results.extend(r for r in results if r is not None)
    return report


def _side_by_side(r: OracleResult) -> list[str]:
    """The two traces in columns, one frame per row, labelled by who produced each."""
    left, right = r.oracle_label, r.mode + (f" (from frame {r.cut})" if r.cut else "")
    width = max([len(left), *(len(n) for n in r.expected_names)]) + 2
    rows = [f"  {'#':>3}  {left:<{width}}{right}"]
    for i in range(max(len(r.expected_names), len(r.got_names))):
        a = r.expected_names[i] if i < len(r.expected_names) else ""
        b = r.got_names[i] if i < len(r.got_names) else ""
        mark = " " if a == b else "|"
        rows.append(f"  {i:>3}{mark} {a:<{width}}{b}")
    return rows


def cmd_diff(args: argparse.Namespace) -> int:
    """``unwind diff``: exit 1 on any unexplained difference, 2 when a dump could not be read or no dump
    holds an oracle."""
    if args.oracle is not None:
        return cmd_diff_log(args)
    report = diff_dumps(args.dumps, args.vmlinux)
    for path, why in report.unreadable:
        print(f"unwind: error: {path}: {why} (skipped)", file=sys.stderr)
    if not report.results and not report.unreadable:
        print(f"unwind: error: no oracle in {', '.join(args.dumps)}: nothing to compare (give the console or "
              "dmesg log with --oracle LOG)", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"counts": {k: dict(v) for k, v in report.counts().items()},
                          "differences": [{"dump": r.dump, "source": r.source, "who": r.who, "mode": r.mode,
                                           "category": r.category, "expected": [hex(x) for x in r.expected],
                                           "got": [hex(x) for x in r.got], "expected_symbols": r.expected_names,
                                           "got_symbols": r.got_names}
                                          for r in report.results if r.category != "exact"],
                          "unreadable": [{"dump": p, "error": why} for p, why in report.unreadable]}))
    else:
        for r in report.results:
            if r.category != "exact" and (args.verbose or not r.explained):
                print(f"{r.dump}: {r.source} {r.who}: {r.category}")
                print("\n".join(_side_by_side(r)))
        for source, c in sorted(report.counts().items()):
            total = sum(c.values())
            parts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
            print(f"{source}: {total} traces: {parts}")
    if report.unreadable:
        return 2
    return 0 if report.ok else 1


def cmd_diff_log(args: argparse.Namespace) -> int:
    """``unwind diff DUMP --oracle LOG``: 0 when every trace matched to a task agrees with its replay, 1 on a
    difference, 2 when the log holds no trace or none matches a task of the dump (nothing was compared)."""
    from unwind.session.oracle_log import compare_log

    from .main import UsageError

    if len(args.dumps) != 1:
        raise UsageError(f"--oracle compares one dump with its log, not {len(args.dumps)}")
    with open(args.oracle, encoding="utf-8", errors="replace") as f:
        text = f.read()
    session = load_session(args.dumps[0], vmlinux=args.vmlinux)
    diff = compare_log(session, text)
    log = args.oracle
    if args.json:
        print(json.dumps({
            "dump": args.dumps[0], "log": log, "agrees": diff.agrees,
            "compared": [{"line": c.trace.line, "kind": c.trace.kind.value, "who": c.trace.who(),
                          "task": c.task.describe(), "agrees": c.agrees, "mode": c.mode,
                          "printed": [f.key for f in c.printed], "replayed": [f.key for f in c.replayed],
                          "cut": list(c.cut), "parted": list(c.parted) if c.parted else None,
                          "stop": str(c.stop) if c.stop else None,
                          "faithful_stop": str(c.faithful_stop) if c.faithful_stop else None,
                          "differences": [{"frame": d.index, "line": d.line, "printed": d.printed,
                                           "replayed": d.replayed} for d in c.differences]}
                         for c in diff.compared],
            "unmatched": [{"line": u.trace.line, "kind": u.trace.kind.value, "who": u.trace.who(), "why": u.why}
                          for u in diff.unmatched]}))
    else:
        for c in diff.compared:
            for line in _log_comparison_text(log, c, args.verbose):
                print(line)
        for u in diff.unmatched:
            print(f"{log}:{u.trace.line}: {u.trace.who()}: unmatched: {u.why}")
        differ = sum(not c.agrees for c in diff.compared)
        print(f"{log}: {len(diff.compared) + len(diff.unmatched)} traces: {len(diff.compared) - differ} agree, "
              f"{differ} differ, {len(diff.unmatched)} unmatched")
    if not diff.compared:
        what = "no trace (no task:, NMI backtrace, CPU: or Call Trace: block)" if not diff.unmatched else \
            "no trace that matches a task of the dump"
        print(f"unwind: error: {log} holds {what}: nothing was compared", file=sys.stderr)
        return 2
    return 0 if diff.agrees else 1


def _log_comparison_text(log: str, c: LogComparison, verbose: bool) -> list[str]:
    """The lines ``diff --oracle`` prints for one compared trace: which walk and which frames were compared
    (a crash block), each difference at its log line, and the walk's stop when it ran out first."""
    head = f"{log}:{c.trace.line}: {c.trace.who()}"
    out = []
    if c.faithful_stop is not None:
        out.append(f"{head}: the faithful walk holds none of the printed functions (-- stop: {c.faithful_stop}); "
                   "compared with the --complete walk")
    if c.cut != (0, 0):
        where = f"below {c.parted[0]} and {c.parted[1]}, where they part" if c.parted else "the first both hold"
        out.append(f"{head}: compared from printed frame {c.cut[0]} and {c.mode} replayed frame {c.cut[1]}, {where} "
                   "(printed on the way to the dump)")
    for d in c.differences:
        where = f"{log}:{d.line}" if d.line is not None else head.partition(": ")[0]
        out.append(f"{where}: {c.trace.who()} frame {d.index}: printed {d.printed or '(none)'}, "
                   f"replayed {d.replayed or '(none)'}")
    if c.differences and c.differences[-1].replayed is None and c.stop is not None:
        out.append(f"{head}: the {c.mode} walk ends after {len(c.replayed)} frames: -- stop: {c.stop}")
    if verbose and c.agrees:
        out.append(f"{head}: agrees ({len(c.printed) - c.cut[0]} frames compared, with the {c.mode} walk)")
    return out


def cmd_slim(args: argparse.Namespace) -> int:
    """``unwind slim``: write the slim image."""
    from unwind.formats.slim import write_slim

    n = write_slim(args.vmlinux, args.output, with_text=args.with_text)
    print(f"wrote {args.output}: {n} bytes", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``slim`` and ``diff`` to the top-level parser."""
    d = sub.add_parser("diff", help="replay every task with an oracle and compare frame by frame",
                       description="Replay every task that has an oracle (the dump's stored traces, or with "
                       "--oracle LOG the traces a console log printed) and compare frame by frame. Exit 0 when "
                       "all agree (differences the backend documents are explained), 1 on a difference, 2 "
                       "when a dump cannot be read or there is nothing to compare. With --oracle a trace "
                       "for a task the dump lacks is reported as unmatched, not as a difference.")
    d.add_argument("dumps", nargs="+", help="dump files, or folders (every dump below them)")
    d.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (default: found by build-id)")
    d.add_argument("--oracle", metavar="LOG", help="compare the one dump with the traces a console or dmesg "
                   "log printed (sysrq-t, hung task, NMI backtrace, panic, oops), task by task")
    d.add_argument("--json", action="store_true", help="counts and differences as JSON")
    d.add_argument("-v", "--verbose", action="store_true", help="also list explained differences")
    d.set_defaults(func=cmd_diff)

    s = sub.add_parser("slim", help="write a small image with what replay needs")
    s.add_argument("vmlinux", help="the full (debug) vmlinux")
    s.add_argument("-o", "--output", required=True, help="output image (.xz compresses)")
    s.add_argument("--with-text", action="store_true", help="keep the kernel text (call-site checks, complete modes)")
    s.set_defaults(func=cmd_slim)


def paths_under(folder: str | Path) -> list[str]:
    """Every dump file below ``folder``."""
    return sorted(str(p) for p in Path(folder).rglob("*") if p.is_file() and ".bin" in p.name)
