"""Start-up: a warm ``unwind replay`` against drgn opening the same stop and image, same run.

Every command runs as a fresh process, in rounds that interleave all of them, so that load from
other processes falls on each alike; each figure is the median over the rounds of the child's wall
time and its CPU time (user + system, from ``getrusage(RUSAGE_CHILDREN)``). Before the rounds each
command runs once, so the image, symbol and ORC caches and the ``.pyc`` files are warm: this is
the warm start-up a user sees from the second run on. ``PYTHONDONTWRITEBYTECODE`` is removed from
the children's environment (without ``.pyc`` files every import compiles its source).

The inputs are a committed vmcore slice and our dump of the same stop
(``corpora/<arch>/<release>/vmcore/stop-NNN-*.{elf,bin}.xz``, decompressed once into a temporary
folder) and the release's committed slim image:

- ``unwind replay DUMP``: our dump of the stop (image found by build-id), every running task;
- ``unwind replay VMCORE --vmlinux SLIM``: the vmcore itself, the same tasks;
- ``drgn load``: ``import drgn``, ``Program.set_core_dump(VMCORE)``, ``load_debug_info([SLIM])``:
  drgn importing and loading the same dump and image (drgn cannot walk with a slim image: it has
  no DWARF types to find tasks by);
- ``drgn + debug vmlinux``: the same with the full debug vmlinux (``--vmlinux-dir``, default the
  lab's fetched kernels), then ``stack_trace`` of each CPU's running task, as a drgn user starts;
- floors: ``python -c pass``, ``import unwind``, ``import drgn``.

``--base DIR`` adds ``unwind replay DUMP`` and ``VMCORE`` of another source tree (importable with
``PYTHONPATH=DIR``: ``git archive REV | tar -x -C DIR; ln -s ../arch DIR/unwind/arch``), so a
change is measured against the code before it in the same rounds::

    python benches/startup.py --rounds 7 --drgn-python /path/to/venv-with-drgn/bin/python --json out.json
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = Path(os.environ.get("UNWIND_CORPORA") or ROOT / "corpora")
#: the lab's fetched kernels: ``<release>/vmlinux`` (``unwind kernels fetch``)
KERNELS = Path(os.environ.get("UNWIND_CACHE") or Path.home() / ".cache" / "unwind") / "kernels"
#: drgn's arches among ours (drgn 0.3.0 has no riscv64 support)
DRGN_ARCHES = ("x86_64", "arm64")

DRGN_LOAD = """
import sys
import drgn
prog = drgn.Program()
prog.set_core_dump(sys.argv[1])
try:
    prog.load_debug_info([sys.argv[2]])
except drgn.MissingDebugInfoError:
    pass
"""

DRGN_TRACE = DRGN_LOAD + """
from drgn.helpers.linux.cpumask import for_each_online_cpu
from drgn.helpers.linux.sched import cpu_curr
for cpu in for_each_online_cpu(prog):
    try:
        print("".join(f"{f.pc:#x}\\n" for f in prog.stack_trace(cpu_curr(prog, cpu))))
    except (LookupError, ValueError, drgn.FaultError) as e:
        print(cpu, e)
"""


@dataclass
class Command:
    """One child process, measured in every round."""

    name: str
    arch: str
    argv: list[str]
    env: dict[str, str]
    #: the children's folder: not a source tree, whose ``unwind`` would shadow ``PYTHONPATH``'s
    cwd: str = "/"
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    failed: str | None = None

    def run(self) -> None:
        """One timed run: wall time and the child's user + system CPU time, in seconds."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run(self.argv, env=self.env, cwd=self.cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in (0, 1):  # replay's 1: a walk stopped on an error, still a full run
            self.failed = (done.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1][:200]
            return
        self.wall.append(wall)
        self.cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)

    def summary(self) -> dict[str, object]:
        """Medians (ms) and every round's figures."""
        out: dict[str, object] = {"name": self.name, "arch": self.arch, "argv": self.argv, "failed": self.failed}
        if self.wall:
            out.update(wall_ms=statistics.median(self.wall) * 1e3, cpu_ms=statistics.median(self.cpu) * 1e3,
                       min_wall_ms=min(self.wall) * 1e3, rounds_wall_ms=[w * 1e3 for w in self.wall],
                       rounds_cpu_ms=[c * 1e3 for c in self.cpu])
        return out


