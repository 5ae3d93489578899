"""Single-task replay speed: ``Session.replay(task, Options(), symbolize=False)`` per frame, in CPU time.

Compares this checkout with another one (``--base``, e.g. a ``git worktree`` of main) on the same
committed corpora, and with drgn on equal inputs (``--drgn-python``). Every measurement runs in a fresh
child process and the children are interleaved round by round (base, new, drgn for each arch), so load
from other processes falls on all of them alike. Figures are medians over rounds of
``time.process_time``, divided by the frames walked::

    git worktree add --detach /tmp/base main
    python benches/replay_speed.py --base /tmp/base --rounds 3 \\
        --drgn-python /path/to/venv-with-drgn/bin/python

- **first**: the first replay of every task of each dump, in a process that opens the dumps one by one
  (the first walk over each image also decodes its ORC table and decides its call sites);
- **fresh**: the first replay of every task of a new :class:`Session` of each dump, its image already
  open (as in a batch over many dumps of one kernel: the image's tables and verdicts are shared);
- **warm**: every task of every dump replayed again, ``--passes`` times; the fastest pass counts (the
  least disturbed by other processes).

The drgn peer walks the committed vmcores (``corpora/<arch>/<release>/vmcore/*.elf.xz``, decompressed
to a temporary folder): ours opens each with its committed slim image, drgn with the debug vmlinux of
the same build-id (``--vmlinux-dir``, default the lab's fetched kernels) from which the unwind tables
are removed (``.debug_frame``, ``.eh_frame``), so that drgn unwinds as we do: ORC on x86-64 and frame
pointers on arm64 (drgn has no riscv unwinder). Both sides walk every task drgn can walk (tasks drgn
refuses are left out of both); each side's time is divided by its own frames (drgn's inline frames
are not counted).
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
ARCHES = ("x86_64", "arm64", "riscv")
#: the figures of each checkout, per arch
KINDS = ("first", "fresh", "warm")

#: the child imports ``unwind`` (and ``unwind.arch`` from ``arch/``) from the checkout it is given
_IMPORT_ROOT = r"""
import importlib.machinery, importlib.util, sys
ROOT = sys.argv[1]
class _Checkout:
    PLACES = {"unwind": ROOT + "/unwind", "unwind.arch": ROOT + "/arch"}
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        where = cls.PLACES.get(name)
        if where is None:
            return None
        return importlib.util.spec_from_file_location(name, where + "/__init__.py",
                                                      submodule_search_locations=[where])
sys.meta_path.insert(0, _Checkout)
import unwind
assert unwind.__file__.startswith(ROOT), unwind.__file__
"""

OURS = _IMPORT_ROOT + r"""
import json, time
from unwind.replay import Options, load_session
from unwind.tools import paths_under
frames = tasks = 0
fresh, warm = 0.0, None
sessions = []
for path in paths_under(sys.argv[3]):
    s = load_session(path)
    todo = s.select(every=True)
    t0 = time.process_time()
    for t in todo:
        frames += len(s.replay(t, Options(), symbolize=False).frames)
    fresh += time.process_time() - t0
    tasks += len(todo)
    sessions.append((s, todo))
for _ in range(int(sys.argv[4])):
    t0 = time.process_time()
    for s, todo in sessions:
        for t in todo:
            s.replay(t, Options(), symbolize=False)
    warm = min(warm or 1e9, time.process_time() - t0)
again = 0.0
for path in paths_under(sys.argv[3]):  # a new Session of each dump, its image already open
    s = load_session(path)
    todo = s.select(every=True)
    t0 = time.process_time()
    for t in todo:
        s.replay(t, Options(), symbolize=False)
    again += time.process_time() - t0
print(json.dumps({"frames": frames, "tasks": tasks, "first": fresh, "fresh": again, "warm": warm}))
"""

#: ours on a peer vmcore: the tasks drgn walked (pids, or cpu for a running idle task), warm
OURS_PEER = _IMPORT_ROOT + r"""
import json, time
from unwind.replay import Options, Session
s = Session.load(sys.argv[3], vmlinux=sys.argv[4])
want = json.loads(sys.argv[5])
todo = [t for t in s.select(every=True) if [t.pid, t.cpu if t.running else None] in want]
frames = sum(len(s.replay(t, Options(), symbolize=False).frames) for t in todo)
warm = 1e9
for _ in range(int(sys.argv[6])):
    t0 = time.process_time()
    for t in todo:
        s.replay(t, Options(), symbolize=False)
    warm = min(warm, time.process_time() - t0)
