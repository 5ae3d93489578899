"""Peak RSS and CPU time of ``unwind`` on a large vmcore, ELF and ``.xz``, beside drgn on the same file.

The vmcores are real ones (``--vmcore FILE``, repeatable: a large lab guest's QEMU vmcore, its
makedumpfile and ``.xz`` copies, read with ``--image``), or one built from a committed slice by
construction: its program headers, notes and pages as they are, plus one ``PT_LOAD`` of ``--gib`` GiB
of zero pages above the guest's RAM, stored as a hole (a sparse file; ``--xz`` also writes it
xz-compressed, ``xz -1``). Every figure is one run in a child of a fresh process: CPU time and peak
RSS from ``getrusage(RUSAGE_CHILDREN)``. Measured:

- **open**: ``Session.load`` (headers, notes, VMCOREINFO, BTF, the task lists);
- **ps** and **replay --all**: the commands as a user runs them, output to ``/dev/null``;
- drgn (``--drgn VMLINUX``: an image with DWARF, drgn needs it): ``Program.set_core_dump`` and
  ``load_debug_info`` (**open**), ``for_each_task`` with pid and comm (**ps**), and ``stack_trace`` of every
  task (**replay --all**). drgn does not read ``.xz``: it is skipped there.

::

    python benches/vmcore_memory.py corpora/x86_64/6.12.117+deb13-amd64/vmcore/stop-001-random.elf.xz \\
        --gib 4 --xz --drgn /usr/lib/debug/boot/vmlinux-6.12.117+deb13-amd64
    python benches/vmcore_memory.py --vmcore big.elf --vmcore big.kdump --vmcore big.elf.xz \\
        --image corpora/x86_64/6.12.117+deb13-amd64/vmlinux-b1d7a9114053a488ef493f85f85e9fc75ba9f632.slim.xz \\
        --drgn /usr/lib/debug/boot/vmlinux-6.12.117+deb13-amd64
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the pieces of :func:`quick_xz`, one xz stream each
_PIECE = 4 << 20

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


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def stored_stream(data: bytes) -> bytes:
    """One xz stream (CRC32 check) of one block of LZMA2 uncompressed chunks."""
    flags = b"\0\x01"
    head = b"\xfd7zXZ\0" + flags + struct.pack("<I", zlib.crc32(flags))
    filt = _varint(0x21) + _varint(1) + bytes([20])  # LZMA2, dictionary 4 MiB (props 20): one piece
    bh = bytes([0]) + bytes([0]) + filt  # size byte patched below, flags: one filter, no sizes
    bh += _pad4(len(bh) + 4)
    bh = bytes([(len(bh) + 4) // 4 - 1]) + bh[1:]
    bh += struct.pack("<I", zlib.crc32(bh))
    chunks = bytearray()
    for i in range(0, len(data), 1 << 16):
        part = data[i:i + (1 << 16)]
        chunks += bytes([1 if i == 0 else 2]) + struct.pack(">H", len(part) - 1) + part
    chunks += b"\0"
    unpadded = len(bh) + len(chunks) + 4
    block = bh + chunks + _pad4(len(chunks)) + struct.pack("<I", zlib.crc32(data))
    index = b"\0" + _varint(1) + _varint(unpadded) + _varint(len(data))
    index += _pad4(len(index))
    index += struct.pack("<I", zlib.crc32(index))
    back = struct.pack("<I", len(index) // 4 - 1) + flags
    foot = struct.pack("<I", zlib.crc32(back)) + back + b"YZ"
    return head + block + index + foot


def quick_xz(src: Path) -> Path:
    """Write ``src.xz``: ``xz -1`` on each 4 MiB piece that compresses, stored LZMA2 chunks on the others.

    ``xz -1`` of a guest whose RAM holds random data runs its match finder over every byte for
    hours on a shared machine, and stores almost all of it anyway (LZMA2 uncompressed chunks).
    Each piece is one xz stream; a reader decompresses them one after the other, as ``xz -d`` does.
    A piece counts as incompressible when zlib level 1 saves under 5 % of its first 64 KiB.
    """
    out = src.with_name(src.name + ".xz")
    with open(src, "rb") as f, open(out, "wb") as w:
        while piece := f.read(_PIECE):
            if len(zlib.compress(piece[:1 << 16], 1)) > (1 << 16) * 0.95:
                w.write(stored_stream(piece))
            else:
                w.write(lzma.compress(piece, preset=1))
    return out


def measure(*argv: str) -> tuple[float, int, int]:
    """(CPU seconds, peak RSS bytes, exit status) of ``argv`` in a child of a fresh process."""
    r = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, check=True)
    cpu, peak, rc = r.stdout.split()
    return float(cpu), int(peak), int(rc)


def table(files: list[Path], image: str, drgn: str | None) -> None:
    """Print one row per tool, file and step: CPU seconds, peak RSS and exit status."""
    print("| tool | file | step | CPU s | peak RSS MiB | exit |\n|---|---|---|---|---|---|")
    py = sys.executable
    for f in files:
        runs = {"open": [py, "-c", _OPEN, str(f), image],
                "ps": [py, "-m", "unwind", "ps", "--vmlinux", image, str(f)],
                "replay --all": [py, "-m", "unwind", "replay", "--all", "--vmlinux", image, str(f)]}
        if drgn and f.suffix != ".xz":
            runs.update({f"drgn {m}": [py, "-c", _DRGN, a, str(f), drgn]
                         for m, a in (("open", "open"), ("ps", "ps"), ("replay --all", "all"))})
        for step, argv in runs.items():
            cpu, peak, rc = measure(*argv)
            tool, what = ("drgn", step[5:]) if step.startswith("drgn") else ("unwind", step)
            print(f"| {tool} | {f.name} | {what} | {cpu:.2f} | {peak / 2**20:.0f} | {rc} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("slice", type=Path, nargs="?", help="a committed ELF vmcore slice (.elf.xz) to build from")
    p.add_argument("--gib", type=int, default=4, help="GiB of zero pages added (default 4)")
    p.add_argument("--xz", action="store_true", help="measure the built file xz-compressed too")
    p.add_argument("--vmcore", type=Path, action="append", default=[], metavar="FILE",
                   help="measure this vmcore as it is (repeatable), instead of building one")
    p.add_argument("--quick-xz", action="store_true",
                   help="write each --vmcore FILE as FILE.xz with quick_xz and measure that too")
    p.add_argument("--image", type=Path, help="the kernel image for --vmcore (default: the slice's corpus image)")
    p.add_argument("--drgn", metavar="VMLINUX", help="measure drgn too, with this image (DWARF)")
    args = p.parse_args()
    if (args.slice is None) == (not args.vmcore):
        p.error("give a slice to build from, or --vmcore FILE, not both")
    if args.vmcore:
        if args.image is None:
            p.error("--vmcore needs --image")
        files = list(args.vmcore)
        if args.quick_xz:
            files += [quick_xz(f) for f in args.vmcore]
        for f in files:
            print(f"{f.name}: {f.stat().st_size / 2**30:.2f} GiB")
        table(files, str(args.image), args.drgn)
        return
    image = str(args.image or next(args.slice.parent.parent.glob("vmlinux-*")))
    with tempfile.TemporaryDirectory() as tmp:
        big = build(args.slice, args.gib, Path(tmp) / "large.elf")
        files = [big]
        if args.xz:
            subprocess.run(["xz", "-1", "-T2", "-k", str(big)], check=True)
            files.append(big.with_name(big.name + ".xz"))
        print(f"{args.slice.name} + {args.gib} GiB of zero pages: {big.stat().st_size / 2**30:.2f} GiB"
              + (f", {files[-1].stat().st_size >> 20} MiB as .xz" if args.xz else ""))
        table(files, image, args.drgn)


if __name__ == "__main__":
    if shutil.which("xz") is None and "--xz" in sys.argv:
        raise SystemExit("--xz needs the xz command")
    main()
