"""vmcore formats side by side: CPU time to open a file and to read N random pages, ELF as the baseline.

Every file holds the same stop (the lab writes one stop in every format), so
each reads the same physical pages. Rounds are interleaved file by file, so
load from other processes falls on all of them alike; each figure is the
median over rounds of ``time.process_time``. Prints a Markdown table::

    python benches/vmcore_read.py /work/lab-out/vmcores/x86_64/stop-000-random.* --pages 2000 --rounds 5
    python benches/vmcore_read.py --synthetic 64 --pages 2000    # files built here, 64 MiB of RAM each
    python benches/vmcore_read.py --open-scaling 4 64 1024         # kdump files of 4, 64, 1024 GiB of RAM

``cold`` opens the file and reads the pages through an empty cache; ``warm``
reads them again from the decoded-page cache. Pages a file does not hold
(filtered, outside its ranges) are counted and skipped.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unwind.core.memory import MemoryFault  # noqa: E402
from unwind.formats.vmcore import open_vmcore  # noqa: E402


def synthetic_files(mib: int, out: Path) -> list[Path]:
    """One ELF, one kdump file per codec and a flattened one, all of the same ``mib`` MiB of pages."""
    from tests.vmcore.synth import KdumpSpec, Load, elf_vmcore, flatten, kdump_file, notes_blob, page_bytes, vmcoreinfo
    from unwind.formats.vmcore import codecs

    npages = mib * 256
    pages = {p: page_bytes(p) for p in range(npages)}
    notes = notes_blob([(1, 0), (2, 0)], 27, vmcoreinfo())
    files = {"elf": elf_vmcore([Load(0, b"".join(pages.values()))], notes)}
    for flag, name in codecs.CODEC_NAMES.items():
        files[f"kdump-{name}"] = kdump_file(KdumpSpec(max_mapnr=npages, ram=set(pages), dumped=pages,
                                                      codec=flag, notes=notes))
    files["kdump-zlib.flat"] = flatten(files["kdump-zlib"], record=4 * 4096, seed=None)
    paths = []
    for name, data in files.items():
        p = out / f"synthetic.{name}"
        p.write_bytes(data)
        paths.append(p)
    return paths


def open_scaling(gibs: list[int], rounds: int) -> None:
    """Open kdump files describing ``gibs`` GiB of RAM (one dumped page per 256 MiB): bitmaps dominate."""
    from tests.vmcore.synth import KdumpSpec, kdump_file, page_bytes

    print("| RAM | file | open ms (median CPU) | ranges ms |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="vmcore-bench-") as tmp:
        for gib in gibs:
            n = gib << 18
            pfns = range(0, n, 1 << 16)
            path = Path(tmp) / f"{gib}g.kdump"
            path.write_bytes(kdump_file(KdumpSpec(max_mapnr=n, ram=set(pfns), dumped={p: page_bytes(p) for p in pfns})))
            t_open, t_ranges = [], []
            for _ in range(rounds):
                t, vm = cpu(lambda: open_vmcore(path))
                t_open.append(t)
                t_ranges.append(cpu(lambda: vm.ranges)[0])
                vm.close()
            print(f"| {gib} GiB | {path.stat().st_size / 2**20:.1f} MiB | {statistics.median(t_open) * 1e3:.1f} | "
                  f"{statistics.median(t_ranges) * 1e3:.1f} |")
            path.unlink()


def cpu(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t = time.process_time()
    r = fn()
    return time.process_time() - t, r


def read_pages(vm, pfns: list[int]) -> int:  # type: ignore[no-untyped-def]
    """Read each page; the number that faulted."""
    missed = 0
    for pfn in pfns:
        try:
            vm.read_phys(pfn * 4096, 4096)
        except MemoryFault:
            missed += 1
    return missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="vmcores of one stop; the first .elf is the baseline")
    ap.add_argument("--synthetic", type=int, metavar="MIB", help="build the files here instead, MIB MiB each")
    ap.add_argument("--open-scaling", type=int, nargs="+", metavar="GIB", help="time opening kdump files this big")
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.open_scaling:
        open_scaling(args.open_scaling, args.rounds)
        return 0
    tmp = None
    files = [f for f in args.files if f.suffix in (".elf", ".kdump", ".flat")]
    if args.synthetic:
        tmp = tempfile.TemporaryDirectory(prefix="vmcore-bench-")
        files = synthetic_files(args.synthetic, Path(tmp.name))
    if not files:
        ap.error("no vmcore files given")
    base = next((f for f in files if f.name.endswith(".elf") and "paging" not in f.name), files[0])
    with open_vmcore(base) as vm:
        pfns_all = [pfn for r in vm.ranges for pfn in range(r.start // 4096, r.end // 4096)]
    pfns = random.Random(args.seed).sample(pfns_all, min(args.pages, len(pfns_all)))

    times: dict[Path, dict[str, list[float]]] = {f: {"open": [], "cold": [], "warm": []} for f in files}
    missed: dict[Path, int] = {}
    for _ in range(args.rounds):
        for f in files:
            t_open, vm = cpu(lambda: open_vmcore(f))
            t_cold, missed[f] = cpu(lambda: read_pages(vm, pfns))
            t_warm, _ = cpu(lambda: read_pages(vm, pfns))
            vm.close()
            for k, v in (("open", t_open), ("cold", t_cold), ("warm", t_warm)):
                times[f][k].append(v)

    med = {f: {k: statistics.median(v) for k, v in t.items()} for f, t in times.items()}
    b = med[base]
    print(f"{len(pfns)} random pages of {len(pfns_all)}, {args.rounds} rounds, median CPU time; ratio to {base.name}\n")
    print("| file | size | format | open ms | cold read µs/page | warm µs/page | cold ratio | pages not held |")
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        m = med[f]
        with open_vmcore(f) as vm:
            fmt = vm.format + (f" ({','.join(vm.compression)})" if getattr(vm, "compression", None) else "")
        n = len(pfns)
        print(f"| {f.name} | {f.stat().st_size / 2**20:.0f} MiB | {fmt} | {m['open'] * 1e3:.1f} | "
              f"{m['cold'] / n * 1e6:.1f} | {m['warm'] / n * 1e6:.1f} | {m['cold'] / b['cold']:.2f} | {missed[f]} |")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
