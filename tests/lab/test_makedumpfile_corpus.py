"""makedumpfile's ``-F -c -d 31`` file of an arm64 6.12 guest (4K pages, ``VA_BITS=52``, LPA2), cut down to the
pages the project reads, against the kernel's own sysrq-t traces of the same stop.

``corpora/arm64/6.12.117+deb13-arm64/makedumpfile/``: QEMU's ELF vmcore of a 256 MB guest (``unwind lab
boot --arch arm64 --mem 256M``, ``unwind capture --lab arm64 --stops 1 --vmcore elf``) filtered by makedumpfile
(``unwind.lab.vmcores.makedumpfile_variants``; which makedumpfile, and why, in ``docs/vmcore.md``), then cut by
``slice_kdump`` to the pages ``pages_read_by_unwind`` reads with the committed slim image. The capture of the
same stop (``stop-040-random.bin.xz``) holds the sysrq-t traces the kernel printed just before it
(``console.txt.xz``); makedumpfile's ``-c`` file of the stop was byte for byte this file's records reassembled
(``makedumpfile -R``), so the reassembled slice stands for it.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import struct
from pathlib import Path

import pytest

from unwind.cli.corpus import compare_oracles
from unwind.cli.main import main
from unwind.formats.dump import Dump
from unwind.formats.vmcore import open_vmcore
from unwind.formats.vmcore.errors import ExcludedPageFault
from unwind.session.replay import load_session

HERE = Path(__file__).resolve().parents[2] / "corpora" / "arm64" / "6.12.117+deb13-arm64"
FLAT = HERE / "makedumpfile" / "stop-040-random.mdf-F-c-d31.flat.xz"
CAPTURE = HERE / "makedumpfile" / "stop-040-random.bin.xz"


def _reassemble(flat: bytes) -> bytes:
    """``makedumpfile -R``: each record's bytes at its offset (makedumpfile ``rearrange_dumpdata``)."""
    out = bytearray()
    pos = 4096  # struct makedumpfile_header, one block
    while True:
        offset, size = struct.unpack_from(">qq", flat, pos)
        if offset < 0:
            return bytes(out)
        pos += 16
        out[len(out):] = bytes(max(0, offset + size - len(out)))
        out[offset:offset + size] = flat[pos:pos + size]
        pos += size


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mdf")
    flat = lzma.decompress(FLAT.read_bytes())
    (d / "stop.flat").write_bytes(flat)
    (d / "stop.kdump").write_bytes(_reassemble(flat))
    slim = d / "vmlinux.slim"
    slim.write_bytes(lzma.decompress(next(HERE.glob("vmlinux-*.slim.xz")).read_bytes()))
    return {"flattened-kdump": d / "stop.flat", "kdump": d / "stop.kdump", "slim": slim}


@pytest.mark.parametrize("fmt", ["flattened-kdump", "kdump"])
def test_file_is_makedumpfiles_filtered_dump_of_a_52_bit_4k_kernel(files, fmt) -> None:
    cap = Dump.open(CAPTURE)
    with open_vmcore(files[fmt]) as vm:
        assert vm.format == fmt and vm.dump_level == 31
        info = vm.vmcoreinfo_dict
        assert (info["PAGESIZE"], info["NUMBER(VA_BITS)"], info["NUMBER(TCR_EL1_T1SZ)"]) == ("4096", "52", "0xc")
        assert info["BUILD-ID"] == cap.build_id
        assert len(vm.prstatus) == len(cap.cpus)


@pytest.mark.parametrize("fmt", ["flattened-kdump", "kdump"])
def test_every_sysrq_t_trace_is_replayed_exactly(files, fmt) -> None:
    oracles = [o for o in Dump.open(CAPTURE).meta["oracles"] if o["source"] == "sysrq-t"]
    session = load_session(str(files[fmt]), vmlinux=str(files["slim"]))
    results = compare_oracles(session, oracles)
    assert all(r is not None for r in results)
    assert [r.who for r in results if r.category != "exact"] == []
    assert len(results) >= 40


@pytest.mark.parametrize("fmt", ["flattened-kdump", "kdump"])
def test_ps_and_replay_all_are_clean(files, fmt, capsys) -> None:
    common = [str(files[fmt]), "--vmlinux", str(files["slim"])]
    assert main(["ps", *common]) == 0
    listed = {int(line.lstrip("> ").split()[0]) for line in capsys.readouterr().out.splitlines()[1:]}
    assert {t.pid for t in Dump.open(CAPTURE).tasks()} <= listed
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["replay", *common, "--all"]) == 0


def test_a_filtered_page_reads_as_excluded_from_the_dump(files) -> None:
    """A pfn of RAM (bitmap 1) that is not dumped: an ``ExcludedPageFault``, never bytes."""
    with open_vmcore(files["kdump"]) as vm:
        excluded = next(pfn for r in vm.ranges for pfn in range(r.start // 4096, r.end // 4096)
                        if vm.is_excluded(pfn * 4096))
        with pytest.raises(ExcludedPageFault, match="excluded from the dump"):
            vm.read_phys(excluded * 4096, 8)
