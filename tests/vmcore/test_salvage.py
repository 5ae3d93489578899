"""Damaged vmcores: every committed vmcore cut short, as ELF, kdump-compressed and flattened, replays what it holds.

The expected answer is the uncut file's replay: a task of the cut file prints the
uncut task's frames, all of them or the first ones and then a stop on the memory
the file no longer holds ("beyond the end of the file"), never a frame of its own.
The kdump-compressed and flattened files are written from the committed ELF
slices (``synth.kdump_of``: the same pages and notes; flattened block by block in
order, as ``makedumpfile -F`` writes). makedumpfile itself is not needed.
"""

from __future__ import annotations

import lzma
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from unwind.core.memory import MemoryFault
from unwind.core.walk import StopReason
from unwind.formats.dump import DumpError
from unwind.formats.image import Image
from unwind.formats.vmcore import open_vmcore
from unwind.session.replay import ReplayError, Session

from .synth import flatten, kdump_of

ROOT = Path(__file__).resolve().parents[2]
VMCORES = sorted(ROOT.glob("corpora/*/*/vmcore/*.elf.xz"))
#: the share of the file kept
CUTS = (0.999, 0.9, 0.5)
FORMATS = ("elf", "kdump", "flat")
BEYOND = "beyond the end of the file"


def _image(vmcore: Path) -> Path:
    return next(vmcore.parent.parent.glob("vmlinux-*"))


@cache
def _whole(vmcore: Path, fmt: str, tmp: Path) -> bytes:
    """The uncut file of ``vmcore`` in format ``fmt`` (``tmp``: a folder to open the ELF in)."""
    elf = lzma.decompress(vmcore.read_bytes())
    if fmt == "elf":
        return elf
    src = tmp / f"{vmcore.stem}.for-kdump"
    src.write_bytes(elf)
    with open_vmcore(src) as vm:
        kdump = kdump_of(vm)
    return kdump if fmt == "kdump" else flatten(kdump, record=4096, seed=None, sparse=False)


def _replay(path: Path, image: Path) -> tuple[dict[tuple[int, str], tuple], list[str]] | str:
    """Every task's (frames, stop reason, stop detail, note) by (pid, task_struct), and the warnings; or the
    one-line refusal."""
    try:
        s = Session.load(path, vmlinux=image)
    except (DumpError, ReplayError) as e:
        assert "\n" not in str(e)
        return str(e)
    out = {}
    for task in s.select(every=True):
        r = s.replay(task)
        out[(task.pid, task.task_struct)] = ([str(f) for f in r.frames], r.stop.reason, r.stop.detail,
                                               task.extra.get("note", ""))
    return out, list(s.warnings)


@cache
def _uncut(vmcore: Path, fmt: str, tmp: Path) -> dict[tuple[int, str], tuple]:
    path = tmp / f"{vmcore.stem}.whole.{fmt}"
    path.write_bytes(_whole(vmcore, fmt, tmp))
    got = _replay(path, _image(vmcore))
    assert not isinstance(got, str), got
    tasks, warnings = got
    assert not any("truncated" in w for w in warnings)
    assert not any("BTF from the image" in w for w in warnings)  # the dump's own BTF is read first
    return tasks


#: at 99.9 %: (tasks salvaged whole, tasks of the uncut files that opened, tasks of the refused ones) per format
WHOLE: dict[str, list[int]] = {fmt: [0, 0, 0] for fmt in FORMATS}


#: a module symbol as a frame prints it: `` (func+0x../0x.. [mod])``
MODULE_SYMBOL = re.compile(r" \([^()]*\[[^]]+\]\)")


def _same_frame(cut: str, uncut: str) -> bool:
    """The same frame, or the same without its module symbol: a module whose ``struct module`` is past the cut
    is not named (its pc prints bare, as the kernel prints an address no symbol covers)."""
    return cut == uncut or cut == MODULE_SYMBOL.sub("", uncut)


