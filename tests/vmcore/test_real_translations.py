"""Translations of real 6.12 kernels' page tables equal drgn's.

The committed files (``data/*-translations.json.xz``) were written by
``python -m unwind.lab.translations VMCORE VMLINUX ARCH -o OUT`` on labvmcore's
QEMU ``dump-guest-memory`` vmcores of Debian 6.12.117 guests (x86-64 4-level;
arm64 4K pages, 52-bit VA with LPA2; riscv Sv57 without VMCOREINFO; stop-000,
and stop-001 with modules loaded for ``*-modules-*``), on vmfmt's true kdump
``/proc/vmcore`` of an x86-64 crash (``*-kdump-*``: kexec -p, sysrq c), on
the 16K-page arm64 kernels (``*-16k-*``: trixie's 6.12.117 and sid's 7.2.13
``arm64-16k`` flavour, module guests of the lab) and on one
x86-64 guest booted by hand with KASLR and ``-cpu max`` (LA57: 5-level paging,
KERNELOFFSET 0x25600000, a negative phys_base): ``qemu-system-x86_64 -accel tcg
-m 256M -smp 1 -cpu max -device vmcoreinfo -kernel <boot-image> -initrd <the
lab's initrd> -append "console=ttyS0 panic=-1 rdinit=/init"``, then HMP ``stop``
and ``dump-guest-memory``; likewise one arm64 guest with KASLR on 48-bit
hardware (``qemu-system-aarch64 -M virt -cpu max,lpa2=off,pauth-impdef=on``:
the 52-bit kernel folds a level, TCR_EL1_T1SZ=16, PHYS_OFFSET wraps to
0xfff1000040000000); and two riscv guests booted by hand with ``no5lvl``
(Sv48) and ``no4lvl`` (Sv39), whose answers are QEMU's own MMU: HMP
``gva2gpa`` of each task_struct and stack address (listed by our Session)
with the guest stopped. drgn 0.3.0 sampled the addresses itself
(image variables, every task_struct and stack, per-CPU runqueues) and gave
``follow_phys(init_mm, va)`` for each; the file keeps those answers, the
VMCOREINFO and the physical pages our walk read (page tables, the variables
the shortcuts need). The slow tests redo the comparison on the vmcores
themselves, bytes included, and against the project's capture of the same stop.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from unwind.core import registry
from unwind.formats.dump import DumpError
from unwind.formats.image import Image
from unwind.core.memory import MemoryFault
from unwind.formats.vmcore.virtual import VirtualMemory
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from unwind.lab.translations import SHORTCUT_SYMBOLS
from tests.vmcore.phys import SparsePhys

DATA = Path(__file__).parent / "data"
CORPORA = Path(__file__).resolve().parents[2] / "corpora"
RECORDS = sorted(DATA.glob("*-translations.json.xz"))
VMCORES = Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores"))
KERNELS = Path.home() / ".cache/unwind/kernels"


def load(path: Path) -> tuple[dict, SparsePhys]:
    with lzma.open(path, "rt") as f:
        doc = json.load(f)
    phys = SparsePhys(page_size=doc["page_size"])
    for pfn, data in doc["pages"].items():
        phys.pages[int(pfn, 16)] = bytearray(base64.b64decode(data))
    return doc, phys


def shortcut_symbols(doc: dict) -> dict[str, int]:
    """The runtime symbols recorded with the answers, plus the image segment bounds the shortcuts take
    (``unwind.lab.translations.SHORTCUT_SYMBOLS``) where the record predates them: the committed slim image
    of the same build-id, moved by the record's KASLR slide (its ``_stext`` against the image's)."""
    symbols = {k: int(v, 16) for k, v in doc["symbols"].items()}
    build_id = VmcoreInfo.parse(doc["vmcoreinfo"]).get("BUILD-ID")
    slim = next(iter(CORPORA.glob(f"*/*/vmlinux-{build_id}.slim.xz")), None) if build_id else None
    if slim is None:
        return symbols
    image = Image(slim)
    slide = symbols["_stext"] - image.symbols.address("_stext")
    for name in SHORTCUT_SYMBOLS:
        if name not in symbols and (a := image.symbols.address(name)) is not None:
            symbols[name] = a + slide
    return symbols


def test_every_arch_has_a_record():
    assert {p.name.split("-")[0] for p in RECORDS} == {"x86_64", "arm64", "riscv"}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name.split("-translations")[0])
@pytest.mark.parametrize("shortcuts", [True, False], ids=["shortcuts", "walk"])
def test_translations_equal_the_oracles(path, shortcuts):
    doc, phys = load(path)
    symbols = shortcut_symbols(doc)
    tr = registry.get(doc["arch"]).translator(VmcoreInfo.parse(doc["vmcoreinfo"]), phys, symbols.get)
    if doc["arch"] != "riscv":  # the image segments (riscv: the whole image) and the linear map
        assert len(tr.linear) == {"x86_64": 5, "arm64": 4}[doc["arch"]], tr.linear
    if not shortcuts:
        tr.linear = ()
    vm = VirtualMemory(phys, tr)
    checked = 0
    for t in doc["translations"]:
        if t["pa"] is not None:
            assert vm.page_phys(int(t["va"], 16)) == int(t["pa"], 16), t
            checked += 1
    assert checked > 100 or not doc["translations"]  # riscv stop-000: the capture is its only oracle


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name.split("-translations")[0])
def test_captured_stacks_read_through_real_page_tables(path):
    """Every segment of the capture of the same stop (QEMU's MMU read it) equals our read (riscv's oracle)."""
    doc, phys = load(path)
    symbols = shortcut_symbols(doc)
    vm = VirtualMemory(phys, registry.get(doc["arch"]).translator(VmcoreInfo.parse(doc["vmcoreinfo"]), phys,
                                                                   symbols.get))
    if not doc["capture"]:
        pytest.skip("recorded without a capture of the same stop")
    assert len(doc["capture"]) > 50
    for seg in doc["capture"]:
        assert hashlib.sha256(vm.read(int(seg["va"], 16), seg["size"])).hexdigest() == seg["sha256"], seg


@pytest.mark.parametrize("path", [p for p in RECORDS if p.name.startswith("riscv")], ids=lambda p: p.name[:-21])
def test_riscv_vmcoreinfo_found_in_memory_as_recorded(path):
    """QEMU writes no VMCOREINFO for riscv: the kernel's own note is found through the image's symbols."""
    doc, phys = load(path)
    assert "vmcoreinfo_note" in doc["vmcoreinfo_found"]
    link = {k: int(v, 16) for k, v in doc["link_symbols"].items()}
    ranges = [(int(a, 16), int(b, 16)) for a, b in doc["ranges"]]
    info, how = registry.get("riscv").vmcoreinfo_from_memory(phys, ranges, link.get)
    assert how == doc["vmcoreinfo_found"] and dict(info) == dict(VmcoreInfo.parse(doc["vmcoreinfo"]))
    mode = {"sv39": 39, "sv48": 48}.get(path.name.split("-")[2], 57)
    assert info["OSRELEASE"] == "6.12.117+deb13-riscv64" and info.number("NUMBER(VA_BITS)") == mode


def _vmcore_cases() -> list[tuple[str, Path, Path]]:
    out = []
    for arch, flavour in (("x86_64", "amd64"), ("arm64", "arm64"), ("riscv", "riscv64")):
        for vmcore in sorted((VMCORES / arch).glob("stop-*.elf")):
            out.append((arch, vmcore, KERNELS / f"6.12.117+deb13-{flavour}" / "vmlinux"))
    return out


NO_VMCORES = [pytest.param(None, None, None, marks=pytest.mark.skip(reason="no vmcores in $UNWIND_VMCORES"))]
NO_VMCORE = [pytest.param(None, marks=pytest.mark.skip(reason="no riscv vmcore in $UNWIND_VMCORES"))]


@pytest.mark.slow
@pytest.mark.parametrize("arch,vmcore,vmlinux", _vmcore_cases() or NO_VMCORES)
def test_vmcores_against_drgn_and_the_capture(arch, vmcore, vmlinux, tmp_path):
    """The whole check on the vmcore itself: drgn's translations and bytes, and the capture's bytes."""
    from unwind.lab import translations

    if arch != "riscv":
        pytest.importorskip("drgn")
    capture = vmcore.with_name(vmcore.name.replace(".elf", ".bin.xz"))
    doc = translations.record(vmcore, vmlinux, arch, tmp_path / "t.json.xz",
                              capture=capture if capture.exists() else None)
    assert len(doc["translations"]) > 100 or arch == "riscv"
    assert doc["capture"] or not capture.exists()


@pytest.mark.slow
@pytest.mark.parametrize("vmcore", sorted((VMCORES / "riscv").glob("stop-*.elf")) or NO_VMCORE)
def test_riscv_vmcoreinfo_rebuilt_from_the_image_equals_the_kernels_note(vmcore):
    """What arch_crash_save_vmcoreinfo() would print, read from kernel_map & co, equals the kernel's own note."""
    from unwind.arch.riscv import mm
    from unwind.formats.image import Image
    from unwind.formats.vmcore import open_vmcore

    image = Image(KERNELS / "6.12.117+deb13-riscv64" / "vmlinux")
    with open_vmcore(vmcore) as vmc:
        note, how = mm.find_vmcoreinfo(vmc, [(r.start, r.end) for r in vmc.ranges], image.symbols.address, image.btf)
        base = int(how.split("physical ")[1].split(")")[0], 16)
        rebuilt = mm.arch_crash_save_vmcoreinfo(vmc, base, image.symbols.address, image.btf)
    assert rebuilt is not None
    for key, value in rebuilt.items():
        assert note[key] == value or note.word(key) == rebuilt.word(key), key


