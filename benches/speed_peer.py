"""Per-frame replay against drgn, CPU and wall time, same run: the report's headline (issue 14).

Every measurement runs in a fresh child process, and the children are interleaved round by round,
so load from other processes falls on all of them alike. Each child times ``--passes`` warm passes
and keeps the fastest, by ``time.process_time`` (CPU) and by ``time.perf_counter`` (wall) alike;
the figures are medians over rounds, divided by the frames each side walked.

- **ours, corpora**: ``Session.replay(task, Options(), symbolize=False)`` of every task of every
  committed dump of the arch (the call-site check on), on sessions just opened (**fresh**) and
  again (**warm**): the single-task targets;
- **ours, vmcores**: the same call on the committed vmcores (``corpora/<arch>/*/vmcore/*.elf.xz``,
  with the committed slim image), the tasks drgn walks there. A committed vmcore is a slice of the
  lab's full one, cut to the pages our walk and drgn's task list read; drgn's ORC unwinder also reads
  the kernel's ORC tables from memory, which the slice leaves out, so where the full vmcore of the
  same stop is at hand (``--vmcores DIR``: ``DIR/<arch>/<stop>.elf``, default ``$UNWIND_VMCORES`` or
  ``/work/lab-out/vmcores``) both sides read that one;
- **drgn, equal inputs**: drgn 0.3.0 ``stack_trace`` of the same tasks with the debug vmlinux of
  the same build-id stripped of its CFI, so that it unwinds as we do (ORC on x86-64, frame pointers
  on arm64; :func:`replay_speed._drgn_vmlinux`);
- **drgn, DWARF**: the same with the full debug vmlinux, CFI included (drgn's default).

drgn has no riscv unwinder; riscv has the corpus rows only::

    python benches/speed_peer.py --rounds 3 --drgn-python /path/to/venv-with-drgn/bin/python --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_speed import _IMPORT_ROOT, ROOT, _peers, _run  # noqa: E402

ARCHES = ("arm64", "x86_64", "riscv")

_TIMED = r"""
import gc, time
def timed(fn, passes):
    best_cpu = best_wall = 1e9
    for _ in range(passes):
        gc.collect()
        c, w = time.process_time(), time.perf_counter()
        fn()
        best_cpu, best_wall = min(best_cpu, time.process_time() - c), min(best_wall, time.perf_counter() - w)
    return best_cpu, best_wall
"""

OURS_CORPUS = _IMPORT_ROOT + _TIMED + r"""
import glob, json
from unwind.replay import Options, load_session
paths = sorted(glob.glob(sys.argv[3] + "/*/stop-*.bin.xz"))
sessions = [load_session(p) for p in paths]
todo = [(s, s.select(every=True)) for s in sessions]
c, w = time.process_time(), time.perf_counter()
frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for s, ts in todo for t in ts)
fresh, fresh_wall = time.process_time() - c, time.perf_counter() - w
warm, warm_wall = timed(lambda: [s.replay(t, Options(), symbolize=False) for s, ts in todo for t in ts],
                        int(sys.argv[4]))
print(json.dumps({"dumps": len(paths), "tasks": sum(len(ts) for _, ts in todo), "frames": frames,
                  "fresh": fresh, "fresh_wall": fresh_wall, "warm": warm, "warm_wall": warm_wall}))
"""

OURS_VMCORE = _IMPORT_ROOT + _TIMED + r"""
import json
from unwind.replay import Options, Session
s = Session.load(sys.argv[3], vmlinux=sys.argv[4])
want = json.loads(sys.argv[5])
todo = [t for t in s.select(every=True) if [t.pid, t.cpu if t.running else None] in want]
frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for t in todo)
warm, warm_wall = timed(lambda: [s.replay(t, Options(), symbolize=False) for t in todo], int(sys.argv[6]))
print(json.dumps({"tasks": len(todo), "frames": frames, "warm": warm, "warm_wall": warm_wall}))
"""

DRGN = _TIMED + r"""
import json, os, sys
os.environ["DRGN_PREFER_ORC_UNWINDER"] = "1"
import drgn
from drgn.helpers.linux.pid import for_each_task
from drgn.helpers.linux.sched import task_cpu
prog = drgn.Program()
prog.set_core_dump(sys.argv[1])
try:
    prog.load_debug_info([sys.argv[2]])
except drgn.MissingDebugInfoError:
    pass
