"""What ``unwind replay --lines`` costs: the cold source-line index, and a warm replay with and without lines.

Each figure is measured in a fresh child process, rounds interleaved (without, with, without, ...) so load
from other processes falls on both alike; figures are medians of the children's ``time.process_time``.

- **cold index**: ``LineIndex.of_image`` of the ``-dbg`` vmlinux with an empty ``$UNWIND_CACHE/lines``
  (pyelftools reads every compile unit's line program and subprogram tree), once (``--cold``; minutes);
- **warm replay**: ``Session.load`` of the dump, then every task replayed (``replay_all``) and printed as
  ``unwind replay --all`` prints it, without and with ``--lines`` (the index read from the cache, every
  frame looked up).

::

    python benches/lines_cost.py corpora/x86_64/6.12.117+deb13-amd64/stop-014-hijack-urandom_read_iter.bin.xz \\
        --vmlinux ~/.cache/unwind/kernels/6.12.117+deb13-amd64/vmlinux --rounds 5 [--cold]
"""

from __future__ import annotations

import argparse
import json
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
    from unwind.session.lines import FrameLines
    sources = FrameLines.of_session(s)
    assert sources.index is not None, sources.note
t1 = time.process_time()
tasks = s.select(every=True)
out = [line for r in s.replay_all(Options(), tasks) for line in replay_text(s, r, sources=sources)]
t2 = time.process_time()
print(json.dumps({"load": t1 - t0, "replay": t2 - t1, "total": t2 - t0, "tasks": len(tasks), "lines": len(out)}))
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


def _child(code: str, env: dict[str, str], *args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump", help="a dump or vmcore whose kernel's -dbg vmlinux is at hand")
    p.add_argument("--vmlinux", required=True, help="the -dbg vmlinux (found for --lines by build-id: its folder "
                   "is put in $UNWIND_IMAGE_PATH)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cold", action="store_true", help="also time the cold index (an empty lines cache)")
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
    for _ in range(args.rounds):
        runs["without"].append(_child(REPLAY, env, args.dump, "plain"))
        runs["with"].append(_child(REPLAY, env, args.dump, "lines"))
    for mode, rs in runs.items():
        for key in ("load", "replay", "total"):
            result[f"{mode}_{key}"] = statistics.median(r[key] for r in rs)
        result[f"{mode}_lines"] = rs[0]["lines"]
    result["tasks"] = runs["with"][0]["tasks"]
    result["extra_total"] = result["with_total"] - result["without_total"]  # type: ignore[operator]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
