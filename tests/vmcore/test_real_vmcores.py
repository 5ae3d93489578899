"""Real vmcores from the lab (QEMU dump-guest-memory, makedumpfile): every format of one stop reads the same memory.

The expected bytes come from QEMU's own ELF dump of the stop, read through
plain ``PT_LOAD`` offsets; each other file was written by QEMU or
makedumpfile from the same stop. The flattened reader is checked against
``makedumpfile -R``'s reassembly. Files live outside the repository:
``$UNWIND_VMCORES`` (``:``-separated directories holding ``<arch>/<stop>.<kind>``),
by default the lab's output folders.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from unwind.core.memory import ExcludedPage, MemoryFault
from unwind.formats.vmcore import detect_format, open_vmcore

pytestmark = pytest.mark.slow

DEFAULT_DIRS = "/work/lab-out/vmcores:/work/lab-out/vmfmt/vmcores"
SAMPLE_PAGES = 3000


def _stops() -> list[tuple[Path, list[Path]]]:
    """(the stop's ELF, the other vmcores of the same stop) for every stop found."""
    groups: dict[tuple[str, str], list[Path]] = {}
    for d in os.environ.get("UNWIND_VMCORES", DEFAULT_DIRS).split(":"):
        for p in sorted(Path(d).glob("*/*.*")) if Path(d).is_dir() else []:
            stop, _, kind = p.name.partition(".")
            if kind.endswith((".elf", ".kdump", ".flat")) or kind in ("elf",):
                groups.setdefault((p.parent.name, stop), []).append(p)
    out = []
    for (arch, stop), files in sorted(groups.items()):
        base = [f for f in files if f.name == f"{stop}.elf"]
        if base:
            out.append((base[0], sorted({f.resolve(): f for f in files if f.name != f"{stop}.elf"}.values())))
    return out


STOPS = _stops()
CASES = [pytest.param(base, other, id=f"{base.parent.name}/{other.name}") for base, others in STOPS for other in others]


def _expected_format(path: Path) -> str:
    kind = path.name.partition(".")[2]
    if kind.endswith(".flat"):
        return "flattened-kdump" if "-E" not in kind else "flattened-elf"
    return "elf" if kind.endswith(".elf") else "kdump"


@pytest.mark.skipif(not CASES, reason="no lab vmcores here ($UNWIND_VMCORES)")
@pytest.mark.parametrize("base,other", CASES)
def test_same_stop_same_bytes(base: Path, other: Path) -> None:
    assert detect_format(other) == _expected_format(other)
    with open_vmcore(base) as ref, open_vmcore(other) as vm:
        assert vm.machine == ref.machine is not None
        assert vm.vmcoreinfo == ref.vmcoreinfo
        assert [p.desc for p in vm.prstatus] == [p.desc for p in ref.prstatus]
        pfns = [pfn for r in ref.ranges for pfn in range(r.start // 4096, r.end // 4096)]
        sample = random.Random(other.name).sample(pfns, min(SAMPLE_PAGES, len(pfns)))
        same = excluded = 0
        for pfn in sample:
            want = ref.read_phys(pfn * 4096, 4096)
            try:
                got = vm.read_phys(pfn * 4096, 4096)
            except ExcludedPage:
                excluded += 1
                continue
            except MemoryFault:
                continue  # outside this file's ranges (-p maps only what the page tables map; -E drops pages)
            assert got == want, f"pfn {pfn:#x}"
            same += 1
        assert same > len(sample) // 4
        if "-d31" in other.name and vm.format.endswith("kdump"):
            assert excluded > 0


FLAT_PAIRS = [pytest.param(f, f.with_name(f.name[:-len(".flat")] + ".kdump"), id=f"{f.parent.name}/{f.name}")
              for _base, others in STOPS for f in others
              if f.name.endswith(".flat") and f.with_name(f.name[:-len(".flat")] + ".kdump").exists()]


@pytest.mark.skipif(not FLAT_PAIRS, reason="no flattened vmcore with its makedumpfile -R reassembly here")
@pytest.mark.parametrize("flat,reassembled", FLAT_PAIRS)
def test_flattened_reads_as_makedumpfile_reassembles(flat: Path, reassembled: Path) -> None:
    with open_vmcore(flat) as vm:
        src = vm._src
        assert src.size == reassembled.stat().st_size
        with open(reassembled, "rb") as f:
            for off in range(0, src.size, 1 << 22):
                chunk = f.read(1 << 22)
                assert src.pread(off, len(chunk)) == chunk, f"offset {off:#x}"


KDUMPS = [pytest.param(base, id=f"{base.parent.name}/{base.name}") for base, _ in STOPS
          if base.name.startswith("kdump-") and base.with_name(base.name[:-4] + ".console.txt").exists()]


@pytest.mark.skipif(not KDUMPS, reason="no true kdump /proc/vmcore here ($UNWIND_VMCORES)")
@pytest.mark.parametrize("path", KDUMPS)
def test_true_kdump_vmcore(path: Path) -> None:
    """A /proc/vmcore the capture kernel served (x86-64 guest, 512 MiB, crashkernel=160M, sysrq c).

    Expected, from the kernel and the capture kernel's console: the first MiB and the crash kernel's own
    memory (its e820 "usable" range) are left out (arch/x86/kernel/crash.c elf_header_exclude_ranges), the
    rest of QEMU's RAM below 0x1ffdd000 is there; crash_save_vmcoreinfo added CRASHTIME; one note per CPU.
    """
    import re

    console = path.with_name(path.name[:-4] + ".console.txt").read_text(errors="replace")
    usable = [(int(a, 16), int(b, 16) + 1) for a, b in
              re.findall(r"BIOS-e820: \[mem 0x([0-9a-f]+)-0x([0-9a-f]+)\] usable", console)]
    crash_lo, crash_hi = max(usable, key=lambda r: r[1] - r[0])
    with open_vmcore(path) as vm:
        assert vm.format == "elf" and vm.machine == "EM_X86_64"
        assert "CRASHTIME" in vm.vmcoreinfo_dict and vm.vmcoreinfo_dict["PAGESIZE"] == "4096"
        assert len(vm.prstatus) == 2
        ranges = [(r.start, r.end) for r in vm.ranges]
        assert ranges[0][0] == 1 << 20 and ranges[-1][1] == 0x1ffdd000
        assert len(ranges) == 2 and ranges[0][1] <= crash_lo and crash_hi <= ranges[1][0]
        with pytest.raises(MemoryFault):
            vm.read_phys(crash_lo + 0x1000, 8)
        # the kernel image PT_LOAD (p_vaddr _text) holds linux_banner, as the console printed it
        banner = re.search(r"Linux version [^\n]*", console).group(0).split(" (")[0].encode()
        image = [v for v in vm.virtual_loads if v.vaddr >> 63 and v.vaddr >= 0xffffffff80000000]
        assert len(image) == 1
        assert banner in vm.read_phys(image[0].paddr, image[0].size)


FUZZ_FILES = [pytest.param(f, id=f"{f.parent.name}/{f.name}") for base, others in STOPS for f in [base, *others]
              if "paging" not in f.name]


@pytest.mark.skipif(not FUZZ_FILES, reason="no lab vmcores here ($UNWIND_VMCORES)")
@pytest.mark.parametrize("path", FUZZ_FILES)
def test_mutated_real_files_fail_cleanly(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes of a real file flipped where its headers, notes, bitmaps and descriptors are: one line or a fault."""
    from unwind.formats.vmcore import VmcoreError, source

    real = source.FileSource.pread
    patch: dict[int, int] = {}

    def pread(self: source.FileSource, offset: int, size: int) -> bytes:
        data = real(self, offset, size)
        hits = [o for o in patch if offset <= o < offset + size]
        if not hits:
            return data
        buf = bytearray(data)
        for o in hits:
            buf[o - offset] = patch[o]
        return bytes(buf)

    monkeypatch.setattr(source.FileSource, "pread", pread)
    size = path.stat().st_size
    rng = random.Random(path.name)
    outcomes: dict[str, int] = {}
    for _ in range(150):
        patch.clear()
        span = rng.choice((4096, 1 << 16, 1 << 20, size))
        for _ in range(rng.choice((1, 2, 4, 16))):
            patch[rng.randrange(min(span, size))] = rng.randrange(256)
        try:
            vm = open_vmcore(path)
        except VmcoreError as e:
            assert "\n" not in str(e)
            outcomes["error"] = outcomes.get("error", 0) + 1
            continue
        with vm:
            ranges = vm.ranges[:64]
            vm.page_size, vm.machine
            for _ in range(40):
                r = rng.choice(ranges) if ranges and rng.random() < 0.8 else None
                addr = rng.randrange(r.start, r.end) if r else rng.randrange(0, 1 << 33)
                try:
                    vm.read_phys(addr & ~7, 4096)
                except MemoryFault as e:
                    assert "\n" not in str(e)
        outcomes["opened"] = outcomes.get("opened", 0) + 1
    assert outcomes.get("opened")
