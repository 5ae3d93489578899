"""Damaged vmcores: every committed vmcore cut short, in every format it can be written in, replays what it holds.

The expected answer is the uncut file's replay: a task of the cut file prints the
uncut task's frames, all of them or the first ones and then a stop on the memory
the file no longer holds ("beyond the end of the file"), never a frame of its own;
a task the cut file cannot walk names what it lacks. The kdump-compressed and
flattened files are written from the committed ELF slices (``synth.kdump_of``: the
same pages and notes; flattened block by block in order, as ``makedumpfile -F``
writes a file), each also xz-compressed (and the xz stream cut); the makedumpfile
slice (``makedumpfile -F -c -d 31``, no ELF form) is cut as it is and reassembled
(``makedumpfile -R``'s kdump-compressed file). makedumpfile itself is not needed.

By default each vmcore is cut in one of its formats (in turn, so every format is
cut on some vmcore); ``--slow`` cuts every vmcore in every format.
``python -m tests.vmcore.salvage_table`` prints what each cut salvages.
"""

from __future__ import annotations

import lzma
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest

from unwind.core.memory import MemoryFault
from unwind.core.walk import StopReason
from unwind.formats.dump import DumpError
from unwind.formats.image import Image
from unwind.formats.vmcore import open_vmcore
from unwind.formats.vmcore.flattened import FlatSource
from unwind.formats.vmcore.source import XzSource
from unwind.formats.vmdump import VmcoreFile
from unwind.session.replay import ReplayError, Session

from .synth import flatten, kdump_of

ROOT = Path(__file__).resolve().parents[2]
VMCORES = sorted(ROOT.glob("corpora/*/*/vmcore/*.elf.xz"))
#: makedumpfile's own files: flattened kdump-compressed, with no ELF form
MAKEDUMPFILE = sorted(ROOT.glob("corpora/*/*/makedumpfile/*.flat.xz"))
#: the share of the file kept
CUTS = (0.999, 0.9, 0.5)
FORMATS = ("elf", "kdump", "flat", "elf.xz", "kdump.xz", "flat.xz")
BEYOND = "beyond the end of the file"


def _formats(vmcore: Path) -> tuple[str, ...]:
    return FORMATS if vmcore in VMCORES else tuple(f for f in FORMATS if not f.startswith("elf"))


def _vmcore_id(vmcore: Path) -> str:
    return f"{vmcore.parts[-4]}-{vmcore.parts[-3]}-{vmcore.parent.name}-{vmcore.name.split('.')[0]}"


def _cases() -> list:
    """(vmcore, format, cut) for every cut; each vmcore's cuts in one format by default, in turn, the others slow.
    The turn starts where the arm64 kdump is cut as kdump.xz: there the crash CPU's ``crash_notes`` buffer is
    past the cut, and its note is placed as the file's order says (walked as blocked, its task printed a wrong
    frame)."""
    out = []
    for i, vmcore in enumerate(VMCORES + MAKEDUMPFILE):
        formats = _formats(vmcore)
        for fmt in formats:
            marks = () if fmt == formats[(i + 4) % len(formats)] else (pytest.mark.slow,)
            out += [pytest.param(vmcore, fmt, keep, marks=marks, id=f"{_vmcore_id(vmcore)}-{keep}-{fmt}")
                    for keep in CUTS]
    return out


def _image(vmcore: Path) -> Path:
    return next(vmcore.parent.parent.glob("vmlinux-*"))


