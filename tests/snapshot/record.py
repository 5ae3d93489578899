"""Record, or check, the byte-identity snapshot of the ``unwind`` command line over ``corpora/``.

A refactoring guard, not a correctness oracle: it runs the CLI in-process over every committed dump
and vmcore in every output mode (plus ``triage`` per arch folder) and keeps, per (input, mode), the
sha256 of stdout and stderr, the exit status, the number of stdout lines and, where the command
writes a file, that file's sha256. A restructure that moves code without meaning to change what it
prints must leave every entry equal.

Run from the repo root::

    python -m tests.snapshot.record                   # (re)write tests/snapshot/snapshot.json
    python -m tests.snapshot.record --check           # compare with it; exit 1 on a mismatch
    python -m tests.snapshot.record --dump OLD        # also write every output under OLD/
    python -m tests.snapshot.record --check --diff-against OLD   # show the first differing lines
    python -m tests.snapshot.record --only riscv      # inputs whose path contains "riscv"

Inputs are given relative to the repo root (the runs' working folder). Outputs are made independent
of the machine before hashing: the temporary output folder (``convert``'s ``wrote <TMP>/out.bin``),
the temporary cache folder and the repo root (``replay --json`` gives the image's absolute path) become
``<TMP>``, ``<CACHE>`` and ``<REPO>``; ``triage``'s elapsed seconds become ``<S>``, and in ``triage
--json`` the run's ``seconds`` and every capture time (a vmcore has none, so triage takes the file's
mtime, i.e. the checkout's time) become ``<TIME>``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("snapshot.json")
CORPORA = "corpora"

#: the placeholders written over the run's machine-dependent strings
TMP, CACHE, ROOT = "<TMP>", "<CACHE>", "<REPO>"

#: replay's output modes: mode name -> the flags after ``replay INPUT --all``
REPLAY_MODES: dict[str, tuple[str, ...]] = {
    "replay": (),
    "replay-json": ("--json",),
    "replay-explain": ("--explain",),
    "replay-complete": ("--complete",),
    "replay-reliable": ("--reliable",),
}

#: ``triage``'s header line ends ``(depth 6, faithful, local:1, 4.3 s)``: the seconds vary
TRIAGE_SECONDS = re.compile(r"(\(depth \d+, \w+, [^,]+, )[0-9.]+ s\)")

#: the keys of ``triage --json`` whose values are times (a run's, or a capture's or file's)
TRIAGE_TIME_KEYS = frozenset({"seconds", "time", "first", "last"})


@dataclass(frozen=True)
class Run:
    """One CLI invocation: its input (relative to the repo root), mode name and arguments.

    ``{tmp}`` in an argument stands for the run's output folder; ``written`` names the file the
    command writes there, hashed too.
    """

    input: str
    mode: str
    argv: tuple[str, ...]
    written: str | None = None


@dataclass(frozen=True)
class Output:
    """What one run produced, normalised."""

    stdout: str
    stderr: str
    status: int
    file: bytes | None

    def entry(self) -> dict[str, Any]:
        """The snapshot entry: hashes, exit status and line count."""
        e: dict[str, Any] = {"stdout": sha256(self.stdout.encode()), "stderr": sha256(self.stderr.encode()),
                             "exit": self.status, "lines": self.stdout.count("\n")}
        if self.file is not None:
            e["file"] = sha256(self.file)
        return e


def sha256(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


# --- the runs ------------------------------------------------------------------------------------

def dumps() -> list[str]:
    """Every committed dump (``stop-*.bin.xz``, beside the images and in ``vmcore/``)."""
    return _glob("*/*/stop-*.bin.xz", "*/*/vmcore/*.bin.xz")


def vmcores() -> list[str]:
    """Every committed vmcore (``vmcore/*.elf.xz``: QEMU slices and the kdump)."""
    return _glob("*/*/vmcore/*.elf.xz")


def _glob(*patterns: str) -> list[str]:
    root = REPO / CORPORA
    return sorted(str(p.relative_to(REPO)) for pat in patterns for p in root.glob(pat))


def slim_image(vmcore: str) -> str:
    """The committed slim image of a vmcore's kernel (in the folder above ``vmcore/``)."""
    (image,) = (REPO / vmcore).parent.parent.glob("vmlinux-*.slim.xz")
    return str(image.relative_to(REPO))


def input_runs(path: str) -> list[Run]:
    """Every mode over one dump or vmcore."""
    runs = [Run(path, mode, ("replay", path, "--all", *flags)) for mode, flags in REPLAY_MODES.items()]
    runs.append(Run(path, "ps", ("ps", path)))
    runs.append(Run(path, "convert", ("convert", path, "-o", "{tmp}/out.bin", "--all"), "out.bin"))
    runs.append(Run(path, "diff", ("diff", path)))
    return runs


def vmcore_runs(path: str) -> list[Run]:
    """The extra modes of a vmcore: with its slim image given (riscv has no VMCOREINFO to find it)."""
    image = slim_image(path)
    return [Run(path, "replay-vmlinux", ("replay", path, "--all", "--vmlinux", image)),
            Run(path, "ps-vmlinux", ("ps", path, "--vmlinux", image))]


def triage_runs() -> list[Run]:
    """``triage`` over each arch folder, in this process, its text and its ``--json``."""
    arches = sorted(str(p.relative_to(REPO)) for p in (REPO / CORPORA).iterdir() if p.is_dir())
    return [Run(a, "triage", ("triage", a, "--workers", "1", "--no-progress", "--json", "{tmp}/triage.json"),
                "triage.json") for a in arches]


def all_runs(only: str | None = None) -> list[Run]:
    """Every run, or those whose input contains ``only``."""
    runs = [r for p in dumps() for r in input_runs(p)]
    runs += [r for p in vmcores() for r in (*input_runs(p), *vmcore_runs(p))]
    runs += triage_runs()
    return [r for r in runs if only is None or only in r.input]


# --- running -------------------------------------------------------------------------------------

@contextlib.contextmanager
def environment() -> Iterator[str]:
    """In the repo root with a fresh, empty cache and no image search path; yields the cache folder."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="unwind-snap-cache-") as cache:
        os.environ["UNWIND_CACHE"] = os.environ["XDG_CACHE_HOME"] = cache
        for name in ("UNWIND_IMAGE_PATH", "UNWIND_CACHE_MAX_MB"):
            os.environ.pop(name, None)
        os.chdir(REPO)
        try:
            yield cache
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


def run(r: Run, cache: str) -> Output:
    """Run ``r`` through :func:`unwind.cli.main.main` in this process, its output normalised."""
    from unwind.cli.main import main

    with tempfile.TemporaryDirectory(prefix="unwind-snap-out-") as tmp:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = _call(main, [a.replace("{tmp}", tmp) for a in r.argv])
        written = Path(tmp, r.written) if r.written else None
        data = written.read_bytes() if written and written.exists() else None
        places = {tmp: TMP, cache: CACHE, str(REPO): ROOT}
        stdout, stderr = (_normalise(s.getvalue(), places, r.mode) for s in (out, err))
    if data is not None and r.mode == "triage":
        data = _normalise_triage_json(data, places)
    return Output(stdout, stderr, status, data)


def _call(main: Any, argv: list[str]) -> int:
    """``main(argv)``'s exit status; argparse's exit as its code, an uncaught exception as -1 (on stderr)."""
    try:
        return int(main(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except Exception as e:  # noqa: BLE001 - a crash is an output too; its traceback names files that move
        print(f"uncaught {type(e).__name__}: {e}", file=sys.stderr)
        return -1


def _normalise(text: str, places: dict[str, str], mode: str) -> str:
    """``text`` with the run's folders as placeholders (and triage's seconds)."""
    for place, name in places.items():
        text = text.replace(place, name)
    return TRIAGE_SECONDS.sub(r"\1<S> s)", text) if mode == "triage" else text


def _normalise_triage_json(data: bytes, places: dict[str, str]) -> bytes:
    """``triage --json``'s document with its times as placeholders, then its folders."""
    def scrub(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: "<TIME>" if k in TRIAGE_TIME_KEYS and v[k] is not None else scrub(v[k]) for k in v}
        return [scrub(x) for x in v] if isinstance(v, list) else v
    text = json.dumps(scrub(json.loads(data)), sort_keys=True, indent=1)
    return _normalise(text, places, "triage").encode()


def record(runs: Sequence[Run], dump_dir: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every run in a fresh :func:`environment`: the snapshot ``{input: {mode: entry}}``."""
    with environment() as cache:
        return collect(runs, cache, dump_dir)


def collect(runs: Sequence[Run], cache: str, dump_dir: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Run each run (inside :func:`environment`, whose cache folder is ``cache``): ``{input: {mode: entry}}``;
    each output written under ``dump_dir`` too if given."""
    snap: dict[str, dict[str, dict[str, Any]]] = {}
    for r in runs:
        o = run(r, cache)
        snap.setdefault(r.input, {})[r.mode] = o.entry()
        if dump_dir is not None:
            write_outputs(dump_dir, r, o)
    return snap


def write_outputs(dump_dir: Path, r: Run, o: Output) -> None:
    """``DIR/INPUT/MODE.{stdout,stderr,exit[,file]}``: two such trees diff with ``diff -r``."""
    base = dump_dir / r.input
    base.mkdir(parents=True, exist_ok=True)
    (base / f"{r.mode}.stdout").write_text(o.stdout)
    (base / f"{r.mode}.stderr").write_text(o.stderr)
    (base / f"{r.mode}.exit").write_text(f"{o.status}\n")
    if o.file is not None:
        (base / f"{r.mode}.file").write_bytes(o.file)


# --- checking ------------------------------------------------------------------------------------

def load() -> dict[str, dict[str, dict[str, Any]]]:
    """The committed snapshot's entries."""
    entries: dict[str, dict[str, dict[str, Any]]] = json.loads(SNAPSHOT.read_text())["entries"]
    return entries


def save(entries: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Write ``snapshot.json``: keys sorted, one (input, mode) entry a line."""
    blocks = []
    for inp, modes in sorted(entries.items()):
        body = ",\n".join(f"   {json.dumps(m)}: {json.dumps(e, sort_keys=True)}" for m, e in sorted(modes.items()))
        blocks.append(f"  {json.dumps(inp)}: {{\n{body}\n  }}")
    SNAPSHOT.write_text('{\n "entries": {\n' + ",\n".join(blocks) + "\n }\n}\n")


def mismatches(expected: dict[str, dict[str, dict[str, Any]]],
               got: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, str]]:
    """(input, mode, what differs) for each entry that differs, is new or is missing."""
    out = []
    for inp in sorted(expected.keys() | got.keys()):
        want, have = expected.get(inp, {}), got.get(inp, {})
        for mode in sorted(want.keys() | have.keys()):
            if mode not in have:
                out.append((inp, mode, "not run (missing from this run)"))
            elif mode not in want:
                out.append((inp, mode, "new (not in the snapshot)"))
            elif want[mode] != have[mode]:
                fields = [f"{k} {want[mode].get(k)} -> {have[mode].get(k)}" if k in ("exit", "lines") else k
                          for k in sorted(want[mode].keys() | have[mode].keys()) if want[mode].get(k) != have[mode].get(k)]
                out.append((inp, mode, "differs: " + ", ".join(fields)))
    return out


def first_differences(old_dir: Path, new_dir: Path, inp: str, mode: str, n: int = 12) -> list[str]:
    """The first ``n`` lines of a unified diff of the two dumped outputs of (input, mode)."""
    lines: list[str] = []
    for stream in ("stdout", "stderr"):
        a, b = (d / inp / f"{mode}.{stream}" for d in (old_dir, new_dir))
        if a.exists() and b.exists():
            lines += list(difflib.unified_diff(a.read_text().splitlines(), b.read_text().splitlines(),
                                               f"old {stream}", f"new {stream}", lineterm="", n=1))
    return lines[:n]


def check(only: str | None, dump_dir: Path | None, against: Path | None) -> list[str]:
    """Run and compare with ``snapshot.json``; a report line per mismatch (empty when all match)."""
    with contextlib.ExitStack() as stack:
        new_dir = dump_dir or (Path(stack.enter_context(tempfile.TemporaryDirectory())) if against else None)
        got = record(all_runs(only), new_dir)
        expected = load()
        if only is not None:
            expected = {i: m for i, m in expected.items() if only in i}
        report = []
        for inp, mode, what in mismatches(expected, got):
            report.append(f"{inp} [{mode}]: {what}")
            if against and new_dir:
                report += [f"    {line}" for line in first_differences(against, new_dir, inp, mode)]
        return report


def main(argv: Sequence[str] | None = None) -> int:
    """Record (default) or ``--check``; exit 1 when a check finds a mismatch."""
    p = argparse.ArgumentParser(prog="python -m tests.snapshot.record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare with snapshot.json instead of writing it")
    p.add_argument("--only", metavar="PATTERN", help="only inputs whose path contains PATTERN")
    p.add_argument("--dump", metavar="DIR", type=Path, help="also write every output under DIR")
    p.add_argument("--diff-against", metavar="DIR", type=Path,
                   help="with --check: a --dump of the old tree, to show each mismatch's first differing lines")
    args = p.parse_args(argv)
    if not args.check:
        if args.only or args.diff_against:
            p.error("--only and --diff-against go with --check (a recording covers every input)")
        entries = record(all_runs(), args.dump)
        save(entries)
        print(f"wrote {SNAPSHOT.relative_to(REPO)}: {sum(map(len, entries.values()))} entries")
        return 0
    report = check(args.only, args.dump, args.diff_against)
    print("\n".join(report) if report else "snapshot: every entry matches")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