print(json.dumps({"frames": frames, "tasks": len(todo), "warm": warm}))
"""

DRGN = r"""
import json, os, sys, time
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
        trace = prog.stack_trace(t)
        [f.pc for f in trace]
    except Exception:
        continue
    on_cpu = bool(t.on_cpu.value_()) if hasattr(t, "on_cpu") else False
    cpu = task_cpu(t) if on_cpu else None
    tasks.append(t)
    keys.append([t.pid.value_(), cpu])
def walk():
    n = 0
    for t in tasks:
        for f in prog.stack_trace(t):
            f.pc
            n += not f.is_inline
    return n
frames = walk()
warm = 1e9
for _ in range(int(sys.argv[3])):
    t0 = time.process_time()
    walk()
    warm = min(warm, time.process_time() - t0)
print(json.dumps({"frames": frames, "tasks": len(tasks), "warm": warm, "keys": keys}))
"""


def _run(python: str, code: str, *args: str, optional: bool = False) -> dict | None:
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, env=os.environ)
    if out.returncode and optional:
        print(f"left out ({Path(args[0]).name}): {out.stderr.strip().splitlines()[-1]}", file=sys.stderr)
        return None
    if out.returncode:
        raise SystemExit(f"child failed ({python} {' '.join(args)}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _unxz(src: Path, dst: Path) -> Path:
    if not dst.exists():
        with lzma.open(src) as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
    return dst


def _build_id(path: Path) -> str | None:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        for sec in ELFFile(f).iter_sections():
            if sec.header.sh_type == "SHT_NOTE":
                for note in sec.iter_notes():
                    if note.n_type == "NT_GNU_BUILD_ID":
                        return str(note.n_desc)
    return None


def _drgn_vmlinux(arch: str, vmlinux: Path, out: Path) -> Path | None:
    """The debug vmlinux without its CFI: drgn then unwinds by ORC (x86-64) or frame pointers (arm64)."""
    if not out.exists():
        # the host's objcopy knows x86-64; any other ELF goes through its generic little-endian target
        bfd = [] if arch == "x86_64" else ["-I", "elf64-little", "-O", "elf64-little"]
        r = subprocess.run(["objcopy", *bfd, "--remove-section=.debug_frame", "--remove-section=.eh_frame",
                            str(vmlinux), str(out)], capture_output=True, text=True)
        if r.returncode:
            print(f"objcopy failed on {vmlinux}: {r.stderr.strip()}", file=sys.stderr)
            return None
    return out


def _peers(tmp: Path, arches: list[str], vmlinux_dir: Path) -> dict[str, list[tuple[Path, Path, Path]]]:
    """Per arch: (vmcore, our slim image, drgn's vmlinux) of every committed vmcore with a debug vmlinux."""
    found: dict[str, list[tuple[Path, Path, Path]]] = {}
    for arch in arches:
        if arch == "riscv":
            continue
        for core in sorted((ROOT / "corpora" / arch).glob("*/vmcore/*.elf.xz")):
            release = core.parent.parent
            slims = sorted(release.glob("vmlinux-*.slim*"))
            vmlinux = vmlinux_dir / release.name / "vmlinux"
            if not slims or not vmlinux.exists():
                continue
            slim = _unxz(slims[0], tmp / f"{release.name}.slim") if slims[0].suffix == ".xz" else slims[0]
            if _build_id(slim) != _build_id(vmlinux):
                continue
            plain = _drgn_vmlinux(arch, vmlinux, tmp / f"{release.name}.vmlinux-nocfi")
            if plain is not None:
                elf = _unxz(core, tmp / f"{release.name}-{core.name[:-3]}")
                found.setdefault(arch, []).append((elf, slim, plain))
    return found


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] / r["frames"] * 1e6 for r in runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, help="another checkout to compare with (e.g. a worktree of main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=3, help="warm passes per child; the fastest counts (default 3)")
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeat for several (default: all)")
    p.add_argument("--corpora", type=Path, default=ROOT / "corpora", help="corpora/<arch>/ of each arch")
    p.add_argument("--drgn-python", help="a python with drgn installed: adds the drgn peer")
    p.add_argument("--vmlinux-dir", type=Path, default=Path(os.environ.get("UNWIND_CACHE", Path.home() / ".cache/unwind"))
                   / "kernels", help="<release>/vmlinux debug images for drgn (default: the lab's fetched kernels)")
    a = p.parse_args()
    arches = a.arch or list(ARCHES)
    roots = {"new": ROOT} | ({"base": a.base.resolve()} if a.base else {})
    ours: dict[tuple[str, str], list[dict]] = {}
    peer: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        peers = _peers(Path(tmp), arches, a.vmlinux_dir) if a.drgn_python else {}
        keys: dict[Path, str] = {}
        for _ in range(a.rounds):
            for arch in arches:
                for name, root in roots.items():
                    ours.setdefault((arch, name), []).append(
                        _run(sys.executable, OURS, str(root), arch, str(a.corpora / arch), str(a.passes)))
                for elf, slim, plain in peers.get(arch, []):
                    d = _run(a.drgn_python, DRGN, str(elf), str(plain), str(a.passes), optional=True)
                    if d is None:  # a vmcore drgn cannot read (e.g. a slice without its pid idr pages)
                        continue
                    keys[elf] = json.dumps(d.pop("keys"))
                    peer.setdefault((arch, "drgn"), []).append(d)
                    for name, root in roots.items():
                        peer.setdefault((arch, name), []).append(
                            _run(sys.executable, OURS_PEER, str(root), arch, str(elf), str(slim), keys[elf],
                                 str(a.passes)))
    print(f"CPU us/frame, median of {a.rounds} rounds (time.process_time in fresh child processes)\n")
    print("| arch | tasks | frames | " + " | ".join(f"{k} {n}" for n in roots for k in KINDS)
          + (" | warm new/base" if a.base else "") + " |")
    print("|---" * (3 + len(KINDS) * len(roots) + bool(a.base)) + "|")
    for arch in arches:
        runs = {n: ours[(arch, n)] for n in roots}
        r0 = runs["new"][0]
        cells = [f"{_med(runs[n], k):.2f}" for n in roots for k in KINDS]
        ratio = [f"{_med(runs['new'], 'warm') / _med(runs['base'], 'warm'):.2f}"] if a.base else []
        print(f"| {arch} | {r0['tasks']} | {r0['frames']} | " + " | ".join(cells + ratio) + " |")
    if peer:
        print("\nEqual inputs: the committed vmcores, every task drgn walks; warm CPU us/frame (drgn: ORC on x86-64, "
              "frame pointers on arm64)\n")
        print("| arch | tasks | frames ours / drgn | drgn | " + " | ".join(roots) + " | "
              + " | ".join(f"{n} / drgn" for n in roots) + " |")
        print("|---" * (4 + 2 * len(roots)) + "|")
        for arch in arches:
            if (arch, "drgn") not in peer:
                continue
            per_round = len(peer[(arch, "drgn")]) // a.rounds
            # several vmcores per arch: sum each round's parts, then take the median over rounds
            def total(name: str) -> list[dict]:
                rs = peer[(arch, name)]
                return [{k: sum(r[k] for r in rs[i:i + per_round]) for k in ("frames", "tasks", "warm")}
                        for i in range(0, len(rs), per_round)]
            d = total("drgn")
            mine = {n: total(n) for n in roots}
            dr = _med(d, "warm")
            print(f"| {arch} | {d[0]['tasks']} | {mine['new'][0]['frames']} / {d[0]['frames']} | {dr:.2f} | "
                  + " | ".join(f"{_med(mine[n], 'warm'):.2f}" for n in roots) + " | "
                  + " | ".join(f"{_med(mine[n], 'warm') / dr:.2f}" for n in roots) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