@cache
def _whole(vmcore: Path, fmt: str, tmp: Path) -> bytes:
    """The uncut file of ``vmcore`` in format ``fmt`` (``tmp``: a folder to open the ELF in)."""
    if fmt.endswith(".xz"):
        return lzma.compress(_whole(vmcore, fmt.removesuffix(".xz"), tmp), preset=0)
    if vmcore in MAKEDUMPFILE:
        if fmt == "flat":
            return lzma.decompress(vmcore.read_bytes())
        src = FlatSource(XzSource(str(vmcore)))  # type: ignore[arg-type]
        try:
            return src.pread(0, src.size)  # makedumpfile -R
        finally:
            src.close()
    elf = lzma.decompress(vmcore.read_bytes())
    if fmt == "elf":
        return elf
    src = tmp / f"{vmcore.stem}.for-kdump"
    src.write_bytes(elf)
    with open_vmcore(src) as vm:
        kdump = kdump_of(vm)
    return kdump if fmt == "kdump" else flatten(kdump, record=4096, seed=None, sparse=False)


class Walk(NamedTuple):
    """One task's replay, as compared: its frames, its stop, what the dump says of it, and its CPU if running."""

    frames: list[str]
    reason: StopReason
    detail: str
    note: str
    running_cpu: int | None


#: a task by (pid, task_struct); a CPU whose task is unknown by ("cpu", its number)
Key = tuple


def _key(task) -> Key:  # type: ignore[no-untyped-def]
    if task.task_struct is None and task.running_cpu is not None:
        return ("cpu", task.running_cpu)
    return (task.pid, task.task_struct)


def _replay(path: Path, image: Path) -> tuple[dict[Key, Walk], list[str]] | str:
    """Every task's walk by its key, and the warnings; or the one-line refusal."""
    try:
        s = Session.load(path, vmlinux=image)
    except (DumpError, ReplayError) as e:
        assert "\n" not in str(e)
        return str(e)
    out = {}
    for task in s.select(every=True):
        r = s.replay(task)
        key = _key(task)
        assert key not in out, f"{key} listed twice"
        out[key] = Walk([str(f) for f in r.frames], r.stop.reason, r.stop.detail, task.extra.get("note", ""),
                        task.running_cpu)
    return out, list(s.warnings)


@cache
def _uncut(vmcore: Path, tmp: Path) -> dict[Key, Walk]:
    """The uncut replay every format's cut is held to: the committed file's own (the formats written from it hold
    the same pages and notes; tests/vmcore/test_formats.py checks they replay alike)."""
    fmt = "elf" if vmcore in VMCORES else "flat"
    path = tmp / f"{_vmcore_id(vmcore)}.whole.{fmt}"
    path.write_bytes(_whole(vmcore, fmt, tmp))
    got = _replay(path, _image(vmcore))
    assert not isinstance(got, str), got
    tasks, warnings = got
    assert not any("truncated" in w for w in warnings)
    assert not any("BTF from the image" in w for w in warnings)  # the dump's own BTF is read first
    return tasks


def _cut(vmcore: Path, fmt: str, keep: float, tmp: Path, folder: Path) -> Path:
    data = _whole(vmcore, fmt, tmp)
    path = folder / f"{_vmcore_id(vmcore)}.{keep}.{fmt}"
    path.write_bytes(data[:int(len(data) * keep)])
    return path


#: at 99.9 %: each cut file's salvage, by format
WHOLE: dict[str, list["Salvage"]] = {fmt: [] for fmt in FORMATS}


#: a module symbol as a frame prints it: `` (func+0x../0x.. [mod])``
MODULE_SYMBOL = re.compile(r" \([^()]*\[[^]]+\]\)")


def _same_frame(cut: str, uncut: str) -> bool:
    """The same frame, or the same without its module symbol: a module whose ``struct module`` is past the cut
    is not named (its pc prints bare, as the kernel prints an address no symbol covers)."""
    return cut == uncut or cut == MODULE_SYMBOL.sub("", uncut)


class Salvage(NamedTuple):
    """What a cut file gives of the uncut file's tasks: walked as uncut, walked in part (the first frames, then a
    stop on what is missing), or lost (listed with what is missing, or not listed at all)."""

    whole: int
    partial: int
    lost: int


