"""Batch replay speed: ``unwind.session.batch.replay_all`` against ``Session.replay`` task by task and drgn, CPU time.

Every measurement runs in a fresh child process and the children are interleaved round by round
(ours, then drgn, for each arch), so load from other processes falls on all of them alike. Figures
are medians over rounds of ``time.process_time``; within a child each warm figure is the fastest of
``--passes`` passes. The JSON (``--json``) also has each time's wall-clock twin (``<key>_wall``,
``time.perf_counter``, the fastest pass). Frames per second count the frames each path reports.

Ours, on the committed corpora (``corpora/<arch>/*/stop-*.bin.xz``, every task, symbols off):

- **scalar**: ``Session.replay(task, Options(), symbolize=False)`` of every task, on sessions just
  opened (**fresh**) and again (**warm**);
- **batch, fresh**: ``replay_all(sessions, tasks=...)`` of all dumps of the arch in one batch, on
  sessions just opened (their memory as words, per-dump constants, each image's table of call-site verdicts:
  everything the batch sets up), the process's first batch; the images are those the scalar walk before opened
  and still holds (a load reuses an open image), so the verdicts themselves are decided already;
- **batch, next**: the same on the dumps opened anew once more, after the process has walked them: a later
  batch of the process on sessions just opened, as a fleet worker walks its next chunk of dumps (its images
  open already, as a worker keeps them); the process's first batch (**fresh**) pays besides for what the
  process sets up once: the pages its heap first takes (~500-1,500 page faults, ~2 µs each on a VM) and each
  image's call-site verdicts;
- **batch, warm**: the same again; **per dump**: one ``Session.replay_all(lockstep=True)`` per dump (short
  batches, in lockstep although under ``unwind.session.batch.MIN_TASKS``); **per dump + read**: one
  ``Session.replay_all`` per dump as ``unwind replay --all`` makes it (a corpus dump has fewer tasks than
  ``MIN_TASKS``: walked task by task), every replay read, all frames counted: compare it with **scalar warm**;
- **batch, fresh in a warm process** (``--no-warm-process`` leaves it out; the figure the batch targets are
  judged on): the fresh batch again, in a child that, after its scalar walk, opened two dumps of another arch,
  walked them in one batch and dropped them (untimed), then opened this arch's dumps and walked them as **fresh**
  does: a fleet worker's first chunk of kernels it has not batched, after an earlier chunk. It pays what fresh pays
  per image (each image's batch constants and its table of call-site verdicts) and per dump, not what a process
  pays once: numpy's first call of each operation (a set-up inside numpy, 5-90 µs apiece) and the pages its heap
  first takes, together ~0.9 ms of riscv's first batch (in the JSON as ``warm_process``);
- **faults**: the minor page faults (``getrusage``) of the fresh batch, the fresh one in a warm process and the next
  batch, in the JSON as ``fresh_minflt`` (of ``ours`` and of ``warm_process``) and ``next_minflt`` and printed below
  the table: a first batch touches pages new to the
  process (its heap growing, code run for the first time);
- the batch figures count the frames the lockstep walked (its share of tasks is shown); set-up
  (lane inputs, memory, call-site flags, stops) is inside the time; the tasks it hands back are
  walked by ``Session.replay`` when read, which **batch + read** adds: every ``Replay`` of every
  task built (frames as objects), all frames counted.

Each timed call starts after ``gc.collect()``: a collection of earlier work's garbage would
otherwise fall on whichever call triggers it. Imports (numpy, the batch modules) are start-up,
timed by ``benches/startup.py``: the children import them first. The call-site verdicts are per
image and shared by both paths: the warm figures come from sessions whose images decided them
already; each fresh figure opens the dumps again (an image still open is reused, as in one process).

drgn (``--drgn-python``) walks the committed vmcores (``corpora/<arch>/<release>/vmcore/*.elf.xz``, or the
lab's full vmcore of the same stop where it is at hand) with the committed slim image as its kernel file,
from a ``struct pt_regs`` of each task's registers (``benchkit.DRGN_CHILD`` mode ``regs``, its bare unwinder: ORC
on x86-64, frame pointers on arm64, no type lookups, nothing looked up in DWARF per frame); the tasks are those ``benchkit.peer_keys`` picks; ours walks the same tasks of the same vmcore
with the same slim image, scalar and batch (**batch**: in lockstep, ``lockstep=True``, as one vmcore has
fewer tasks than ``unwind.session.batch.MIN_TASKS``; **batch + read**: ``replay_all`` as called, so task by task).
drgn's rate is its kernel frames per CPU second over the tasks it walks no user frame of (it walks on into
user frames in the same call, time that cannot be split off)::

    python benches/batch_replay.py --rounds 3 --drgn-python /path/to/venv-with-drgn/bin/python
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
from benchkit import DRGN_CHILD, IMPORT_ROOT, REPO, drgn_args, peer_cores, peer_keys, run_child  # noqa: E402

ROOT = REPO

ARCHES = ("arm64", "riscv", "x86_64")
#: the arch whose dumps a warm-process child batches first
OTHER_ARCH = {"arm64": "riscv", "riscv": "arm64", "x86_64": "arm64"}

OURS = IMPORT_ROOT + r"""
import gc, glob, importlib, json, resource, time
from unwind.session.batch import replay_all
from unwind.session.replay import Options, load_session
importlib.import_module("unwind.arch." + sys.argv[2] + ".batch")  # imports are start-up (benches/startup.py)
paths = sorted(glob.glob(sys.argv[3] + "/*/stop-*.bin.xz"))
passes = int(sys.argv[4])
def opened(paths=paths):
    sessions = [load_session(p) for p in paths]
    return sessions, [s.select(every=True) for s in sessions]
