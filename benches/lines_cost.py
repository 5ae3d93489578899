"""What ``unwind replay --lines`` costs: the cold source-line index, and a warm replay with and without lines.

Each figure is measured in a fresh child process, rounds interleaved (without, with, without, ...) so load
from other processes falls on both alike; figures are medians of the children's ``time.process_time``.

- **cold index**: ``LineIndex.of_image`` of the ``-dbg`` vmlinux with an empty ``$UNWIND_CACHE/lines``
  (pyelftools reads every compile unit's line program and subprogram tree), once (``--cold``; minutes);
- **warm replay**: ``Session.load`` of the dump, then every task replayed (``replay_all``) and printed as
  ``unwind replay --all`` prints it, without and with ``--lines`` (the index read from the cache, every
  frame looked up);
- **drgn** (``--drgn-python PY``, a Python with drgn; the dump a vmcore): what a drgn user runs for the
  same listing: ``Program.set_core_dump``, ``load_debug_info`` of the same ``-dbg`` vmlinux, then for
  every task (``for_each_task``) its ``stack_trace`` and each frame's ``name`` and ``source()`` (drgn's
  inline frames included), at most 64 frames a task (drgn loops on some arm64 stacks, as
  ``benchkit.DRGN_MAX_FRAMES`` says). drgn keeps no index between runs: each child indexes the DWARF
  again (in C, on every core; ``process_time`` counts all its threads).

Each round runs without, with, drgn, one after the other. ::

    python benches/lines_cost.py corpora/x86_64/6.12.117+deb13-amd64/vmcore/stop-001-random.elf.xz \\
        --vmlinux ~/.cache/unwind/kernels/6.12.117+deb13-amd64/vmlinux --rounds 5 [--cold] [--drgn-python PY]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REPLAY = """
import json, sys, time
t0 = time.process_time()
from unwind.core.target import Options
from unwind.session.output import replay_text
from unwind.session.replay import Session
s = Session.load(sys.argv[1])
sources = None
if sys.argv[2] == "lines":
    sources = s.source_lines()
    assert sources.index is not None, sources.note
t1 = time.process_time()
tasks = s.select(every=True)
replays = list(s.replay_all(Options(), tasks, lines=sources is not None))
out = [line for r in replays for line in replay_text(s, r, sources=sources)]
t2 = time.process_time()
frames = [f for r in replays for f in r.frames]
known = sum(1 for f in frames if f.line is not None)
print(json.dumps({"load": t1 - t0, "replay": t2 - t1, "total": t2 - t0, "tasks": len(tasks), "lines": len(out),
                  "frames": len(frames), "known": known}))
"""

COLD = """
import json, sys, time
from unwind.formats.dwarf_lines import LineIndex
from unwind.formats.image import Image
t0 = time.process_time()
w0 = time.perf_counter()
index = LineIndex.of_image(Image(sys.argv[1]))
print(json.dumps({"cold": time.process_time() - t0, "cold_wall": time.perf_counter() - w0, "rows": len(index)}))
"""


DRGN = """
import json, sys, time
t0 = time.process_time()
import drgn
from drgn.helpers.linux.pid import for_each_task
prog = drgn.Program()
prog.set_core_dump(sys.argv[1])
try:
    prog.load_debug_info([sys.argv[2]])
except drgn.MissingDebugInfoError:
    pass  # modules without debug info: the kernel's own file was loaded
t1 = time.process_time()
tasks = frames = known = 0
out = []
for task in for_each_task(prog):
    tasks += 1
    try:
        trace = prog.stack_trace(task)
    except (ValueError, LookupError, drgn.FaultError):
        continue
    for i in range(min(len(trace), 64)):  # drgn loops on some arm64 stacks (benchkit.DRGN_MAX_FRAMES)
        frame = trace[i]
        frames += 1
        try:
            file, line, _ = frame.source()
            known += 1
        except LookupError:
            file, line = "??", 0
        out.append(f"{frame.name} {file}:{line}")
t2 = time.process_time()
print(json.dumps({"load": t1 - t0, "replay": t2 - t1, "total": t2 - t0, "tasks": tasks, "lines": len(out),
                  "frames": frames, "known": known}))
"""


def _child(code: str, env: dict[str, str], *args: str, python: str = sys.executable) -> dict[str, float]:
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.splitlines()[-1])


def _plain(dump: Path, tmp: Path) -> Path:
    """The vmcore as drgn opens it: decompressed into ``tmp`` when it is ``.xz``."""
    if dump.suffix != ".xz":
        return dump
    out = tmp / dump.stem
    with lzma.open(dump) as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump", help="a dump or vmcore whose kernel's -dbg vmlinux is at hand")
    p.add_argument("--vmlinux", required=True, help="the -dbg vmlinux (found for --lines by build-id: its folder "
                   "is put in $UNWIND_IMAGE_PATH)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cold", action="store_true", help="also time the cold index (an empty lines cache)")
    p.add_argument("--drgn-python", metavar="PY", help="a Python with drgn: also time drgn listing every task's "
                   "frames with their source lines (the dump must be a vmcore)")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "UNWIND_IMAGE_PATH": os.pathsep.join(filter(None, [os.environ.get("UNWIND_IMAGE_PATH"),
                                                               str(Path(args.vmlinux).resolve().parent)]))}
    result: dict[str, object] = {}
    if args.cold:
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(os.environ.get("UNWIND_CACHE") or Path.home() / ".cache" / "unwind")
            for kind in ("symbols", "images"):  # what is not the line index stays warm
                if (cache / kind).is_dir():
                    shutil.copytree(cache / kind, Path(tmp) / kind)
            result.update(_child(COLD, {**env, "UNWIND_CACHE": tmp}, args.vmlinux))
    _child(REPLAY, env, args.dump, "lines")  # the index into the cache, once
    runs: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        core = _plain(Path(args.dump), Path(tmp)) if args.drgn_python else None
        if core is not None:
            runs["drgn"] = []
        for _ in range(args.rounds):
            runs["without"].append(_child(REPLAY, env, args.dump, "plain"))
            runs["with"].append(_child(REPLAY, env, args.dump, "lines"))
            if core is not None:
                runs["drgn"].append(_child(DRGN, env, str(core), args.vmlinux, python=args.drgn_python))
    for mode, rs in runs.items():
        for key in ("load", "replay", "total"):
            result[f"{mode}_{key}"] = statistics.median(r[key] for r in rs)
        result[f"{mode}_lines"] = rs[0]["lines"]
    for mode in ("with", "drgn"):
        if mode in runs:
            for key in ("frames", "known"):
                result[f"{mode}_{key}"] = runs[mode][0][key]
    result["tasks"] = runs["with"][0]["tasks"]
    result["extra_total"] = result["with_total"] - result["without_total"]  # type: ignore[operator]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