def _check_salvage(uncut: dict[Key, Walk], cut: dict[Key, Walk]) -> Salvage:
    """Every task of the cut file against the uncut one: no frame of its own, each loss named."""
    whole = partial = 0
    structs = {k[1] for k in uncut if k[0] != "cpu"}
    on_cpu = {w.running_cpu: k for k, w in uncut.items() if w.running_cpu is not None}
    for key, w in cut.items():
        if key[0] == "cpu":  # a CPU whose task is unknown: listed by its registers, not walked, saying why
            assert key[1] in on_cpu, f"cpu{key[1]} runs no task in the uncut file"
            assert not w.frames and w.reason is StopReason.MEMORY_FAULT and "unknown" in w.detail, (key, w)
            continue
        if key[0] is None:  # its pid or comm is past the cut: listed by its address, saying what is missing
            assert key[1] in structs, f"task_struct {key[1]} is not in the uncut file"
            assert not w.frames and w.reason is StopReason.MEMORY_FAULT and BEYOND in w.detail, (key, w)
            continue
        assert key in uncut, f"task {key} is not in the uncut file"
        want = uncut[key]
        assert len(w.frames) <= len(want.frames) and all(map(_same_frame, w.frames, want.frames)), \
            (key, w.frames, want.frames)
        if (w.frames, w.reason, w.detail) == (want.frames, want.reason, want.detail):
            whole += 1
        elif (w.reason, w.detail) == (want.reason, want.detail):
            partial += 1  # a module frame printed bare
        elif w.reason is StopReason.MEMORY_FAULT:
            assert (BEYOND in w.detail and "0x" in w.detail) or "unknown" in w.detail, (key, w.detail)
            partial += bool(w.frames)
        else:  # on a CPU whose current or registers are beyond the cut: its saved context may be stale, not walked
            assert not w.frames and "may be stale" in w.note, (key, w)
    return Salvage(whole, partial, len(uncut) - whole - partial)


def _salvage(vmcore: Path, fmt: str, keep: float, tmp: Path, folder: Path) -> Salvage:
    """Cut ``vmcore`` in ``fmt`` to ``keep``, replay it, check it against the uncut replay."""
    uncut = _uncut(vmcore, tmp)
    path = _cut(vmcore, fmt, keep, tmp, folder)
    got = _replay(path, _image(vmcore))
    assert not isinstance(got, str), f"refused: {got}"
    cut, warnings = got
    said = [w for w in warnings if w.startswith(f"{path}: truncated") or w.startswith(f"{path}: xz stream ends early")]
    got = _check_salvage(uncut, cut)
    if not said:  # the cut took only bytes no part of the file points to (makedumpfile's zero tail): nothing lost
        assert got == Salvage(len(uncut), 0, 0) and cut == uncut, warnings
    else:
        assert len(said) == 1 and "absent" in said[0], warnings
    return got


@pytest.mark.parametrize("vmcore,fmt,keep", _cases())
def test_a_cut_vmcore_replays_what_it_holds(vmcore: Path, fmt: str, keep: float, tmp_path_factory) -> None:
    got = _salvage(vmcore, fmt, keep, tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("cut"))
    if keep == 0.999:
        WHOLE[fmt].append(got)


@pytest.mark.parametrize("fmt", FORMATS + ("every format",))
def test_at_99_9_percent_nearly_every_task_is_salvaged_whole(fmt: str) -> None:
    """Runs after the cuts above (pytest keeps file order): at least 95 % of the tasks walk as uncut, in each
    format once every vmcore was cut in it (``--slow``), and over every cut that ran."""
    if fmt == "every format":
        cuts = [s for got in WHOLE.values() for s in got]
    else:
        cuts = WHOLE[fmt]
        if len(cuts) < sum(fmt in _formats(v) for v in VMCORES + MAKEDUMPFILE):
            pytest.skip(f"not every vmcore was cut in {fmt} in this session (--slow cuts them all)")
    whole, total = sum(s.whole for s in cuts), sum(sum(s) for s in cuts)
    if total == 0:
        pytest.skip("no 99.9 % cut ran in this session")
    print(f"{fmt}: {whole} of {total} tasks salvaged whole at 99.9 % ({100 * whole / total:.1f} %)")
    assert whole >= 0.95 * total