def scalar(sessions, tasks):
    return sum(len(s.replay(t, Options(), symbolize=False).frames) for s, ts in zip(sessions, tasks) for t in ts)
def walked(batches):
    return sum(b.batched_frames for b in batches)
WALL, FAULTS = {}, {}
def timed(fn, key=None):
    gc.collect()  # garbage of earlier work is not this call's cost
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    w0, t0 = time.perf_counter(), time.process_time()
    out = fn()
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    if key is not None:
        WALL[key] = min(WALL.get(key, 1e9), wall)
        FAULTS[key] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return cpu, out
sessions, tasks = opened()
frames = scalar(sessions, tasks)  # warms these sessions' images (call-site verdicts) for the warm passes
warm_process = len(sys.argv) > 6  # one batch of another arch's dumps walked just before, untimed; fresh timed only
if warm_process:
    importlib.import_module("unwind.arch." + sys.argv[5] + ".batch")
    other_s, other_t = opened(sorted(glob.glob(sys.argv[6] + "/*/stop-*.bin.xz"))[:2])
    replay_all(other_s, tasks=other_t, symbolize=False, lockstep=True)
    del other_s, other_t
fresh_s, fresh_t = opened()  # the images still open are reused: their verdicts are decided, their batch tables not
t_fresh, batches = timed(lambda: replay_all(fresh_s, tasks=fresh_t, symbolize=False), "fresh")
out = {"tasks": sum(map(len, tasks)), "frames": frames, "batched_frames": walked(batches),
       "batched_tasks": sum(b.batched(i) for b in batches for i in range(len(b))), "fresh": t_fresh}
del batches
if warm_process:
    print(json.dumps({**out, "fresh_minflt": FAULTS["fresh"], "fresh_wall": WALL["fresh"]}))
    sys.exit()
fresh_s, fresh_t = opened()
out["fresh_scalar"] = timed(lambda: scalar(fresh_s, fresh_t), "fresh_scalar")[0]
fresh_s, fresh_t = opened()  # the dumps opened anew once more: a later batch of the process, as a worker's next chunk
out["next"] = timed(lambda: replay_all(fresh_s, tasks=fresh_t, symbolize=False), "next")[0]
del fresh_s, fresh_t
best = {k: 1e9 for k in ("scalar", "warm", "per_dump", "read", "per_dump_read")}
for _ in range(passes):
    best["scalar"] = min(best["scalar"], timed(lambda: scalar(sessions, tasks), "scalar")[0])
    best["warm"] = min(best["warm"], timed(lambda: replay_all(sessions, tasks=tasks, symbolize=False), "warm")[0])
    best["per_dump"] = min(best["per_dump"], timed(lambda: [s.replay_all(tasks=t, symbolize=False, lockstep=True)
                                                            for s, t in zip(sessions, tasks)], "per_dump")[0])
    t, n = timed(lambda: sum(len(r.frames) for s, ts in zip(sessions, tasks)
                             for r in s.replay_all(tasks=ts, symbolize=False)), "per_dump_read")
    assert n == frames
    best["per_dump_read"] = min(best["per_dump_read"], t)
    t, n = timed(lambda: sum(len(r.frames) for b in replay_all(sessions, tasks=tasks, symbolize=False) for r in b),
                 "read")
    assert n == frames
    best["read"] = min(best["read"], t)