tasks, keys = [], []
for t in for_each_task(prog):
    try:
        [f.pc for f in prog.stack_trace(t)]
    except Exception:
        continue
    on_cpu = bool(t.on_cpu.value_()) if hasattr(t, "on_cpu") else False
    tasks.append(t)
    keys.append([t.pid.value_(), task_cpu(t) if on_cpu else None])
def walk():
    n = 0
    for t in tasks:
        for f in prog.stack_trace(t):
            f.pc
            n += not f.is_inline
    return n
frames = walk()
warm, warm_wall = timed(walk, int(sys.argv[3]))
print(json.dumps({"tasks": len(tasks), "frames": frames, "warm": warm, "warm_wall": warm_wall, "keys": keys}))
"""


def _med(runs: list[dict], key: str) -> float:
    """Median over rounds of ``key`` per frame, in µs."""
    return statistics.median(r[key] / r["frames"] * 1e6 for r in runs)


def _summed(runs: list[dict], per_round: int) -> list[dict]:
    """Several vmcores per arch: each round's parts summed."""
    return [{k: sum(r[k] for r in runs[i:i + per_round]) for k in ("tasks", "frames", "warm", "warm_wall")}
            for i in range(0, len(runs), per_round)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=3, help="warm passes per child; the fastest counts (default 3)")
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeat for several (default: all)")
    p.add_argument("--drgn-python", help="a python with drgn installed: adds the drgn rows")
    p.add_argument("--vmlinux-dir", type=Path, default=Path.home() / ".cache/unwind/kernels",
                   help="<release>/vmlinux debug images for drgn (default: the lab's fetched kernels)")
    p.add_argument("--vmcores", type=Path, default=Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores")),
                   help="the lab's full vmcores, DIR/<arch>/<stop>.elf, read instead of the committed slices")
    p.add_argument("--json", type=Path, help="write every child's figures here")
    a = p.parse_args(argv)
    arches = a.arch or list(ARCHES)
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        peers = _peers(Path(tmp), arches, a.vmlinux_dir) if a.drgn_python else {}
        keys: dict[Path, str] = {}
        for _ in range(a.rounds):
            for arch in arches:
                runs.setdefault(f"{arch} corpus", []).append(
                    _run(sys.executable, OURS_CORPUS, str(ROOT), arch, str(ROOT / "corpora" / arch), str(a.passes)))
                for elf, slim, plain in peers.get(arch, []):
                    release, _, stop = elf.name.partition("-stop-")
                    full = a.vmlinux_dir / release / "vmlinux"
                    whole = a.vmcores / arch / f"stop-{stop}"
                    elf = whole if stop and whole.exists() else elf
                    for name, image in (("drgn equal", plain), ("drgn dwarf", full)):
                        d = _run(a.drgn_python, DRGN, str(elf), str(image), str(a.passes))
                        want = json.dumps(d.pop("keys"))
                        keys.setdefault(elf, want)
                        runs.setdefault(f"{arch} {name}", []).append(d)
                    runs.setdefault(f"{arch} ours", []).append(
                        _run(sys.executable, OURS_VMCORE, str(ROOT), arch, str(elf), str(slim), keys[elf], str(a.passes)))
        per_round = {arch: len(peers.get(arch, [])) for arch in arches}
    out = {"rounds": a.rounds, "passes": a.passes, "runs": runs, "vmcores_per_round": per_round}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    print(f"µs per frame, CPU / wall, median of {a.rounds} rounds (fastest of {a.passes} warm passes per child)\n")
    print("| arch | corpus tasks / frames | ours fresh | ours warm | vmcore frames ours / drgn | ours | "
          "drgn ORC/FP | drgn DWARF | drgn ORC/FP / ours |")
    print("|---" * 9 + "|")
    for arch in arches:
        c = runs[f"{arch} corpus"]
        cells = [f"{c[0]['tasks']} / {c[0]['frames']}", f"{_med(c, 'fresh'):.2f} / {_med(c, 'fresh_wall'):.2f}",
                 f"{_med(c, 'warm'):.2f} / {_med(c, 'warm_wall'):.2f}"]
        if per_round.get(arch):
            o, e, d = (_summed(runs[f"{arch} {k}"], per_round[arch]) for k in ("ours", "drgn equal", "drgn dwarf"))
            cells += [f"{o[0]['frames']} / {e[0]['frames']}",
                      *(f"{_med(x, 'warm'):.2f} / {_med(x, 'warm_wall'):.2f}" for x in (o, e, d)),
                      f"{_med(e, 'warm') / _med(o, 'warm'):.2f}"]
        else:
            cells += ["–"] * 5
        print(f"| {arch} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