def _env(pythonpath: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def _unpacked(src: Path, folder: Path) -> Path:
    out = folder / src.name.removesuffix(".xz")
    if not out.exists():
        out.write_bytes(lzma.decompress(src.read_bytes()))
    return out


@dataclass
class Stop:
    """One committed stop of an arch: our dump, the vmcore slice, the slim image (all decompressed)."""

    arch: str
    release: str
    dump: Path
    vmcore: Path
    slim: Path
    vmlinux: Path | None


def stops(arches: list[str], folder: Path) -> list[Stop]:
    """The first committed vmcore stop of each arch (its release's slim image beside it)."""
    out = []
    for arch in arches:
        for rel in sorted((CORPORA / arch).glob("*/vmcore")):
            elfs = sorted(rel.glob("stop-*.elf.xz"))
            slims = sorted(rel.parent.glob("vmlinux-*.slim.xz"))
            if not elfs or not slims:
                continue
            dump = elfs[0].with_name(elfs[0].name.replace(".elf.xz", ".bin.xz"))
            if not dump.exists():
                continue
            sub = folder / arch
            sub.mkdir(parents=True, exist_ok=True)
            full = KERNELS / rel.parent.name / "vmlinux"
            out.append(Stop(arch, rel.parent.name, _unpacked(dump, sub), _unpacked(elfs[0], sub),
                            _unpacked(slims[0], sub), full if full.exists() else None))
            break
    return out


def commands(stop_list: list[Stop], python: str, drgn_python: str | None, base: str | None,
             full_drgn: bool) -> list[Command]:
    """Every command of the run (see the module docstring)."""
    ours = [python, "-m", "unwind"]
    cmds = [Command("python -c pass", "-", [python, "-c", "pass"], _env()),
            Command("import unwind", "-", [python, "-c", "import unwind"], _env())]
    if drgn_python:
        cmds.append(Command("import drgn", "-", [drgn_python, "-c", "import drgn"], _env()))
    for s in stop_list:
        cmds.append(Command("unwind replay DUMP", s.arch, [*ours, "replay", str(s.dump)], _env()))
        if base:
            cmds.append(Command("base: unwind replay DUMP", s.arch, [*ours, "replay", str(s.dump)], _env(base)))
        cmds.append(Command("unwind replay VMCORE", s.arch,
                            [*ours, "replay", str(s.vmcore), "--vmlinux", str(s.slim)], _env()))
        if base:
            cmds.append(Command("base: unwind replay VMCORE", s.arch,
                                [*ours, "replay", str(s.vmcore), "--vmlinux", str(s.slim)], _env(base)))
        if drgn_python and s.arch in DRGN_ARCHES:
            cmds.append(Command("drgn load (same vmcore + slim image)", s.arch,
                                [drgn_python, "-c", DRGN_LOAD, str(s.vmcore), str(s.slim)], _env()))
            if full_drgn and s.vmlinux is not None:
                cmds.append(Command("drgn + debug vmlinux, CPU traces", s.arch,
                                    [drgn_python, "-c", DRGN_TRACE, str(s.vmcore), str(s.vmlinux)], _env()))
    return cmds


def measure(cmds: list[Command], rounds: int) -> None:
    """One warm-up run each, then ``rounds`` interleaved rounds (the order rotates every round)."""
    for c in cmds:
        c.run()
    for r in range(rounds):
        for c in cmds[r % len(cmds):] + cmds[:r % len(cmds)]:
            if c.failed is None:
                c.run()


def drgn_python_default() -> str | None:
    """A Python that imports drgn: this one, else ``$UNWIND_DRGN_PYTHON``."""
    for py in (sys.executable, os.environ.get("UNWIND_DRGN_PYTHON")):
        if py and subprocess.run([py, "-c", "import drgn"], capture_output=True).returncode == 0:
            return py
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arch", action="append", help="x86_64, arm64, riscv (default: all three)")
    ap.add_argument("--drgn-python", help="a Python with drgn installed (default: this one or $UNWIND_DRGN_PYTHON)")
    ap.add_argument("--no-debug-vmlinux", action="store_true", help="skip drgn with the full debug vmlinux")
    ap.add_argument("--base", help="another source tree to time beside this one (see the module docstring)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    drgn_python = args.drgn_python or drgn_python_default()
    with tempfile.TemporaryDirectory(prefix="unwind-startup-") as tmp:
        stop_list = stops(args.arch or ["x86_64", "arm64", "riscv"], Path(tmp))
        cmds = commands(stop_list, sys.executable, drgn_python, args.base, not args.no_debug_vmlinux)
        load = os.getloadavg()[0]
        measure(cmds, args.rounds)
        result = {"rounds": args.rounds, "load": [load, os.getloadavg()[0]], "cores": os.cpu_count(),
                  "stops": [{"arch": s.arch, "release": s.release, "dump": s.dump.name, "vmcore": s.vmcore.name,
                             "vmlinux": str(s.vmlinux) if s.vmlinux else None} for s in stop_list],
                  "commands": [c.summary() for c in cmds]}
    drgn = {c["arch"]: c for c in result["commands"]
            if str(c["name"]).startswith("drgn load") and "wall_ms" in c}
    print(f"{args.rounds} rounds, load {load:.1f} -> {result['load'][1]:.1f} on {os.cpu_count()} cores; "
          "median ms (wall / CPU); ratio = drgn load / this, same run")
    for c in result["commands"]:
        if "wall_ms" not in c:
            print(f"  {c['arch']:7} {c['name']:40} FAILED: {c['failed']}")
            continue
        peer = drgn.get(c["arch"])
        ratio = (f"  x{peer['wall_ms'] / c['wall_ms']:.2f} wall, x{peer['cpu_ms'] / c['cpu_ms']:.2f} CPU"
                 if peer is not None and peer is not c else "")
        print(f"  {c['arch']:7} {c['name']:40} {c['wall_ms']:7.0f} / {c['cpu_ms']:5.0f}{ratio}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
