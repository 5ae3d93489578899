"""Fleet triage: replay every task of many dumps and bucket the stacks by signature.

A task's signature is the list of function names (no offsets) of its
faithful trace, from the first frame that is not scheduler or lock
plumbing (``triage_skip.json``, a per-arch table), to ``depth`` frames.
Running CPUs and blocked tasks are bucketed apart, and so are task states.

The unit of work is one chunk of dumps: a worker replays them and returns a
:class:`Tally`, the buckets of those dumps already reduced by signature, so
nothing but results crosses the network. Tallies merge associatively and
order-independently, so every engine (in-process, local processes, a Dask
cluster) gives the same buckets. Workers keep their images open between
dumps (``unwind.formats.image.open_image`` caches per process).

See ``docs/triage.md`` for the JSON schema and the skip table.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

from .main import INPUT_ERRORS, add_filter_arguments, task_filter
from unwind.core.frame import Flag
from unwind.formats.dump import file_start
from unwind.session.filters import TaskFilter, functions
from unwind.session.replay import ReplayError, load_session
from unwind.core.target import Options

SCHEMA = 1
#: frames kept in a signature unless ``depth`` says otherwise
DEFAULT_DEPTH = 6
#: dumps a worker replays per unit of work (fewer round trips, same buckets)
CHUNK = 8

_ELF_CORE = 4
#: names a skip table keeps the answer of at most
_ASKED_MAX = 1 << 16
#: ``Flag.UNRELIABLE`` as an int (a frame's flags are tested as ints in the per-frame loop)
_UNRELIABLE = Flag.UNRELIABLE.value


# --- signatures --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SkipTable:
    """Per-arch fnmatch patterns of the plumbing a signature starts after."""

    patterns: dict[str, tuple[str, ...]]
    #: each (arch, name) asked so far, and the answer (a fleet's traces repeat the same few hundred names)
    _asked: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "SkipTable":
        """The table from ``path``, or the default one shipped with the package."""
        if path is None:
            text = resources.files("unwind.cli").joinpath("triage_skip.json").read_text()
        else:
            text = Path(path).read_text()
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("skip table: not a JSON object")
        table = {k: tuple(str(p) for p in v) for k, v in raw.items() if isinstance(v, list)}
        return cls(table)

    def for_arch(self, arch: str) -> tuple[str, ...]:
        """The common patterns and the arch's own."""
        return self.patterns.get("common", ()) + self.patterns.get(arch, ())

    def skips(self, arch: str, name: str) -> bool:
        """True when ``name`` is plumbing on ``arch``."""
        key = (arch, name)
        hit = self._asked.get(key)
        if hit is None:
            if len(self._asked) >= _ASKED_MAX:
                self._asked.clear()
            hit = self._asked[key] = any(fnmatch.fnmatchcase(name, p) for p in self.for_arch(arch))
        return hit


def function_name(printed: str) -> str:
    """``foo+0x1c/0x40 [mod]`` as printed becomes ``foo [mod]``; raw addresses stay as they are."""
    name, _, rest = printed.partition("+")
    module = rest[rest.find(" ["):] if " [" in rest else ""
    return name.strip() + module


def signature(arch: str, names: Sequence[str], skip: SkipTable, depth: int = DEFAULT_DEPTH) -> tuple[str, ...]:
    """The first ``depth`` names after the leading plumbing (all of them when everything is plumbing)."""
    i = 0
    while i < len(names) and skip.skips(arch, names[i]):
        i += 1
    kept = names[i:] if i < len(names) else names
    return tuple(kept[:depth])


# --- one dump ----------------------------------------------------------------------------------

@dataclass
class Bucket:
    """Tasks sharing one (kind, state, signature)."""

    kind: str
    state: str
    signature: tuple[str, ...]
    tasks: int = 0
    dumps: int = 0
    errors: int = 0
    releases: Counter[str] = field(default_factory=Counter)
    first: float | None = None
    last: float | None = None
    #: the representative task: the one with the smallest (path, pid, cpu), whatever the engine's order
    representative: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, tuple[str, ...]]:
        """What identifies the bucket."""
        return (self.kind, self.state, self.signature)

    def merge(self, other: "Bucket") -> None:
        """Add ``other`` (same key) into this bucket."""
        self.tasks += other.tasks
        self.dumps += other.dumps
        self.errors += other.errors
        self.releases.update(other.releases)
        self.first = _pick(min, self.first, other.first)
        self.last = _pick(max, self.last, other.last)
        if other.representative is not None and (
                self.representative is None or _rep_order(other.representative) < _rep_order(self.representative)):
            self.representative = other.representative

    def to_json(self) -> dict[str, Any]:
        """The bucket as ``docs/triage.md`` describes it."""
        return {"id": bucket_id(self.key), "kind": self.kind, "state": self.state,
                "signature": list(self.signature), "tasks": self.tasks, "dumps": self.dumps,
                "errors": self.errors, "releases": dict(sorted(self.releases.items())),
                "first": _iso(self.first), "last": _iso(self.last), "representative": self.representative}