def test_the_cli_says_once_what_a_cut_file_lacks(tmp_path_factory) -> None:
    vmcore = VMCORES[0]
    data = _whole(vmcore, "elf", tmp_path_factory.getbasetemp())
    path = tmp_path_factory.mktemp("cli") / "cut.elf"
    path.write_bytes(data[:int(len(data) * 0.999)])
    r = subprocess.run([sys.executable, "-m", "unwind", "replay", "--all", "--vmlinux", str(_image(vmcore)),
                        str(path)], capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "missing" in ln]
    assert len(lines) == 1 and lines[0].startswith(f"unwind: warning: {path}: truncated"), r.stderr


@pytest.mark.parametrize("arch,keep", [("x86_64", 0.5), ("riscv", 0.9)])
def test_a_cut_vmcore_converted_stops_as_the_vmcore(arch: str, keep: float, tmp_path_factory) -> None:
    """``unwind convert`` of a cut vmcore keeps what each task lacks, and why each part of a stack it lacks is
    missing: every task of the converted dump walks the vmcore's frames and stops as the vmcore's does, saying
    the same (x86 at 50 %: both CPUs' tasks unknown, ``init_task`` by its address; riscv at 90 %: tasks whose
    ``task_struct`` is cut, walks stopped on stack pages past the cut)."""
    from unwind.cli.tasks import convert

    vmcore = next(p for p in VMCORES if p.parts[-4] == arch and p.name.startswith("stop-"))
    folder = tmp_path_factory.mktemp("convert")
    path = _cut(vmcore, "elf", keep, tmp_path_factory.getbasetemp(), folder)
    s = Session.load(path, vmlinux=_image(vmcore))
    convert(s, s.select(every=True)).write(folder / "converted.bin")
    got, want = _replay(folder / "converted.bin", _image(vmcore)), _replay(path, _image(vmcore))
    assert not isinstance(got, str) and not isinstance(want, str), (got, want)
    lacking = [k for k, w in want[0].items() if not w.frames and w.reason is StopReason.MEMORY_FAULT
               and ("unknown" in w.detail or k[0] is None)]
    assert lacking, "the cut leaves every task walkable: nothing to carry"
    assert any(BEYOND in w.detail and w.frames for w in want[0].values()) or arch == "x86_64"
    assert got[0].keys() == want[0].keys()
    for key, w in want[0].items():
        g = got[0][key]
        assert (g.frames, g.reason, g.detail, g.running_cpu) == (w.frames, w.reason, w.detail, w.running_cpu), key


def test_a_truncated_xz_vmcore_reads_what_decompresses(tmp_path_factory) -> None:
    tmp = tmp_path_factory.getbasetemp()
    vmcore = next(p for p in VMCORES if "x86_64" in p.parts[-4] and "stop" in p.name)
    raw = vmcore.read_bytes()
    path = tmp_path_factory.mktemp("xz") / "cut.elf.xz"
    path.write_bytes(raw[:int(len(raw) * 0.999)])
    whole = path.with_name("whole.elf")
    whole.write_bytes(_whole(vmcore, "elf", tmp))
    with open_vmcore(path) as vm, open_vmcore(whole) as w:
        assert vm.damage is not None and "xz stream ends early" in str(vm.damage)
        read = 0
        for r in w.ranges:  # what decompressed is the file's own bytes; the rest is a fault of the cut
            try:
                got = vm.read_phys(r.start, r.end - r.start)
            except MemoryFault as e:
                assert BEYOND in str(e)
                continue
            assert got == w.read_phys(r.start, r.end - r.start)
            read += 1
        assert read
    got = _replay(path, _image(vmcore))
    assert not isinstance(got, str), got
    cut, warnings = got
    assert sum("xz stream ends early" in w for w in warnings) == 1
    _check_salvage(_uncut(vmcore, tmp), cut)


