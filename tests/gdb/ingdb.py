"""Run ``unwind gdb`` over a committed dump and compare with ``Session.replay`` of the same dump.

gdb opens the dump as an ELF core (one thread per CPU) with the slim image,
both decompressed; ``bt`` of each thread must give the pcs the replay of that
CPU gives, and ``unwind-bt all`` the trace the replay of each task prints.
"""

from __future__ import annotations

import lzma
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from unwind.session.output import replay_text
from unwind.session.replay import ReplayError, Session

GDB = "gdb-multiarch"
REPO = Path(__file__).resolve().parents[2]
_FRAME = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-f]+) in )?")
_MARK = "@@unwind-test "


@dataclass
class Compared:
    """What one dump gave in gdb against its replay."""

    dump: Path
    cpus: list[int] = field(default_factory=list)
    cpu_mismatch: list[str] = field(default_factory=list)
    tasks: int = 0
    task_mismatch: list[str] = field(default_factory=list)


def decompressed(path: Path, folder: Path) -> Path:
    """``path`` without its ``.xz``, written once into ``folder``."""
    out = folder / f"{path.parent.name}-{path.name.removesuffix('.xz')}"
    if not out.exists():
        out.write_bytes(lzma.decompress(path.read_bytes()))
    return out


def image_of(dump: Path) -> Path:
    images = sorted(dump.parent.glob("vmlinux-*.slim.xz"))
    assert len(images) == 1, f"{dump.parent}: {images}"
    return images[0]


def run_gdb(image: Path, core: Path, commands: list[str]) -> str:
    """``unwind gdb -batch`` with ``commands``, each output after a marker line."""
    argv = [sys.executable, "-m", "unwind", "gdb", "--gdb", shutil.which(GDB) or GDB, "-nx", "-batch"]
    for i, c in enumerate(commands):
        argv += ["-ex", f"echo {_MARK}{i}\\n", "-ex", c]
    argv += [str(image), str(core)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert "Traceback" not in r.stderr and "internal-error" not in r.stderr, r.stderr[-3000:]
    return r.stdout


def split(out: str, n: int) -> list[str]:
    parts = out.split(_MARK)
    found = {}
    for p in parts[1:]:
        head, _, body = p.partition("\n")
        found[int(head)] = body
    return [found.get(i, "") for i in range(n)]


def bt_pcs(text: str, first_pc: int) -> list[int]:
    """The pcs of a ``bt``: frame 0's is gdb's pc when gdb prints none (a line of its own source)."""
    pcs = []
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m:
            pcs.append(int(m.group(2), 16) if m.group(2) else first_pc)
    return pcs


def compare(dump: Path, tmp: Path) -> Compared:
    """Every running CPU's ``bt`` and every task's ``unwind-bt`` against the replay of ``dump``."""
    session = Session.load(dump, vmlinux=None)
    core = decompressed(dump, tmp)
    image = decompressed(image_of(dump), tmp)
    running = [t for t in session.dump.tasks() if t.running]
    commands = []
    for t in running:
        commands += [f"thread {t.cpu + 1}", "bt"]
    commands.append("unwind-bt all")
    out = split(run_gdb(image, core, commands), len(commands))
    got = Compared(dump)
    for i, t in enumerate(running):
        # a CPU the kernel walks nothing of (user mode) is gdb's frame 0 alone
        want = [f.pc for f in session.replay(t).frames] or [t.regs[session.backend.pc_reg]]
        pcs = bt_pcs(out[2 * i + 1], want[0])
        got.cpus.append(t.cpu)
        if pcs != want:
            got.cpu_mismatch.append(f"cpu{t.cpu}: gdb {[hex(p) for p in pcs]} replay {[hex(p) for p in want]}")
    expected = []
    for t in session.select(every=True):
        expected.append("\n".join(replay_text(session, session.replay(t))))
    lines = [ln for ln in out[-1].splitlines() if not ln.startswith("unwind: warning:")]
    chunks = _per_task("\n".join(lines))
    got.tasks = len(expected)
    for want_text, got_text in zip(expected, chunks + [""] * (len(expected) - len(chunks))):
        if want_text != got_text:
            got.task_mismatch.append(want_text.splitlines()[0])
    return got


_REGISTER = re.compile(r"^(\w+)\s+(0x[0-9a-f]+)\s", re.M)


def frames_registers(image: Path, core: Path, cpu: int, levels: int) -> list[dict[str, int]]:
    """``info registers`` in each of frames 0 .. ``levels - 1`` of thread ``cpu + 1`` (a register gdb shows
    as ``<not saved>`` is left out)."""
    commands = [f"thread {cpu + 1}"]
    for level in range(levels):
        commands += [f"frame {level}", "info registers"]
    out = split(run_gdb(image, core, commands), len(commands))
    return [{m.group(1): int(m.group(2), 16) for m in _REGISTER.finditer(out[2 + 2 * level])}
            for level in range(levels)]


def _per_task(text: str) -> list[str]:
    """``unwind-bt all`` cut at each task's ``pid N (comm) ...:`` header."""
    out: list[str] = []
    for line in text.splitlines():
        if re.match(r"^pid \S+ \(.*\) (on cpu\d+|blocked):$", line):
            out.append(line)
        elif out:
            out[-1] += "\n" + line
    return out


def main() -> None:
    import tempfile

    dumps = [Path(a).resolve() for a in sys.argv[1:]] or sorted(REPO.glob("corpora/*/*/stop-*.bin.xz"))
    with tempfile.TemporaryDirectory() as tmp:
        for d in dumps:
            try:
                c = compare(d, Path(tmp))
            except ReplayError as e:
                print(d, "replay error", e)
                continue
            print(f"{d.relative_to(REPO)} cpus {len(c.cpus) - len(c.cpu_mismatch)}/{len(c.cpus)} "
                  f"tasks {c.tasks - len(c.task_mismatch)}/{c.tasks}", flush=True)
            for m in c.cpu_mismatch + c.task_mismatch:
                print("   ", m)


if __name__ == "__main__":
    main()
