"""Kernel virtual reads over a vmcore: ours (page-table walk, shortcuts) beside drgn's, on the same addresses.

``replay`` rows: the committed real page tables (``tests/vmcore/data``), every
recorded address translated from a cold cache, shortcuts on and walk only.
``vmcore`` rows need ``$UNWIND_VMCORES/<arch>/stop-*.elf`` (labvmcore's QEMU
dumps; default ``/work/lab-out/vmcores``) and drgn: 64 bytes at each address
drgn sampled (task_structs, stacks, per-CPU areas), read by a fresh
``VirtualMemory`` (cold: every page translated) and by drgn's ``prog.read``
on a Program opened once.
"""

from __future__ import annotations

import base64
import json
import lzma
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pytest

from benchkit import QUICK, REPO, Missing, measure, need

from unwind.core import registry
from unwind.formats.vmcore.virtual import VirtualMemory
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from tests.vmcore.phys import SparsePhys

RECORDS = REPO / "tests" / "vmcore" / "data"
VMCORES = Path(os.environ.get("UNWIND_VMCORES", "/work/lab-out/vmcores"))
KERNELS = Path.home() / ".cache" / "unwind" / "kernels"
_FLAVOUR = {"x86_64": "amd64", "arm64": "arm64"}


@lru_cache(maxsize=None)
def recorded(arch: str) -> tuple[Callable[[bool], Any], list[int]] | Missing:
    """A translator factory over the committed pages of ``arch`` and the addresses drgn answered."""
    paths = sorted(RECORDS.glob(f"{arch}-*-translations.json.xz"))
    if not paths:
        return Missing(f"no committed translations for {arch}")
    with lzma.open(paths[0], "rt") as f:
        doc = json.load(f)
    phys = SparsePhys(page_size=doc["page_size"])
    phys.pages = {int(k, 16): bytearray(base64.b64decode(v)) for k, v in doc["pages"].items()}
    info = VmcoreInfo.parse(doc["vmcoreinfo"])
    symbols = {k: int(v, 16) for k, v in doc["symbols"].items()}

    def make(shortcuts: bool) -> Any:
        tr = registry.get(arch).translator(info, phys, symbols.get)
        if not shortcuts:
            tr.linear = ()
        return tr

    vas = [int(t["va"], 16) for t in doc["translations"] if t["pa"] is not None]
    return make, vas[:16] if QUICK else vas


def translate_all(make: Callable[[bool], Any], shortcuts: bool, vas: list[int]) -> int:
    """Every address through a fresh translator (no cache); the count."""
    tr = make(shortcuts)
    for va in vas:
        tr.translate(va)
    return len(vas)


@pytest.mark.parametrize("mode", ["shortcuts", "walk"])
@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_translate_recorded(benchmark: Any, arch: str, mode: str) -> None:
    """Translate each recorded address of a real kernel once."""
    make, vas = need(recorded(arch))
    benchmark.group = f"translate: {arch}"
    benchmark.extra_info.update(kind="translate", arch=arch, mode=mode, addresses=len(vas))
    measure(benchmark, translate_all, make, mode == "shortcuts", vas)


@lru_cache(maxsize=None)
def vmcore_workload(arch: str) -> tuple[Any, Any, Any, list[int]] | Missing:
    """(our open vmcore, our memory factory, drgn Program, addresses) for the first ELF vmcore of ``arch``."""
    if QUICK:
        return Missing("a real vmcore is not for the smoke run")
    try:
        import drgn  # noqa: F401
    except ImportError:
        return Missing("drgn is not installed")
    vmcores = sorted((VMCORES / arch).glob("stop-*.elf"))
    vmlinux = KERNELS / f"6.12.117+deb13-{_FLAVOUR[arch]}" / "vmlinux"
    if not vmcores or not vmlinux.exists():
        return Missing(f"no {arch} vmcore in {VMCORES} (or no vmlinux)")
    from unwind.formats.image import Image
    from unwind.lab import translations
    from unwind.formats.vmcore import open_vmcore

    prog = translations.drgn_program(vmcores[0], vmlinux, arch)
    answers = translations.drgn_answers(prog, translations.sample_addresses(prog))
    vas = [a["va"] for a in answers if a["bytes"] is not None]
    vmc = open_vmcore(vmcores[0])
    image = Image(vmlinux)

    def fresh() -> VirtualMemory:
        return translations.our_memory(vmc, arch, image)[0]

    fresh()  # the image's symbol table is read once, here, not in the first timed round
    return vmc, fresh, prog, vas


def read_ours(fresh: Callable[[], VirtualMemory], vas: list[int]) -> int:
    """64 bytes at each address through a fresh VirtualMemory; the count."""
    vm = fresh()
    for va in vas:
        vm.read(va, 64)
    return len(vas)


def read_drgn(prog: Any, vas: list[int]) -> int:
    """64 bytes at each address through drgn; the count."""
    for va in vas:
        prog.read(va, 64)
    return len(vas)


@pytest.mark.parametrize("tool", ["unwind", "drgn"])
@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_read_vmcore(benchmark: Any, arch: str, tool: str) -> None:
    """64 bytes at every sampled address of a real vmcore."""
    _, fresh, prog, vas = need(vmcore_workload(arch))
    benchmark.group = f"vmcore reads: {arch}"
    benchmark.extra_info.update(kind="vmcore-read", arch=arch, tool=tool, addresses=len(vas))
    if tool == "unwind":
        measure(benchmark, read_ours, fresh, vas)
    else:
        measure(benchmark, read_drgn, prog, vas)
