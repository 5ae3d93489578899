"""makedumpfile's ``-F -c -d 31`` files of arm64, riscv and x86-64 6.12 guests, cut down to the pages the project
reads, against the kernel's own sysrq-t traces of the same stop; and makedumpfile 1.7.2's ``-c -d 31`` file of
the x86-64 guest, which excludes pages of live ``task_struct``\\ s, against drgn's task list of the same file.

``corpora/<arch>/6.12.117+deb13-<arch>/makedumpfile/``: QEMU's ELF vmcore of a 256 MB guest (``unwind lab
boot --arch ARCH --mem 256M``, ``unwind capture --lab ARCH --stops 1 --vmcore elf``) filtered by makedumpfile
(``unwind.lab.vmcores.makedumpfile_variants``; which makedumpfile, and why, in ``docs/vmcore.md``), then cut by
``slice_kdump`` to the pages ``pages_read_by_unwind`` reads with the committed slim image. The capture of the
same stop (``stop-*.bin.xz``) holds the sysrq-t traces the kernel printed just before it
(``console.txt.xz``); makedumpfile's ``-c`` file of the stop was byte for byte this file's records reassembled
(``makedumpfile -R``), so the reassembled slice stands for it.
"""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import struct
from pathlib import Path
from typing import Callable

import pytest

from unwind.cli.corpus import compare_oracles
from unwind.cli.main import main
from unwind.formats.dump import Dump
from unwind.formats.vmcore import open_vmcore
from unwind.formats.vmcore.errors import ExcludedPageFault
from unwind.session.replay import load_session

ROOT = Path(__file__).resolve().parents[2] / "corpora"
#: arch -> (release folder, the stop's file stem)
FILES = {"arm64": ("6.12.117+deb13-arm64", "stop-040-random"),
         "riscv": ("6.12.117+deb13-riscv64", "stop-000-random"),
         "x86_64": ("6.12.117+deb13-amd64", "stop-000-random")}
CASES = [(arch, fmt) for arch in FILES for fmt in ("flattened-kdump", "kdump")]


def _here(arch: str) -> Path:
    return ROOT / arch / FILES[arch][0]


def _capture(arch: str) -> Path:
    return _here(arch) / "makedumpfile" / f"{FILES[arch][1]}.bin.xz"


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
def files(tmp_path_factory) -> Callable[[str], dict[str, Path]]:
    """Per arch, the flattened slice, its reassembled ``-c`` form and the slim image, written once."""
    made: dict[str, dict[str, Path]] = {}

    def get(arch: str) -> dict[str, Path]:
        if arch not in made:
            here, stem = _here(arch), FILES[arch][1]
            d = tmp_path_factory.mktemp(f"mdf-{arch}")
            flat = lzma.decompress((here / "makedumpfile" / f"{stem}.mdf-F-c-d31.flat.xz").read_bytes())
            (d / "stop.flat").write_bytes(flat)
            (d / "stop.kdump").write_bytes(_reassemble(flat))
            slim = d / "vmlinux.slim"
            slim.write_bytes(lzma.decompress(next(here.glob("vmlinux-*.slim.xz")).read_bytes()))
            made[arch] = {"flattened-kdump": d / "stop.flat", "kdump": d / "stop.kdump", "slim": slim}
        return made[arch]
    return get


@pytest.mark.parametrize("arch,fmt", CASES)
def test_file_is_makedumpfiles_filtered_dump_of_the_captured_kernel(files, arch, fmt) -> None:
    cap = Dump.open(_capture(arch))
    with open_vmcore(files(arch)[fmt]) as vm:
        assert vm.format == fmt and vm.dump_level == 31
        info = vm.vmcoreinfo_dict
        if arch == "riscv":  # QEMU writes no VMCOREINFO note for riscv; makedumpfile -i copies none
            assert "BUILD-ID" not in info
        else:
            assert info["BUILD-ID"] == cap.build_id
        assert len(vm.prstatus) == len(cap.cpus)
        if arch == "arm64":  # 4K pages, VA_BITS=52 (LPA2): what no released makedumpfile reads
            assert (info["PAGESIZE"], info["NUMBER(VA_BITS)"], info["NUMBER(TCR_EL1_T1SZ)"]) == ("4096", "52", "0xc")


@pytest.mark.parametrize("arch,fmt", CASES)
def test_every_sysrq_t_trace_is_replayed_exactly(files, arch, fmt) -> None:
    oracles = [o for o in Dump.open(_capture(arch)).meta["oracles"] if o["source"] == "sysrq-t"]
    session = load_session(str(files(arch)[fmt]), vmlinux=str(files(arch)["slim"]))
    results = compare_oracles(session, oracles)
    assert all(r is not None for r in results)
    assert [r.who for r in results if r.category != "exact"] == []
    assert len(results) >= 40


@pytest.mark.parametrize("arch,fmt", CASES)
def test_ps_and_replay_all_are_clean(files, arch, fmt, capsys) -> None:
    common = [str(files(arch)[fmt]), "--vmlinux", str(files(arch)["slim"])]
    assert main(["ps", *common]) == 0
    listed = {int(line.lstrip("> ").split()[0]) for line in capsys.readouterr().out.splitlines()[1:]}
    assert {t.pid for t in Dump.open(_capture(arch)).tasks()} <= listed
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["replay", *common, "--all"]) == 0


