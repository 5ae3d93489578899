"""Source lines of the real Debian kernels (the ``-dbg`` vmlinux ``unwind kernels fetch`` downloads)
against binutils' ``addr2line``: every frame of every task of the corpus dumps of that kernel, and every
trace line of its recorded console decoded.

Where binutils and ``llvm-addr2line`` (when installed) name one line in two files, the file is LLVM's:
binutils 2.40 misnames some DWARF 5 line-table rows. In a unit whose file table starts ``delay.c,
arch_timer.h, delay.c`` (gcc 14, arm64), a row of file 1 is named ``delay.c`` by binutils, ``arch_timer.h``
by the table and by LLVM (the row is in ``arch_timer_read_cntvct_el0``, which that header defines)."""

from __future__ import annotations

import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

from unwind.cli.decode import Decoder, find_symbol
from unwind.core.target import Options
from unwind.formats.dwarf_lines import SourceLine
from unwind.session.lines import decode_address, frame_levels
from unwind.session.replay import Session

from .conftest import _tool, addr2line

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _kernel(arch: str):  # type: ignore[no-untyped-def]
    from unwind.lab.fetch import FetchError, find_kernel

    try:
        return find_kernel(arch)
    except FetchError as e:
        pytest.skip(f"no {arch} -dbg vmlinux in the cache ({e})")


def _addr2line_reads(vmlinux: Path) -> None:
    done = subprocess.run([_tool("addr2line"), "-e", str(vmlinux), "0x0"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"addr2line cannot read {vmlinux} ({done.stderr.strip()}): binutils-multiarch's can")


def oracle(vmlinux: Path, addrs: list[int], functions: bool = True) -> tuple[dict[int, list[str]], int]:
    """binutils' ``addr2line`` per address, with LLVM's file name of a ``file:line`` where the two name the
    same line in different files (when ``llvm-addr2line`` is installed); and how many addresses that changed.
    LLVM's function names are not taken: it names the outer function of a chain by its symbol
    (``.isra.0``, riscv's ``$x`` mapping symbols) where binutils names it by its DWARF."""
    gnu = addr2line(vmlinux, addrs, functions=functions)
    if shutil.which("llvm-addr2line") is None:
        return gnu, 0
    llvm = addr2line(vmlinux, addrs, functions=functions, tool="llvm-addr2line")
    changed = 0
    for a in addrs:
        want, other = list(gnu[a]), llvm.get(a, [])
        if len(want) != len(other):
            continue
        for i in range(1 if functions else 0, len(want), 2 if functions else 1):
            if want[i] != other[i] and want[i].rpartition(":")[2] == other[i].rpartition(":")[2]:
                want[i] = other[i]
        if want != gnu[a]:
            gnu[a], changed = want, changed + 1
    return gnu, changed


@pytest.mark.parametrize("arch", ["x86_64", "arm64", "riscv"])
def test_every_frame_of_the_corpus_matches_addr2line(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel(arch)
    _addr2line_reads(kernel.vmlinux)
    dumps = sorted((ROOT / "corpora" / arch / kernel.release).glob("stop-*.bin.xz"))
    if not dumps:
        pytest.skip(f"no corpus dumps of {kernel.release}")
    monkeypatch.setenv("UNWIND_IMAGE_PATH", str(kernel.vmlinux.parent))
    lines = None
    levels: dict[int, list[SourceLine]] = {}
    for dump in dumps:
        session = Session.load(dump)
        lines = session.source_lines()
        assert lines.index is not None, lines.note
        for r in session.replay_all(Options(), session.select(every=True), lines=True):
            for f in r.frames:
                levels[decode_address(f)] = frame_levels(f)
    assert lines is not None and lines.index is not None
    want, disputed = oracle(kernel.vmlinux, sorted(levels))
    got = {a: [x for s in levels[a] for x in (s.function or "??", f"{s.file}:{s.line}")] or ["??", "??:0"]
           for a in levels}
    bad = {hex(a): (got[a], want[a]) for a in levels if got[a] != want[a]}
    assert not bad, f"{len(bad)} of {len(levels)} differ ({disputed} disputed): {list(bad.items())[:5]}"
    assert disputed <= len(levels) // 50  # the oracles agree on nearly every frame
    assert sum(len(v) > 2 for v in got.values()) > 0  # inline chains were checked too


@pytest.mark.parametrize("arch", ["x86_64", "arm64", "riscv"])
def test_the_recorded_console_decodes_as_addr2line_says(arch: str) -> None:
    kernel = _kernel(arch)
    _addr2line_reads(kernel.vmlinux)
    consoles = sorted((ROOT / "corpora" / arch / kernel.release).glob("console*.txt.xz"))
    if not consoles:
        pytest.skip(f"no recorded console of {kernel.release}")
    decoder = Decoder(kernel.vmlinux)
    text = [line for c in consoles for line in lzma.open(c, "rt", errors="replace").read().splitlines()]
    symbols = decoder.vmlinux.image.symbols
    checks: list[tuple[str, str, int]] = []
    for line in text:
        sym = find_symbol(line)
        out = decoder.decode_line(line)
        if sym is None or sym.module is not None:
            assert out == line
            continue
        base = symbols.address(sym.name)
        if base is None:
            assert out == line
            continue
        checks.append((line, out, base + sym.offset - (0 if sym.in_place else 1)))
    assert checks
    want, _ = oracle(kernel.vmlinux, sorted({a for _, _, a in checks}), functions=False)
    comp = decoder.vmlinux.index.comp_dir
    bad = []
    for line, out, addr in checks:
        if want[addr][0].endswith((":0", ":?")):  # no line: decode_stacktrace.sh leaves the symbol as it is
            ok = out == line
        else:
            ok = f" ({' '.join(x.removeprefix(f'{comp}/') for x in want[addr])})" in out
        if not ok:
            bad.append((out, want[addr]))
    assert not bad, f"{len(bad)} of {len(checks)} differ: {bad[:5]}"