@settings(deadline=None, max_examples=40)
@given(st.data())
def test_mutated_vmcoreinfo_is_one_dump_error_or_a_translator(data):
    """A real VMCOREINFO with one value replaced by junk: DumpError, or a translator that faults cleanly."""
    path = data.draw(st.sampled_from(RECORDS))
    doc, phys = load(path)
    info = dict(VmcoreInfo.parse(doc["vmcoreinfo"]))
    key = data.draw(st.sampled_from(sorted(info)))
    info[key] = data.draw(st.one_of(st.text(max_size=30), st.integers(-(1 << 80), 1 << 80).map(str),
                                    st.integers(0, 1 << 70).map(hex), st.just("0x"), st.just("-1")))
    text = "".join(f"{k}={v}\n" for k, v in info.items() if "\n" not in v and "\r" not in v)
    symbols = {k: int(v, 16) for k, v in doc["symbols"].items()}
    try:
        tr = registry.get(doc["arch"]).translator(VmcoreInfo.parse(text), phys, symbols.get)
    except DumpError as e:
        assert "\n" not in str(e)
        return
    vm = VirtualMemory(phys, tr)
    for t in doc["translations"][:20] + [{"va": s["va"]} for s in doc["capture"][:10]]:
        try:
            vm.read_u64(int(t["va"], 16))
        except MemoryFault:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("vmcore", sorted((VMCORES / "riscv").glob("stop-*.elf")) or NO_VMCORE)
def test_riscv_vmcore_without_vmcoreinfo_loads_and_says_so(vmcore):
    from unwind.session.replay import Session

    s = Session.load(vmcore, vmlinux=KERNELS / "6.12.117+deb13-riscv64" / "vmlinux")
    assert any("read from the kernel's vmcoreinfo_note" in w for w in s.warnings)
    assert s.dump.release == "6.12.117+deb13-riscv64" and len(s.dump.tasks()) > 50