@pytest.mark.parametrize("arch", FILES)
def test_a_filtered_page_reads_as_excluded_from_the_dump(files, arch) -> None:
    """A pfn of RAM (bitmap 1) that is not dumped: an ``ExcludedPageFault``, never bytes."""
    with open_vmcore(files(arch)["kdump"]) as vm:
        excluded = next(pfn for r in vm.ranges for pfn in range(r.start // 4096, r.end // 4096)
                        if vm.is_excluded(pfn * 4096))
        with pytest.raises(ExcludedPageFault, match="excluded from the dump"):
            vm.read_phys(excluded * 4096, 8)


#: makedumpfile 1.7.2 (Debian bookworm, the host's) ``-c -d 31 -x vmlinux`` of the x86-64 stop's ELF: it takes
#: 6.10+ slab pages (page_type) for free ones and excludes pages of live task_structs. Cut by ``slice_kdump``
#: to the pages ``pages_read_by_unwind`` and ``pages_walked_by_unwind`` read with the slim image (drgn walks
#: the page tables where unwind takes the direct map). Oracle: drgn 0.3.0's ``for_each_task()`` of the full
#: file (``python -m unwind.lab.drgn_ps``), the tasks whose pid and comm drgn reads and those it cannot.
OLD = _here("x86_64") / "makedumpfile" / "stop-000-random.mdf172-c-d31.kdump.xz"
OLD_DRGN = OLD.with_name("stop-000-random.mdf172-c-d31.drgn-tasks.json.xz")


@pytest.fixture(scope="module")
def old_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mdf172") / "stop.kdump"
    path.write_bytes(lzma.decompress(OLD.read_bytes()))
    return path


def _drgn_oracle() -> dict:
    return json.loads(lzma.decompress(OLD_DRGN.read_bytes()))


def test_old_makedumpfile_excluded_pages_of_live_task_structs(old_file) -> None:
    """drgn itself faults on excluded pages of tasks it reaches, so the file is the case the issue names."""
    drgn = _drgn_oracle()
    with open_vmcore(old_file) as vm:
        assert vm.format == "kdump" and vm.dump_level == 31
    assert drgn["stopped"] is None and len(drgn["tasks"]) >= 60
    assert drgn["unreadable"] and all("Excluded page" in u["error"] for u in drgn["unreadable"])


def test_ps_lists_every_task_drgn_lists_and_more(old_file, files, capsys) -> None:
    """Every task drgn lists is listed with drgn's pid and comm; every task drgn reaches but cannot read is
    reached, on a line naming what is missing; and each CPU's idle task, which drgn's lists do not hold."""
    drgn = _drgn_oracle()
    capsys.readouterr()
    assert main(["ps", "--json", str(old_file), "--vmlinux", str(files("x86_64")["slim"])]) == 0
    ours = {int(t["task_struct"], 16): t for t in map(json.loads, capsys.readouterr().out.splitlines())}
    for t in drgn["tasks"]:
        o = ours.get(int(t["task"], 16))
        assert o is not None and (o["pid"], o["comm"]) == (t["pid"], t["comm"]), t
    for u in drgn["unreadable"]:
        o = ours.get(int(u["task"], 16))
        assert o is not None and o["lacks"] and "excluded from the dump" in o["lacks"], u
    idle = [t for t in ours.values() if t["pid"] == 0]
    assert len(idle) == len(Dump.open(_capture("x86_64")).cpus)
    assert len(ours) == len(drgn["tasks"]) + len(drgn["unreadable"]) + len(idle)


@pytest.mark.slow
def test_drgn_oracle_is_what_drgn_lists_from_the_committed_file(old_file) -> None:
    """drgn 0.3.0 on the committed slice, with the fetched debug vmlinux, lists what it listed from the full file."""
    pytest.importorskip("drgn", reason="drgn (pip install drgn) makes the oracle")
    from unwind.lab.drgn_ps import drgn_tasks
    from unwind.lab.fetch import FetchError, find_kernel

    try:
        kernel = find_kernel("x86_64", FILES["x86_64"][0])
    except FetchError as e:
        pytest.skip(str(e))
    live = drgn_tasks(old_file, kernel.vmlinux, "x86_64")
    want = _drgn_oracle()
    assert (live["tasks"], live["unreadable"], live["stopped"]) == (want["tasks"], want["unreadable"], want["stopped"])


def test_a_return_stack_the_filter_excluded_stops_the_walk_on_it(old_file, files, tmp_path) -> None:
    """md5sum (pid 499) runs under the function-graph tracer, and makedumpfile 1.7.2 excluded the page of its
    ``ret_stack``. Its walk prints the frames the capture of the same stop gives, up to the first
    ``return_to_handler``, and stops there naming the excluded page (no frame is left as the tracer's
    handler); ``unwind convert`` keeps what is missing, so the converted dump stops the same."""
    from unwind.cli.tasks import convert
    from unwind.core.walk import StopReason
    from unwind.session.replay import Session

    slim = files("x86_64")["slim"]
    vm = Session.load(old_file, vmlinux=slim)
    task = vm.select(pid=499)[0]
    r = vm.replay(task)
    assert task.fgraph == [] and task.fgraph_lacks is not None
    assert r.stop.reason is StopReason.MEMORY_FAULT and "return_to_handler at 0x" in r.stop.detail
    assert "excluded from the dump" in r.stop.detail
    whole = Session.load(_capture("x86_64"), vmlinux=slim)
    w = whole.replay(whole.select(pid=499)[0])
    assert whole.select(pid=499)[0].fgraph and len(r.frames) < len(w.frames)
    assert [f.pc for f in r.frames] == [f.pc for f in w.frames[:len(r.frames)]]
    convert(vm, vm.select(every=True)).write(tmp_path / "converted.bin")
    small = Session.load(tmp_path / "converted.bin", vmlinux=slim)
    back = small.replay(small.select(pid=499)[0])
    assert [f.pc for f in back.frames] == [f.pc for f in r.frames] and back.stop == r.stop
