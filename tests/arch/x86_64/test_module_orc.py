"""A walk into module code of a dump that lacks the module's ORC stops, saying what the dump lacks.

The lab's capture of ``corpora/x86_64/<release>/vmcore/stop-001-random`` lists the guest's modules and holds
their ORC tables; the same capture with the module list dropped from its note (what the lab wrote before it
recorded modules) or with the ORC tables' bytes left out is a dump that lacks them. The kernel itself has
that ORC, so its walk goes on through the module: the frame-pointer guess it would make only where the
module has no ORC is no frame of its. The expected frames are drgn's, read from the full vmcore of the
same stop (``stop-001-random.drgn-tasks.json.xz``), up to the first module frame.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from unwind.core.target import Options
from unwind.core.walk import StopReason
from unwind.formats.dump import Dump, DumpWriter
from unwind.session.replay import Session, load_session

FOLDER = Path(__file__).resolve().parents[3] / "corpora" / "x86_64" / "6.12.117+deb13-amd64" / "vmcore"
CAPTURE = FOLDER / "stop-001-random.bin.xz"
#: the capture's image: a copy written elsewhere finds it by nothing else
IMAGE = next(FOLDER.parent.glob("vmlinux-*.slim.xz"))


def _rewritten(path: Path, drop_modules: bool, drop_orc: bool) -> Path:
    """The capture written again without its module list, or without the bytes of its modules' ORC tables."""
    dump = Dump.open(CAPTURE)
    orc = [r for m in dump.info.modules if m.orc is not None for r in m.orc.ranges()]
    w = DumpWriter(dump.arch)
    for seg in dump.memory.segments:
        if not (drop_orc and any(lo < seg.start + len(seg.data) and seg.start < hi for lo, hi in orc)):
            w.add_memory(seg.start, seg.data)
    for c in dump.cpus:
        w.add_cpu(c.cpu, c.regs, c.pid)
    w.vmcoreinfo = dump.vmcoreinfo_text
    w.meta = {**dump.meta, "modules": [] if drop_modules else dump.meta["modules"]}
    w.write(path)
    return path


def _drgn_frames(comm: str, function: str) -> tuple[int, list[int]]:
    """(pid, drgn's pcs) of the blocked task ``comm`` of the same stop in module function ``function``."""
    drgn = json.loads(lzma.decompress((FOLDER / "stop-001-random.drgn-tasks.json.xz").read_bytes()))
    (task,) = [t for t in drgn["tasks"] if t["comm"] == comm and not t["on_cpu"]
               and any((f["symbol"] or "").startswith(f"{function}+") for f in t.get("frames", ()))]
    return task["pid"], [int(f["pc"], 16) for f in task["frames"]]


@pytest.mark.parametrize("comm,function", [("scsi_eh_0", "scsi_error_handler"), ("dd", "uhid_char_read")])
def test_the_capture_walks_through_module_orc(comm: str, function: str) -> None:
    pid, want = _drgn_frames(comm, function)
    session = load_session(CAPTURE)
    r = session.replay(session.tasks(task=str(pid))[0])
    assert ([f.pc for f in r.frames], r.stop.clean) == (want, True)
    assert any(f.symbol.startswith(f"{function}+") and f.symbol.endswith("]") for f in r.frames)


@pytest.mark.parametrize("drop_modules,lacks", [
    (True, "the dump lists no modules"),
    (False, "module scsi_mod's ORC tables are not in the dump"),
])
def test_a_dump_without_module_orc_stops_at_the_module_frame(tmp_path, drop_modules: bool, lacks: str) -> None:
    pid, want = _drgn_frames("scsi_eh_0", "scsi_error_handler")
    session = Session.load(_rewritten(tmp_path / "dump.bin", drop_modules, drop_orc=not drop_modules), vmlinux=IMAGE)
    scsi_mod = next(m for m in Dump.open(CAPTURE).info.modules if m.name == "scsi_mod")
    first = next(i for i, pc in enumerate(want) if scsi_mod.contains(pc))
    for complete in (False, True):
        r = session.replay(session.tasks(task=str(pid))[0], Options(complete=complete))
        assert [f.pc for f in r.frames] == want[:first + 1]
        assert r.stop.reason is StopReason.MEMORY_FAULT
        assert r.stop.detail.startswith(f"no ORC for {want[first]:#x}: {lacks}")