def _unplaced(case: str, tmp: Path, folder: Path) -> tuple[Path, Path]:
    """The vmcore and a cut of it that has lost what places its kernel (:func:`test_a_cut_that_loses_the_kernels_place_lists_the_cpus_by_their_notes`)."""
    if case == "riscv-makedumpfile-0.5":
        vmcore = next(p for p in MAKEDUMPFILE if p.parts[-4] == "riscv")
        assert not VmcoreFile.open(str(vmcore)).vmcoreinfo_text
        return vmcore, _cut(vmcore, "flat", 0.5, tmp, folder)
    vmcore = next(p for p in VMCORES if p.parts[-4] == "x86_64" and p.name.startswith("stop-"))
    data = bytearray(_whole(vmcore, "elf", tmp))
    data = data[:int(len(data) * 0.999)]
    at = data.find(b"VMCOREINFO\0")  # the PT_NOTE's, first in the file: x86-64 reads VMCOREINFO only from it
    data[at:at + 10] = bytes(10)
    path = folder / "x86-no-vmcoreinfo.elf"
    path.write_bytes(bytes(data))
    return vmcore, path


@pytest.mark.parametrize("case", ["riscv-makedumpfile-0.5", "x86_64-elf-0.999-note-wiped"])
def test_a_cut_that_loses_the_kernels_place_lists_the_cpus_by_their_notes(case: str, tmp_path_factory) -> None:
    """The riscv makedumpfile slice has no VMCOREINFO note (made with ``-i``): the kernel is placed by its own
    ``vmcoreinfo_note``, and at 50 % that page, ``kernel_map`` and ``swapper_pg_dir`` are past the cut; an x86-64
    vmcore cut short whose VMCOREINFO note is gone has nothing to place its kernel by. Neither is refused: each
    CPU of the uncut file is listed by its note, with its registers, and not walked (exit 1, damaged); stderr
    says once what the file lacks. Without the image at hand, the same."""
    vmcore, path = _unplaced(case, tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("unplaced"))
    running = {w.running_cpu for w in _uncut(vmcore, tmp_path_factory.getbasetemp()).values()} - {None}
    for vmlinux in (["--vmlinux", str(_image(vmcore))], []):
        r = subprocess.run([sys.executable, "-m", "unwind", "replay", "--all", *vmlinux, str(path)],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "UNWIND_IMAGE_PATH": ""})
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        said = [ln for ln in r.stderr.splitlines() if "not placed" in ln]
        assert len(said) == 1 and "VMCOREINFO" in said[0] and "beyond the end of the file" in said[0], r.stderr
        cpus = re.findall(r"^pid \? \(\?\) on cpu(\d+):$", r.stdout, re.M)
        assert {int(c) for c in cpus} == running and len(cpus) == len(running), r.stdout
        assert r.stdout.count("task is unknown (the kernel is not placed") == len(running), r.stdout


def test_a_cpus_current_cut_short_is_listed_running_there(tmp_path_factory) -> None:
    """riscv's ``current`` is ``tp``: at 50 % the running tasks' ``task_struct.pid`` is past the cut, and each
    is listed by its address running on its CPU (``ps`` shows ``>``), the uncut file's task there, with its
    registers, not walked, saying what is missing."""
    vmcore = next(p for p in VMCORES if p.parts[-4] == "riscv" and p.name.startswith("stop-"))
    tmp = tmp_path_factory.getbasetemp()
    path = _cut(vmcore, "elf", 0.5, tmp, tmp_path_factory.mktemp("current"))
    got = _replay(path, _image(vmcore))
    assert not isinstance(got, str), got
    running = {w.running_cpu: k[1] for k, w in _uncut(vmcore, tmp).items() if w.running_cpu is not None}
    lost = {w.running_cpu: k[1] for k, w in got[0].items() if k[0] is None and w.running_cpu is not None}
    assert running and lost == running, (lost, running)
    assert all(BEYOND in got[0][(None, addr)].detail for addr in lost.values())


