"""Peak RSS and CPU time of ``unwind`` on a large vmcore, ELF and ``.xz``, beside drgn on the same file.

The large vmcore is built from a committed slice by construction: its program headers, notes and
pages as they are, plus one ``PT_LOAD`` of ``--gib`` GiB of zero pages above the guest's RAM, stored
as a hole (a sparse file; ``--xz`` also writes it xz-compressed, ``xz -1``). Every figure is one run in
a child of a fresh process: CPU time and peak RSS from ``getrusage(RUSAGE_CHILDREN)``. Measured:

- **open**: ``Session.load`` (headers, notes, VMCOREINFO, BTF, the task lists);
- **ps** and **replay --all**: the commands as a user runs them, output to ``/dev/null``;
- drgn (``--drgn VMLINUX``: an image with DWARF, drgn needs it): ``Program.set_core_dump`` and
  ``load_debug_info`` (**open**), ``for_each_task`` with pid and comm (**ps**), and ``stack_trace`` of every
  task (**replay --all**). drgn runs on the ELF only: it does not read ``.xz``.

::

    python benches/vmcore_memory.py corpora/x86_64/6.12.117+deb13-amd64/vmcore/stop-001-random.elf.xz \\
        --gib 4 --xz --drgn /usr/lib/debug/boot/vmlinux-6.12.117+deb13-amd64
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: a child that runs ARGV and prints its CPU seconds, peak RSS in bytes and exit status
_CHILD = """import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(u.ru_utime + u.ru_stime, u.ru_maxrss * 1024, r.returncode)
"""
_OPEN = "import sys; from unwind import Session; Session.load(sys.argv[1], vmlinux=sys.argv[2])"
_DRGN = """import sys, drgn
from drgn.helpers.linux.pid import for_each_task
mode, core, vmlinux = sys.argv[1:4]
prog = drgn.Program()
prog.set_core_dump(core)
prog.load_debug_info([vmlinux])
for t in for_each_task(prog) if mode != "open" else ():
    (int(t.pid), t.comm.string_())
    if mode == "all":
        try:
            prog.stack_trace(t)
        except Exception:
            pass
"""


def build(slice_xz: Path, gib: int, out: Path) -> Path:
    """The committed ELF slice with one more ``PT_LOAD``: ``gib`` GiB of zero pages, a hole in the file."""
    src = lzma.decompress(slice_xz.read_bytes())
    phoff, phnum = struct.unpack_from("<Q", src, 32)[0], struct.unpack_from("<H", src, 56)[0]
    if phoff != 64:
        raise SystemExit(f"{slice_xz}: program headers at {phoff:#x}, not right after the ELF header")
    ph = bytearray(src[64:64 + 56 * phnum])
    for i in range(phnum):  # every segment moves by one program header
        struct.pack_into("<Q", ph, i * 56 + 8, struct.unpack_from("<Q", ph, i * 56 + 8)[0] + 56)
    size = gib << 30
    top = max(struct.unpack_from("<Q", ph, i * 56 + 24)[0] + struct.unpack_from("<Q", ph, i * 56 + 40)[0]
              for i in range(phnum))
    paddr = max(top, 1 << 32) + (1 << 30) & ~((1 << 30) - 1)
    extra = struct.pack("<IIQQQQQQ", 1, 7, len(src) + 56, paddr, paddr, size, size, 0)
    ehdr = bytearray(src[:64])
    struct.pack_into("<H", ehdr, 56, phnum + 1)
    with open(out, "wb") as f:
        f.write(ehdr + ph + extra + src[64 + 56 * phnum:])
        f.truncate(len(src) + 56 + size)
    return out


def measure(*argv: str) -> tuple[float, int, int]:
    """(CPU seconds, peak RSS bytes, exit status) of ``argv`` in a child of a fresh process."""
    r = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, check=True)
    cpu, peak, rc = r.stdout.split()
    return float(cpu), int(peak), int(rc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("slice", type=Path, help="a committed ELF vmcore slice (.elf.xz)")
    p.add_argument("--gib", type=int, default=4, help="GiB of zero pages added (default 4)")
    p.add_argument("--xz", action="store_true", help="measure the file xz-compressed too")
    p.add_argument("--drgn", metavar="VMLINUX", help="measure drgn too, with this image (DWARF)")
    args = p.parse_args()
    image = str(next(args.slice.parent.parent.glob("vmlinux-*")))
    with tempfile.TemporaryDirectory() as tmp:
        big = build(args.slice, args.gib, Path(tmp) / "large.elf")
        files = [big]
        if args.xz:
            subprocess.run(["xz", "-1", "-T2", "-k", str(big)], check=True)
            files.append(big.with_name(big.name + ".xz"))
        print(f"{args.slice.name} + {args.gib} GiB of zero pages: {big.stat().st_size / 2**30:.2f} GiB"
              + (f", {files[-1].stat().st_size >> 20} MiB as .xz" if args.xz else ""))
        print("| tool | file | step | CPU s | peak RSS MiB | exit |\n|---|---|---|---|---|---|")
        py = sys.executable
        for f in files:
            runs = {"open": [py, "-c", _OPEN, str(f), image],
                    "ps": [py, "-m", "unwind", "ps", "--vmlinux", image, str(f)],
                    "replay --all": [py, "-m", "unwind", "replay", "--all", "--vmlinux", image, str(f)]}
            if args.drgn and f.suffix != ".xz":
                runs.update({f"drgn {m}": [py, "-c", _DRGN, a, str(f), args.drgn]
                             for m, a in (("open", "open"), ("ps", "ps"), ("replay --all", "all"))})
            for step, argv in runs.items():
                cpu, peak, rc = measure(*argv)
                tool, what = ("drgn", step[5:]) if step.startswith("drgn") else ("unwind", step)
                print(f"| {tool} | {f.name} | {what} | {cpu:.2f} | {peak / 2**20:.0f} | {rc} |")


if __name__ == "__main__":
    if shutil.which("xz") is None and "--xz" in sys.argv:
        raise SystemExit("--xz needs the xz command")
    main()
