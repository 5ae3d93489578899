"""``unwind.lab.vmcores.slice_kdump`` on kdump-compressed and flattened files whose every byte is known
(:mod:`tests.vmcore.synth`): the pages kept read as before, every other page of RAM reads as excluded."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from unwind.formats.vmcore import open_vmcore
from unwind.formats.vmcore.errors import ExcludedPageFault
from unwind.lab.vmcores import slice_kdump

from .synth import KdumpSpec, flatten, kdump_file, page_bytes

ZERO = bytes(4096)
#: RAM pfns 16..80; 40..47 are pages of zeros (one shared record); 60..63 filtered out by the writer
RAM = set(range(16, 80))
DUMPED = {pfn: (ZERO if 40 <= pfn < 48 else page_bytes(pfn)) for pfn in RAM if not 60 <= pfn < 64}
KEEP = {17, 18, 30, 41, 45, 70, 79, 100}  # 100: not in the file at all


def _file(tmp_path: Path, flat: bool) -> Path:
    data = kdump_file(KdumpSpec(max_mapnr=128, ram=RAM, dumped=DUMPED, vmcoreinfo="PAGESIZE=4096\n"))
    p = tmp_path / ("src.flat" if flat else "src.kdump")
    p.write_bytes(flatten(data, record=1000, seed=3, sparse=False) if flat else data)
    return p


@pytest.mark.parametrize("flat", [False, True], ids=["kdump", "flattened"])
def test_kept_pages_read_as_before_and_the_others_are_excluded(tmp_path, flat) -> None:
    src = _file(tmp_path, flat)
    out = slice_kdump(src, tmp_path / "slice", KEEP)
    assert out.stat().st_size == src.stat().st_size  # every byte in its place
    with open_vmcore(out) as vm:
        assert vm.format == ("flattened-kdump" if flat else "kdump")
        assert vm.vmcoreinfo_dict["PAGESIZE"] == "4096"
        for pfn in sorted(RAM):
            if pfn in KEEP and pfn in DUMPED:
                assert vm.read_phys(pfn * 4096, 4096) == DUMPED[pfn], pfn
            else:
                with pytest.raises(ExcludedPageFault, match="excluded from the dump"):
                    vm.read_phys(pfn * 4096, 8)


def test_data_of_the_pages_left_out_is_gone(tmp_path) -> None:
    src = _file(tmp_path, flat=False)
    out = slice_kdump(src, tmp_path / "slice", KEEP).read_bytes()
    for pfn, page in DUMPED.items():
        if page != ZERO:  # the writer's zlib record of the page (synth: level 1)
            assert (zlib.compress(page, 1) in out) == (pfn in KEEP), pfn