def _check_salvage(uncut: dict, cut: dict) -> int:
    """Every task of the cut file against the uncut one; the number salvaged whole."""
    whole = 0
    for key, (frames, reason, detail, note) in cut.items():
        if key[0] is None:  # its pid or comm is past the cut: listed by its address, saying what is missing
            assert key[1] in {k[1] for k in uncut}, f"task_struct {key[1]} is not in the uncut file"
            assert not frames and reason is StopReason.MEMORY_FAULT and BEYOND in detail, (key, detail)
            continue
        assert key in uncut, f"task {key} is not in the uncut file"
        want = uncut[key]
        assert len(frames) <= len(want[0]) and all(map(_same_frame, frames, want[0])), (key, frames, want[0])
        if (frames, reason, detail) == want[:3]:
            whole += 1
        elif (reason, detail) == want[1:3]:
            pass  # a module frame printed bare
        elif reason is StopReason.MEMORY_FAULT:
            assert BEYOND in detail and "0x" in detail, (key, detail)
        else:  # its CPU's current is beyond the cut: its saved context is not walked (it may be stale)
            assert not frames and "could not be read" in note, (key, reason, detail, note)
    return whole


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("keep", CUTS)
@pytest.mark.parametrize("vmcore", VMCORES, ids=lambda p: f"{p.parts[-4]}-{p.parts[-3]}-{p.name.split('.')[0]}")
def test_a_cut_vmcore_replays_what_it_holds(vmcore: Path, keep: float, fmt: str, tmp_path_factory) -> None:
    tmp = tmp_path_factory.getbasetemp()
    uncut = _uncut(vmcore, fmt, tmp)
    data = _whole(vmcore, fmt, tmp)
    path = tmp_path_factory.mktemp("cut") / f"{vmcore.stem}.{keep}.{fmt}"
    path.write_bytes(data[:int(len(data) * keep)])
    got = _replay(path, _image(vmcore))
    if isinstance(got, str):  # refused: only because what every task needs (BTF, VMCOREINFO) is past the cut
        assert BEYOND in got, got
        if keep == 0.999:
            WHOLE[fmt][2] += len(uncut)
        return
    cut, warnings = got
    said = [w for w in warnings if w.startswith(f"{path}: truncated")]
    assert len(said) == 1 and "missing" in said[0] and "absent" in said[0], warnings
    whole = _check_salvage(uncut, cut)
    if keep == 0.999:
        WHOLE[fmt][0] += whole
        WHOLE[fmt][1] += len(uncut)


@pytest.mark.parametrize("fmt", FORMATS)
def test_at_99_9_percent_nearly_every_task_is_salvaged_whole(fmt: str) -> None:
    """Runs after the cuts above (pytest keeps file order): at least 95 % of the tasks of the files that open
    walk as uncut."""
    whole, total, refused = WHOLE[fmt]
    if total == 0:
        pytest.skip("the 99.9 % cuts did not run in this session")
    print(f"{fmt}: {whole} of {total} tasks salvaged whole at 99.9 % ({100 * whole / total:.1f} %); "
          f"{refused} more in files refused ({100 * whole / (total + refused):.1f} % of all)")
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
    _check_salvage(_uncut(vmcore, "elf", tmp), cut)


def test_a_riscv_vmcoreinfo_lost_with_the_cut_is_rebuilt_as_the_kernel_wrote_it(tmp_path_factory) -> None:
    """QEMU writes no VMCOREINFO for riscv, so the kernel's own note in memory is all there is. Cut short, the
    file still holds that note, and it is read from there; with the note's name also wiped out of the cut file,
    VMCOREINFO is rebuilt from the image's variables. Either way every key equals the kernel's note in the
    uncut file."""
    vmcore = next(p for p in VMCORES if p.parts[-4] == "riscv")
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
    assert tasks == _uncut(vmcore, "elf", tmp)