def _pick(f: Callable[[float, float], float], a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else f(a, b)


def _rep_order(rep: dict[str, Any]) -> tuple[str, int, int]:
    return (rep["path"], -1 if rep["pid"] is None else rep["pid"], -1 if rep["cpu"] is None else rep["cpu"])


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def bucket_id(key: tuple[str, str, tuple[str, ...]]) -> str:
    """A short stable name for a bucket: the first 12 hex digits of its key's SHA-1."""
    return hashlib.sha1(json.dumps([key[0], key[1], list(key[2])]).encode()).hexdigest()[:12]


@dataclass
class DumpRecord:
    """What triage learnt of one input file."""

    path: str
    ok: bool
    error: str | None = None
    release: str | None = None
    arch: str | None = None
    time: float | None = None
    tasks: int = 0

    def to_json(self) -> dict[str, Any]:
        """JSON form (``time`` as ISO 8601 UTC)."""
        return {"path": self.path, "ok": self.ok, "error": self.error, "release": self.release,
                "arch": self.arch, "time": _iso(self.time), "tasks": self.tasks}


@dataclass
class Tally:
    """Buckets and dump records of some dumps: what a unit of work returns, and what merging gives."""

    buckets: dict[tuple[str, str, tuple[str, ...]], Bucket] = field(default_factory=dict)
    dumps: list[DumpRecord] = field(default_factory=list)
    #: the filter values (``--state D``) some task of these dumps has
    matched: set[str] = field(default_factory=set)

    def add(self, bucket: Bucket) -> None:
        """Merge one bucket in."""
        have = self.buckets.get(bucket.key)
        if have is None:
            self.buckets[bucket.key] = bucket
        else:
            have.merge(bucket)

    def merge(self, other: "Tally") -> None:
        """Merge another tally in."""
        for b in other.buckets.values():
            self.add(b)
        self.dumps.extend(other.dumps)
        self.matched |= other.matched


def _capture_time(session: Any, path: str) -> float | None:
    meta = getattr(session.dump, "meta", None)
    capture = meta.get("capture") if isinstance(meta, dict) else None
    t = capture.get("time") if isinstance(capture, dict) else None
    if isinstance(t, (int, float)) and 0 <= t < 2**40:
        return float(t)
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def triage_dump(path: str, depth: int = DEFAULT_DEPTH, complete: bool = False,
                skip: SkipTable | None = None, filters: TaskFilter | None = None) -> Tally:
    """Replay every task of one dump (every one ``filters`` selects) and bucket them; a dump that fails is a
    record with its reason."""
    skip = skip or _default_skip()
    tally = Tally()
    try:
        session = load_session(path)
        everyone = session.select(every=True)
        release = session.dump.release or "unknown"
        when = _capture_time(session, path)
        options = Options(complete=complete)
        local: dict[tuple[str, str, tuple[str, ...]], Bucket] = {}
        flt = filters or TaskFilter()
        for t in everyone:
            tally.matched |= flt.task_values(t)
        tasks = [t for t in everyone if flt.matches_task(t)]
        count = 0
        for task in tasks:
            r = session.replay(task, options)
            if flt.function is not None and not flt.matches_functions(functions(session, r)):
                continue
            count += 1
            printed = [f.symbol or hex(f.pc) for f in r.frames if not f.flags._value_ & _UNRELIABLE]
            names = [function_name(p) for p in printed]
            kind = "running" if task.running else "blocked"
            state = "R" if task.running else (task.state or "?")
            key = (kind, state, signature(session.backend.name, names, skip, depth))
            b = local.get(key)
            if b is None:
                b = local[key] = Bucket(kind, state, key[2], dumps=1, first=when, last=when)
            b.tasks += 1
            b.releases[release] += 1
            if not r.stop.clean:
                b.errors += 1
            rep = {"path": path, "pid": task.pid, "comm": task.comm, "cpu": task.running_cpu,
                   "trace": printed, "stop": str(r.stop)}
            if b.representative is None or _rep_order(rep) < _rep_order(b.representative):
                b.representative = rep
        for b in local.values():
            tally.add(b)
        if flt.function is not None and (count or any(
                flt.matches_functions(functions(session, session.replay(t, options))) for t in everyone
                if not flt.matches_task(t))):
            tally.matched.add(f"--function {flt.function}")
        tally.dumps.append(DumpRecord(path, True, release=release, arch=session.backend.name, time=when,
                                      tasks=count))
    except INPUT_ERRORS as e:
        msg = _one_line(e)
        tally.dumps.append(DumpRecord(path, False, error=msg[len(path) + 2:] if msg.startswith(f"{path}: ") else msg))
    except Exception as e:  # noqa: BLE001 - a fleet run reports a dump the tool cannot read and goes on
        tally.dumps.append(DumpRecord(path, False, error=f"internal error: {type(e).__name__}: {_one_line(e)}"))
    return tally


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@lru_cache(maxsize=1)
def _default_skip() -> SkipTable:
    return SkipTable.load()


def triage_chunk(paths: Sequence[str], depth: int = DEFAULT_DEPTH, complete: bool = False,
                 skip_path: str | None = None, filters: TaskFilter | None = None) -> Tally:
    """The unit of work: several dumps, reduced to one tally on the worker."""
    skip = SkipTable.load(skip_path) if skip_path else _default_skip()
    tally = Tally()
    for p in paths:
        tally.merge(triage_dump(p, depth, complete, skip, filters))
    return tally


# --- inputs ------------------------------------------------------------------------------------

def looks_like_dump(path: Path) -> bool:
    """An ELF core (the project's dumps, ELF vmcores) or a kdump-compressed/flattened file, by magic."""
    try:
        head = file_start(str(path), 64)
    except OSError:
        return False
    if head[:4] == b"\x7fELF" and len(head) >= 18:
        return int.from_bytes(head[16:18], "little") == _ELF_CORE
    return head.startswith(b"KDUMP   ") or head.startswith(b"makedumpfile")


def expand_paths(paths: Iterable[str | Path]) -> list[str]:
    """Files as given; folders become every dump below them (by magic), in name order."""
    out: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(str(f) for f in sorted(p.rglob("*")) if f.is_file() and looks_like_dump(f))
        else:
            out.append(str(p))
    return out


# --- engines -----------------------------------------------------------------------------------

def _chunks(paths: Sequence[str], size: int) -> list[list[str]]:
    return [list(paths[i:i + size]) for i in range(0, len(paths), size)]


def run_local(chunks: list[list[str]], workers: int, work: Callable[[list[str]], Tally]) -> Iterator[Tally]:
    """In this process for one worker; else a process pool (each process keeps its images open)."""
    if workers <= 1:
        for c in chunks:
            yield work(c)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        pending = {pool.submit(work, c) for c in chunks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()


def run_dask(chunks: list[list[str]], scheduler: Any, work: Callable[[list[str]], Tally]) -> Iterator[Tally]:
    """On a Dask distributed cluster: ``scheduler`` is an address or a ``distributed.Client``."""
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise TriageError("--scheduler needs Dask: pip install '.[fleet]' in the source tree") from None
    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        futures = client.map(work, chunks, pure=False)
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        if client is not scheduler:
            client.close()


class TriageError(ReplayError):
    """Unusable triage input or engine (exit status 2)."""


@dataclass
class _Work:
    """A picklable unit-of-work function with its options bound."""

    depth: int
    complete: bool
    skip_path: str | None
    filters: TaskFilter | None = None

    def __call__(self, paths: list[str]) -> Tally:
        return triage_chunk(paths, self.depth, self.complete, self.skip_path, self.filters)


class Progress:
    """``dumps done, per second, time left`` on a stream, at most every ``every`` seconds."""

    def __init__(self, total: int, stream: IO[str] | None, every: float = 2.0) -> None:
        self.total, self.stream, self.every = total, stream, every
        self.start = self.shown = time.monotonic()
        self.done = 0

    def advance(self, n: int, final: bool = False) -> None:
        """Count ``n`` more dumps done."""
        self.done += n
        now = time.monotonic()
        if self.stream is None or (not final and now - self.shown < self.every):
            return
        self.shown = now
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate else float("inf")
        self.stream.write(f"triage: {self.done}/{self.total} dumps, {rate:.1f}/s, ~{left:.0f} s left\n")
        self.stream.flush()


# --- the result --------------------------------------------------------------------------------

@dataclass
class Triage:
    """Buckets of a fleet, with the options that made them and an optional baseline comparison."""

    tally: Tally
    depth: int
    complete: bool
    engine: str
    seconds: float
    baseline: dict[str, Any] | None = None
    filters: TaskFilter | None = None

    def notes(self) -> list[str]:
        """The filter values that matched no task of any dump; one line more when none matched together."""
        if not self.filters:
            return []
        out = [f"{v} matched no task in any dump" for v in self.filters.values() if v not in self.tally.matched]
        if not out and not any(d.tasks for d in self.tally.dumps):
            out.append(f"no task has all of {self.filters}")
        return out

    def buckets(self) -> list[Bucket]:
        """Largest first; ties by kind, state and signature."""
        return sorted(self.tally.buckets.values(), key=lambda b: (-b.tasks, b.key))

    def failed(self) -> list[DumpRecord]:
        """The inputs that could not be replayed, with their reasons."""
        return sorted((d for d in self.tally.dumps if not d.ok), key=lambda d: d.path)

    def to_json(self) -> dict[str, Any]:
        """The document ``--json`` writes (``docs/triage.md``)."""
        dumps = sorted(self.tally.dumps, key=lambda d: d.path)
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "options": {"depth": self.depth, "complete": self.complete, "engine": self.engine,
                        **({"filters": self.filters.values()} if self.filters else {})},
            "seconds": round(self.seconds, 3),
            "dumps": {"total": len(dumps), "ok": sum(d.ok for d in dumps),
                      "failed": [d.to_json() for d in self.failed()]},
            "tasks": sum(d.tasks for d in dumps),
            "releases": dict(sorted(Counter(d.release for d in dumps if d.ok and d.release).items())),
            "buckets": [b.to_json() for b in self.buckets()],
        }
        if self.baseline is not None:
            doc["baseline"] = compare(doc, self.baseline)
        return doc


def bucket(paths: Iterable[str | Path], *, depth: int = DEFAULT_DEPTH, complete: bool = False,
           workers: int | None = None, scheduler: Any = None, baseline: dict[str, Any] | str | Path | None = None,
           skip_table: str | Path | None = None, progress: IO[str] | None = None,
           chunk: int = CHUNK, filters: TaskFilter | None = None) -> Triage:
    """Triage ``paths`` (dumps and folders of them): every task, or those ``filters`` selects.

    ``workers`` local processes (default: all cores; 1 runs in this process), or ``scheduler``, a Dask
    address or ``distributed.Client``. ``baseline`` is an earlier ``--json`` document (or its path).
    """
    if depth < 1:
        raise TriageError("--depth must be at least 1")
    if workers is not None and workers < 1:
        raise TriageError("--workers must be at least 1")
    files = expand_paths(paths)
    if not files:
        raise TriageError("no dumps found in the paths given")
    if isinstance(baseline, (str, Path)):
        baseline = load_baseline(baseline)
    work = _Work(depth, complete, str(skip_table) if skip_table else None, filters or None)
    chunks = _chunks(files, max(1, chunk))
    start = time.monotonic()
    if scheduler is not None:
        engine, results = "dask", run_dask(chunks, scheduler, work)
    else:
        n = workers or os.cpu_count() or 1
        engine, results = (f"local:{n}", run_local(chunks, n, work))
    meter = Progress(len(files), progress)
    tally = Tally()
    for part in results:
        tally.merge(part)
        meter.advance(len(part.dumps))
    meter.advance(0, final=True)
    return Triage(tally, depth, complete, engine, time.monotonic() - start, baseline, filters or None)


# --- baseline ----------------------------------------------------------------------------------

def load_baseline(path: str | Path) -> dict[str, Any]:
    """An earlier ``--json`` document."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise TriageError(f"baseline {path}: {_one_line(e)}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("buckets"), list):
        raise TriageError(f"baseline {path}: not a triage JSON document of schema {SCHEMA}")
    return doc


def _share(doc: dict[str, Any]) -> dict[str, tuple[int, float, dict[str, Any]]]:
    total: Counter[str] = Counter()
    for b in doc["buckets"]:
        total[b["kind"]] += b["tasks"]
    return {b["id"]: (b["tasks"], b["tasks"] / max(total[b["kind"]], 1), b) for b in doc["buckets"]
            if isinstance(b, dict) and "id" in b}


def compare(current: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """New, grown, shrunk and vanished buckets. Growth is by share of the tasks of that kind
    (running or blocked), so fleets of different sizes compare; the counts are given too."""
    now, then = _share(current), _share(baseline)

    def row(bid: str, cur: tuple[int, float, dict[str, Any]] | None,
            old: tuple[int, float, dict[str, Any]] | None) -> dict[str, Any]:
        b = (cur or old)[2]  # type: ignore[index]
        return {"id": bid, "kind": b["kind"], "state": b["state"], "signature": b["signature"],
                "tasks": cur[0] if cur else 0, "baseline_tasks": old[0] if old else 0,
                "share": round(cur[1], 6) if cur else 0.0, "baseline_share": round(old[1], 6) if old else 0.0}

    new = [row(k, now[k], None) for k in now if k not in then]
    gone = [row(k, None, then[k]) for k in then if k not in now]
    both = [row(k, now[k], then[k]) for k in now if k in then]
    grew = [r for r in both if r["share"] > r["baseline_share"]]
    shrank = [r for r in both if r["share"] < r["baseline_share"]]
    order = lambda rows: sorted(rows, key=lambda r: (-abs(r["share"] - r["baseline_share"]), r["id"]))  # noqa: E731
    return {"new": order(new), "grew": order(grew), "shrank": order(shrank), "vanished": order(gone),
            "baseline_dumps": baseline.get("dumps", {}).get("total")}


# --- text and report ---------------------------------------------------------------------------

def text_lines(t: Triage, top: int = 20) -> list[str]:
    """The summary a terminal shows: counts, the top buckets, failures, the baseline comparison."""
    doc = t.to_json()
    d = doc["dumps"]
    lines = [f"{d['ok']}/{d['total']} dumps, {doc['tasks']} tasks, {len(doc['buckets'])} buckets "
             f"(depth {t.depth}, {'complete' if t.complete else 'faithful'}, {t.engine}, {t.seconds:.1f} s)"]
    lines.append(f"{'tasks':>6} {'dumps':>6} {'err':>4}  {'kind':7} st  signature")
    for b in doc["buckets"][:top]:
        lines.append(f"{b['tasks']:6d} {b['dumps']:6d} {b['errors']:4d}  {b['kind']:7} {b['state']:2}  "
                     + " < ".join(b["signature"]))
    if len(doc["buckets"]) > top:
        lines.append(f"... {len(doc['buckets']) - top} more buckets (--top N, --json)")
    for f in d["failed"]:
        lines.append(f"failed: {f['path']}: {f['error']}")
    if "baseline" in doc:
        cmp = doc["baseline"]
        lines.append(f"against the baseline ({cmp['baseline_dumps']} dumps): {len(cmp['new'])} new, "
                     f"{len(cmp['grew'])} grew, {len(cmp['shrank'])} shrank, {len(cmp['vanished'])} vanished")
        for what in ("new", "grew", "vanished"):
            for r in cmp[what][:top]:
                lines.append(f"  {what:8} {r['baseline_tasks']:5d} -> {r['tasks']:5d}  {r['kind']:7} {r['state']:2}  "
                             + " < ".join(r["signature"]))
    return lines


def write_report(t: Triage, out: str | Path, top: int = 15) -> Path:
    """``OUT/report.md`` with the tables and, where matplotlib is installed, the plots beside it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = t.to_json()
    (out / "triage.json").write_text(json.dumps(doc, indent=1))
    plots = _plots(doc, out, top)
    md = ["# Triage report", "", "```", *text_lines(t, top), "```", ""]
    md += ["## Top buckets", "", "| id | tasks | dumps | errors | kind | state | releases | signature |",
           "|---|---|---|---|---|---|---|---|"]
    for b in doc["buckets"][:top]:
        rel = ", ".join(f"{k} ({v})" for k, v in b["releases"].items())
        md.append(f"| `{b['id']}` | {b['tasks']} | {b['dumps']} | {b['errors']} | {b['kind']} | {b['state']} | "
                  f"{rel} | {' < '.join(b['signature'])} |")
    for name, caption in (("top.png", "Top buckets"), ("releases.png", "Top buckets by release"),
                          ("baseline.png", "Against the baseline: change in share")):
        if name in plots:
            md += ["", f"## {caption}", "", f"![{caption}]({name})"]
    if not plots:
        md += ["", "Plots need matplotlib: `pip install '.[report]'` in the source tree."]
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _label(row: dict[str, Any]) -> str:
    """A bucket's (or baseline row's) short label on a plot axis."""
    return f"{row['kind'][0]}/{row['state']} {' < '.join(row['signature'][:3])}"[:70]


def _plots(doc: dict[str, Any], out: Path, top: int) -> set[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return set()
    made: set[str] = set()

    def barh(name: str, rows: int, xlabel: str, draw: Callable[[Any], None]) -> None:
        fig, ax = plt.subplots(figsize=(10, 0.35 * rows + 1.2))
        draw(ax)
        ax.set_xlabel(xlabel)
        ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.add(name)

    buckets = doc["buckets"][:top][::-1]
    if buckets:
        labels = [_label(b) for b in buckets]
        barh("top.png", len(buckets), "tasks",
             lambda ax: ax.barh(labels, [b["tasks"] for b in buckets], color="tab:blue"))

        def by_release(ax: Any) -> None:
            left = [0] * len(buckets)
            for rel in sorted(doc["releases"]):
                vals = [b["releases"].get(rel, 0) for b in buckets]
                ax.barh(labels, vals, left=left, label=rel)
                left = [a + v for a, v in zip(left, vals)]
            ax.legend(fontsize=7)
        barh("releases.png", len(buckets), "tasks", by_release)
    cmp = doc.get("baseline")
    if cmp:
        rows = (cmp["new"] + cmp["grew"] + cmp["shrank"] + cmp["vanished"])
        rows = sorted(rows, key=lambda r: -abs(r["share"] - r["baseline_share"]))[:top][::-1]
        if rows:
            delta = [100 * (r["share"] - r["baseline_share"]) for r in rows]
            barh("baseline.png", len(rows), "change in share of tasks (percentage points)",
                 lambda ax: ax.barh([_label(r) for r in rows], delta,
                                    color=["tab:red" if d > 0 else "tab:green" for d in delta]))
    return made


# --- command line ------------------------------------------------------------------------------

def cmd_triage(args: argparse.Namespace) -> int:
    """``unwind triage``: bucket every task of the dumps given."""
    stream = sys.stderr if (args.progress or (args.progress is None and sys.stderr.isatty())) else None
    t = bucket(args.paths, depth=args.depth, complete=args.complete, workers=args.workers,
               scheduler=args.scheduler, baseline=args.baseline, skip_table=args.skip_table, progress=stream,
               filters=task_filter(args))
    for note in t.notes():
        print(f"unwind: note: {note}", file=sys.stderr)
    print("\n".join(text_lines(t, args.top)))
    if args.json:
        Path(args.json).write_text(json.dumps(t.to_json(), indent=1) + "\n")
    if args.report:
        print(f"report: {write_report(t, args.report, args.top)}")
    return 0 if any(d.ok for d in t.tally.dumps) else 2


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``triage`` to the top-level parser."""
    p = sub.add_parser("triage", help="bucket the stacks of many dumps by signature (fleet triage)",
                       description="Replay every task (or the filters' tasks) of every dump and bucket the stacks "
                       "by signature. "
                       "Exit 0 when at least one dump was replayed (the others are listed with their "
                       "reasons), 2 when none could be.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="dumps, or folders searched for dumps")
    eng = p.add_mutually_exclusive_group()
    eng.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: all cores)")
    eng.add_argument("--scheduler", metavar="ADDRESS", help="a Dask scheduler, e.g. tcp://host:8786 "
                     "(needs the [fleet] extra)")
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH, metavar="N",
                   help=f"frames in a signature (default {DEFAULT_DEPTH})")
    p.add_argument("--complete", action="store_true", help="sign complete-mode traces instead of faithful ones")
    p.add_argument("--baseline", metavar="OLD.json", help="an earlier --json: show new, grown and vanished buckets")
    p.add_argument("--skip-table", metavar="FILE", help="another skip table (JSON, as unwind/cli/triage_skip.json)")
    p.add_argument("--json", metavar="OUT.json", help="write the buckets as JSON (docs/triage.md)")
    p.add_argument("--report", metavar="DIR", help="write DIR/report.md with tables and plots")
    p.add_argument("--top", type=int, default=20, metavar="N", help="buckets shown (default 20)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="progress on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    add_filter_arguments(p)
    p.set_defaults(func=cmd_triage)