out.update(best)
out.update({k + "_wall": v for k, v in WALL.items()})
out.update({k + "_minflt": FAULTS[k] for k in ("fresh", "next")})
print(json.dumps(out))
"""

#: ours on a peer vmcore: the tasks drgn walked (pids, or cpu for a running idle task), scalar and batch
OURS_PEER = IMPORT_ROOT + r"""
import gc, importlib, json, time
from unwind.session.replay import Options, Session
importlib.import_module("unwind.arch." + sys.argv[2] + ".batch")  # imports are start-up (benches/startup.py)
s = Session.load(sys.argv[3], vmlinux=sys.argv[4])
want = {(k[0], k[1]) for k in json.loads(sys.argv[5])}
todo = [t for t in s.select(every=True) if (t.pid, t.cpu if t.running else None) in want]
frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for t in todo)
b = s.replay_all(tasks=todo, symbolize=False, lockstep=True)  # one vmcore: fewer tasks than MIN_TASKS
out = {"frames": frames, "tasks": len(todo), "batched_tasks": sum(b.batched(i) for i in range(len(b))),
       "batched_frames": b.batched_frames}
best = {"scalar": 1e9, "warm": 1e9, "read": 1e9}
WALL = {}
def timed(fn, key):
    gc.collect()  # garbage of earlier work is not this call's cost
    w0, t0 = time.perf_counter(), time.process_time()
    fn()
    WALL[key] = min(WALL.get(key, 1e9), time.perf_counter() - w0)
    return time.process_time() - t0
for _ in range(int(sys.argv[6])):
    best["scalar"] = min(best["scalar"], timed(lambda: [s.replay(t, Options(), symbolize=False) for t in todo],
                                               "scalar"))
    best["warm"] = min(best["warm"], timed(lambda: s.replay_all(tasks=todo, symbolize=False, lockstep=True),
                                           "warm"))
    best["read"] = min(best["read"], timed(lambda: [r.frames for r in s.replay_all(tasks=todo, symbolize=False)],
                                           "read"))