def test_a_riscv_vmcoreinfo_lost_with_the_cut_is_rebuilt_as_the_kernel_wrote_it(tmp_path_factory) -> None:
    """QEMU writes no VMCOREINFO for riscv, so the kernel's own note in memory is all there is. Cut short, the
    file still holds that note, and it is read from there; with the note's name also wiped out of the cut file,
    VMCOREINFO is rebuilt from the image's variables. Either way every key equals the kernel's note in the
    uncut file."""
    vmcore = next(p for p in VMCORES if p.parts[-4] == "riscv" and p.name.startswith("stop-"))  # QEMU's, not a kdump
    tmp = tmp_path_factory.getbasetemp()
    data = _whole(vmcore, "elf", tmp)
    cut = bytearray(data[:int(len(data) * 0.999)])
    wiped = bytearray(cut)
    name = b"VMCOREINFO\0"
    at = wiped.find(name)
    assert at >= 0, "the kernel's vmcoreinfo_note is not in the cut file"
    while at >= 0:
        wiped[at:at + len(name)] = bytes(len(name))
        at = wiped.find(name, at + 1)
    paths = {}
    for label, body in (("whole", data), ("cut", cut), ("wiped", wiped)):
        paths[label] = tmp / f"rv-{label}.elf"
        paths[label].write_bytes(bytes(body))
    note, read, rebuilt = (Session.load(paths[k], vmlinux=_image(vmcore)) for k in ("whole", "cut", "wiped"))
    assert any("read from the kernel's vmcoreinfo_note" in w for w in read.warnings), read.warnings
    assert any("rebuilt" in w for w in rebuilt.warnings) and not any("rebuilt" in w for w in note.warnings)
    keys = dict(rebuilt.dump.vmcoreinfo)
    assert {"NUMBER(MODULES_VADDR)", "NUMBER(MODULES_END)", "NUMBER(va_kernel_pa_offset)"} <= set(keys)
    assert all(dict(note.dump.vmcoreinfo)[k] == v for k, v in keys.items()), keys
    assert dict(read.dump.vmcoreinfo) == dict(note.dump.vmcoreinfo)


@pytest.mark.parametrize("vmcore", VMCORES, ids=lambda p: f"{p.parts[-4]}-{p.parts[-3]}-{p.name.split('.')[0]}")
def test_a_vmcore_whose_btf_is_damaged_is_read_with_the_images(vmcore: Path, tmp_path_factory) -> None:
    """The kernel's own BTF is read from the dump when it parses; with its header broken (two bytes of the
    magic, found in the file by the image's ``.BTF`` bytes), the image's ``.BTF`` is used, the warning says so
    once, and every task walks as in the intact file."""
    btf = Image(_image(vmcore)).section(".BTF")
    if btf is None:
        pytest.skip(f"{_image(vmcore).name} carries no .BTF: nothing to fall back to")
    tmp = tmp_path_factory.getbasetemp()
    data = bytearray(_whole(vmcore, "elf", tmp))
    at = data.find(btf[1][:256])
    if at < 0:
        pytest.skip("the kernel's BTF is not in this file (a slice without it)")
    assert data[at:at + 2] == b"\x9f\xeb"  # BTF_MAGIC 0xeB9F, little-endian
    data[at:at + 2] = b"\0\0"
    path = tmp_path_factory.mktemp("btf") / f"{vmcore.stem}.btf-broken.elf"
    path.write_bytes(bytes(data))
    got = _replay(path, _image(vmcore))
    assert not isinstance(got, str), got
    tasks, warnings = got
    said = [w for w in warnings if "BTF from the image" in w]
    assert len(said) == 1 and str(_image(vmcore).name) in said[0] and "BTF" in said[0], warnings
    assert tasks == _uncut(vmcore, tmp)