out.update({k + "_wall": v for k, v in WALL.items()})
out.update(best)
print(json.dumps(out))
"""


def _rate(runs: list[dict], time_key: str, frames_key: str) -> float:
    """Median over rounds of frames per CPU second, in millions (0 where nothing was walked)."""
    return statistics.median(r[frames_key] / r[time_key] / 1e6 if r[time_key] else 0.0 for r in runs)


def _median_count(runs: list[dict], key: str) -> str:
    """The median over rounds of the count ``key``."""
    return f"{statistics.median(r[key] for r in runs):.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=5, help="warm passes per child; the fastest counts (default 5)")
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeat for several (default: all)")
    p.add_argument("--corpora", type=Path, default=ROOT / "corpora", help="corpora/<arch>/ of each arch")
    p.add_argument("--drgn-python", help="a python with drgn installed: adds the drgn peer")
    p.add_argument("--vmlinux-dir", type=Path, default=Path(os.environ.get("UNWIND_CACHE", Path.home() / ".cache/unwind"))
                   / "kernels",
                   help="<release>/vmlinux debug images for drgn (default: the lab's fetched kernels)")
    p.add_argument("--vmcores", type=Path, default=Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores")),
                   help="the lab's full vmcores, DIR/<arch>/<stop>.elf, read instead of the committed slices")
    p.add_argument("--json", type=Path, help="write every child's figures here")
    p.add_argument("--no-warm-process", action="store_true", help="leave out the fresh batch in a warm process")
    a = p.parse_args()
    arches = a.arch or list(ARCHES)
    ours: dict[str, list[dict]] = {}
    warm_process: dict[str, list[dict]] = {}
    peer: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cores = peer_cores(Path(tmp), arches, a.vmlinux_dir, a.vmcores) if a.drgn_python else {}
        keys = {pc: json.dumps(found[0]) for cs in cores.values() for pc in cs
                if (found := peer_keys(a.drgn_python, pc)) is not None}
        for _ in range(a.rounds):
            for arch in arches:
                ours.setdefault(arch, []).append(run_child(sys.executable, OURS, str(ROOT), arch,
                                                           str(a.corpora / arch), str(a.passes)))
                if not a.no_warm_process:
                    other = OTHER_ARCH[arch]
                    warm_process.setdefault(arch, []).append(
                        run_child(sys.executable, OURS, str(ROOT), arch, str(a.corpora / arch), str(a.passes), other,
                                  str(a.corpora / other)))
                for pc in (pc for pc in cores.get(arch, []) if pc in keys):
                    d = run_child(a.drgn_python, DRGN_CHILD, *drgn_args("regs", pc, a.passes, keys[pc]))
                    for k in ("keys", "pcs", "names", "user"):
                        d.pop(k)
                    peer.setdefault((arch, "drgn"), []).append(d)
                    peer.setdefault((arch, "ours"), []).append(
                        run_child(sys.executable, OURS_PEER, str(ROOT), arch, str(pc.core), str(pc.slim), keys[pc],
                                  str(a.passes)))
    if a.json:
        a.json.write_text(json.dumps({"ours": ours, "warm_process": warm_process,
                                      "peer": {f"{k[0]} {k[1]}": v for k, v in peer.items()}}, indent=1))
    print(f"M frames per CPU second, median of {a.rounds} rounds (time.process_time in fresh child processes)\n")
    print("| arch | tasks (batched) | frames (batched) | scalar fresh | scalar warm | batch fresh "
          "| batch fresh, warm process | batch next | batch warm | per dump | batch + read | per dump + read "
          "| fresh / scalar | warm / scalar |")
    print("|---" * 14 + "|")

    def warmed(arch: str) -> str:
        return f"{_rate(warm_process[arch], 'fresh', 'batched_frames'):.2f}" if arch in warm_process else "-"
    for arch in arches:
        runs = ours[arch]
        r0 = runs[0]
        scalar = _rate(runs, "scalar", "frames")
        warm, fresh = _rate(runs, "warm", "batched_frames"), _rate(runs, "fresh", "batched_frames")
        fresh_scalar = _rate(runs, "fresh_scalar", "frames")
        print(f"| {arch} | {r0['tasks']} ({r0['batched_tasks']}) | {r0['frames']} ({r0['batched_frames']}) | "
              f"{fresh_scalar:.3f} | {scalar:.3f} | {fresh:.2f} | {warmed(arch)} | "
              f"{_rate(runs, 'next', 'batched_frames'):.2f} | "
              f"{warm:.2f} | "
              f"{_rate(runs, 'per_dump', 'batched_frames'):.2f} | {_rate(runs, 'read', 'frames'):.3f} | "
              f"{_rate(runs, 'per_dump_read', 'frames'):.3f} | "
              f"{fresh / fresh_scalar:.1f} | {warm / scalar:.1f} |")
    faults = (f"{arch} {_median_count(ours[arch], 'fresh_minflt')} / "
              f"{_median_count(warm_process[arch], 'fresh_minflt') if arch in warm_process else '-'} / "
              f"{_median_count(ours[arch], 'next_minflt')}" for arch in arches)
    print("\nminor page faults of a batch, median (first batch / first in a warm process / next): " + ", ".join(faults))
    if peer:
        print("\ndrgn's bare unwinder: the committed vmcores, the tasks drgn walks (drgn from pt_regs with the slim image: "
              "ORC on x86-64, frame pointers on arm64; its rate over the kernel-only tasks); M frames per CPU second, warm\n")
        print("| arch | tasks (batched) | frames ours / drgn | drgn | scalar | batch | batch + read | batch / drgn "
              "| batch + read / drgn |")
        print("|---" * 9 + "|")
        for arch in arches:
            if (arch, "drgn") not in peer:
                continue
            per_round = len(peer[(arch, "drgn")]) // a.rounds

            def total(name: str) -> list[dict]:
                rs = peer[(arch, name)]
                return [{k: sum(r.get(k, 0) for r in rs[i:i + per_round]) for k, v in rs[0].items()
                         if isinstance(v, (int, float))} for i in range(0, len(rs), per_round)]
            d, o = total("drgn"), total("ours")
            dr = _rate(d, "k_warm", "k_frames")
            batch, read = _rate(o, "warm", "batched_frames"), _rate(o, "read", "frames")
            ratios = f"{batch / dr:.1f} | {read / dr:.2f}" if dr else "- | -"
            print(f"| {arch} | {o[0]['tasks']} ({o[0]['batched_tasks']}) | {o[0]['frames']} / {d[0]['frames']} | "
                  f"{dr:.3f} | {_rate(o, 'scalar', 'frames'):.3f} | {batch:.2f} | {read:.3f} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
