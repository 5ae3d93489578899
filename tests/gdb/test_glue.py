"""The gdb glue (unwind.cli.gdbtarget) over a stand-in gdb module: the frames gdb would unwind, and
``unwind-bt``/``unwind-ps``, against ``unwind replay``/``unwind ps`` of the same dump or vmcore read
from the file."""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import Callable

import pytest

from unwind.cli.gdb import SCRIPT, script_path, split_args
from unwind.cli.tasks import ps_lines
from unwind.core.memory import Memory, MemoryFault, Segment
from unwind.core.target import Task
from unwind.cli import gdbtarget
from unwind.session.output import replay_text
from unwind.session.replay import Session

from . import ptregs_oracle
from .fakegdb import FakeGdb, PendingFrame

REPO = Path(__file__).resolve().parents[2]
DUMPS = ["corpora/x86_64/6.12.117+deb13-amd64/stop-004-random.bin.xz",
         "corpora/arm64/6.12.117+deb13-arm64/stop-002-irq-arch_timer_handler_virt.bin.xz",
         "corpora/riscv/6.12.117+deb13-riscv64/stop-000-random.bin.xz"]
#: dumps whose running CPUs cross exception boundaries: x86-64 ORC REGS, arm64 v6.13+ meta records, and
#: arm64 v6.12's {x29, ELR} record in pt_regs->stackframe
BOUNDARIES = ["corpora/x86_64/6.12.117+deb13-amd64/stop-004-random.bin.xz",
              "corpora/arm64/7.2.13+deb14-arm64/stop-002-irq-arch_timer_handler_virt.bin.xz",
              "corpora/arm64/6.12.117+deb13-arm64/stop-002-irq-arch_timer_handler_virt.bin.xz"]
VMCORES = ["corpora/x86_64/6.12.117+deb13-amd64/vmcore/stop-001-random.elf.xz",
           "corpora/arm64/6.12.117+deb13-arm64/vmcore/stop-000-random.elf.xz"]


def _reader(mem: object):
    def read(addr: int, size: int) -> bytes | None:
        try:
            return mem.read(addr, size)  # type: ignore[attr-defined]
        except MemoryFault:
            return None
    return read


def _gdb_regs(session: Session, regs: dict[str, int]) -> dict[str, int]:
    names = session.backend.gdb_registers
    return {names.get(k, k): v for k, v in regs.items()}


def _fake_for(session: Session, core: str | None) -> FakeGdb:
    """gdb as it would be over the session's file: its memory, one thread per CPU, the image loaded."""
    cpus = {c.cpu: _gdb_regs(session, c.regs) for c in session.dump.cpus}
    image = session.image
    path = getattr(image, "image", image).path  # a RelocatedImage wraps the file's
    return FakeGdb(_reader(session.dump.memory), cpus, [str(path)], core)


def _with_vmcoreinfo(session: Session, gdb: FakeGdb) -> FakeGdb:
    """The kernel's ``vmcoreinfo_data`` page holding the vmcore's VMCOREINFO note text, where the vmcore
    (a slice of the guest's memory) left it out: a live kernel's memory has it."""
    symbols = session.symbols
    data, size = symbols.address("vmcoreinfo_data"), symbols.address("vmcoreinfo_size")
    text = session.dump.vmcoreinfo_text.encode()
    page = 0xFFFF_FFFF_FFFF_0000  # an address no kernel memory of the dump is at
    extra = Memory([Segment(data, page.to_bytes(8, "little")), Segment(size, len(text).to_bytes(8, "little")),
                    Segment(page, text)])
    inner = gdb._read
    gdb._read = lambda addr, n: extra.read(addr, n) if extra.contains(addr, n) else inner(addr, n)
    return gdb


def _check(session: Session, gdb: FakeGdb, blocked: int = 6) -> None:
    gdbtarget.install(gdb)
    pc = session.backend.gdb_registers.get(session.backend.pc_reg, session.backend.pc_reg)
    running = [t for t in session.dump.tasks() if t.running]
    assert running
    for task in running:  # a CPU the kernel walks nothing of (user mode) is gdb's frame 0 alone
        want = [f.pc for f in session.replay(task).frames] or [task.regs[session.backend.pc_reg]]
        assert gdb.backtrace(task.cpu, pc) == want, task.describe()
        gdb.reset()  # the target ran: frame 0 is an inlined function's now (gdb's levels count 2 inline frames)
        assert gdb.backtrace(task.cpu, pc, inline=2) == want, task.describe()
    assert gdb.run("unwind-ps").splitlines() == ps_lines(session)
    pids = list(dict.fromkeys(t.pid for t in session.dump.tasks() if not t.running))[:blocked]
    for pid in pids:  # pid 0 is every CPU's idle task: `unwind replay --task 0` shows them all
        want = [line for t in session.select(pid=pid) for line in replay_text(session, session.replay(t))]
        got = [ln for ln in gdb.run("unwind-bt", str(pid)).splitlines() if not ln.startswith("unwind: warning")]
        assert got == want, pid


@pytest.mark.parametrize("dump", DUMPS, ids=lambda d: d.split("/")[1])
def test_project_dump_in_gdb_walks_as_replay(dump: str, tmp_path: Path) -> None:
    path = REPO / dump
    core = tmp_path / "core"
    core.write_bytes(lzma.decompress(path.read_bytes()))  # gdb opens it uncompressed
    session = Session.load(path)
    _check(session, _fake_for(session, str(core)))


@pytest.mark.parametrize("vmcore", VMCORES, ids=lambda d: d.split("/")[1])
def test_kernel_in_gdb_memory_walks_as_vmcore_replay(vmcore: str) -> None:
    """No dump note: the tasks come from the kernel's own lists in gdb's memory (as on QEMU's gdbstub)."""
    session = Session.load(REPO / vmcore)
    _check(session, _with_vmcoreinfo(session, _fake_for(session, None)), blocked=4)


def test_snapshot_reads_what_gdb_can_down_to_words() -> None:
    lo = 0xFFFF800000010000
    data = bytes(range(256)) * 32
    readable = Memory([Segment(lo + 100, data[100:4997])])
    gdb = FakeGdb(_reader(readable), {}, [], None)
    snap = gdbtarget.GdbMemory(gdb).snapshot([(lo, lo + 8192)])
    # gdb refuses any read reaching outside [lo+100, lo+4997): the aligned words inside it are what is kept
    assert [(s.start - lo, s.end - lo) for s in snap.segments] == [(104, 4992)]
    assert snap.read(lo + 104, 8) == data[104:112]


def test_frame_ids_grow_outwards_across_a_stack_switch() -> None:
    from unwind.core.frame import Frame

    frames = [Frame(1, sp=0x9000), Frame(2, sp=0x9100), Frame(3, sp=0x1000), Frame(4, sp=None), Frame(5, sp=0x9200)]
    assert gdbtarget.frame_ids(frames) == [0x9000, 0x9100, 0x9101, 0x9102, 0x9200]


def test_bad_arguments_and_no_image_are_one_line(tmp_path: Path) -> None:
    gdb = FakeGdb(lambda a, s: None, {0: {}}, [], None)
    gdbtarget.install(gdb)
    for arg in ("12 13", "--bogus", "x"):
        with pytest.raises(gdb.GdbError, match="usage: unwind-bt"):
            gdb.run("unwind-bt", arg)
    with pytest.raises(gdb.GdbError, match="no kernel image"):
        gdb.run("unwind-ps")
    (tmp_path / "x").write_bytes(b"not an ELF")
    gdb.params[gdbtarget.VMLINUX_PARAMETER] = str(tmp_path / "x")
    with pytest.raises(gdb.GdbError, match="not an ELF"):
        gdb.run("unwind-ps")


def test_unwinder_leaves_frames_it_cannot_walk_to_gdb() -> None:
    gdb = FakeGdb(lambda a, s: None, {0: {"pc": 0x1234, "sp": 0x10}}, [], None)
    gdbtarget.install(gdb)
    assert gdb.backtrace(0, "pc") == [0x1234]  # no image: gdb's own unwinders, not this one
    assert len(gdb.stderr) == 1 and gdb.stderr[0].startswith("unwind: no kernel image: ")


def test_script_makes_the_installation_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path))
    path = script_path()
    text = path.read_text()
    assert path.parent == tmp_path / "gdb" and "gdbtarget.install(gdb)" in text
    import unwind
    assert str(Path(unwind.__file__).resolve().parent.parent) in text
    assert "{" not in text and SCRIPT.count("{") > 0  # every field filled


def test_gdb_arguments_pass_through() -> None:
    assert split_args(["--vmlinux", "v", "-batch", "-ex", "bt", "--script", "core"]) == (
        ["--vmlinux", "v"], ["-batch", "-ex", "bt", "--script", "core"])
    assert split_args(["--script"]) == (["--script"], [])
    assert split_args(["--", "--script"]) == ([], ["--script"])


def pt_regs_checked(session: Session, frames_of: Callable[[Task], list[dict[str, int]]]) -> int:
    """How many caller frames gdb got the registers of the ``pt_regs`` the kernel saved (found and read
    from the dump file by :mod:`.ptregs_oracle`) with; a register of such a frame that differs fails."""
    checked = 0
    for task in (t for t in session.dump.tasks() if t.running):
        stacks = [(st.low, st.high) for st in task.stacks]
        for level, regs in enumerate(frames_of(task)[1:], 1):
            words = ptregs_oracle.find(session.backend.name, session.dump.memory, stacks, regs, session.image.btf)
            if words is None:
                continue
            got = {n: regs.get(n) for n in words if n in regs or n not in GDB_LACKS}
            assert got == {n: v for n, v in words.items() if n in got}, (task.describe(), level)
            checked += 1
    return checked


#: registers gdb-multiarch has no frame register for on these targets
GDB_LACKS = frozenset({"orig_rax"})


@pytest.mark.parametrize("dump", BOUNDARIES, ids=lambda d: "/".join(d.split("/")[1:3]))
def test_caller_after_exception_gets_the_saved_pt_regs(dump: str, tmp_path: Path) -> None:
    path = REPO / dump
    core = tmp_path / "core"
    core.write_bytes(lzma.decompress(path.read_bytes()))
    session = Session.load(path)
    gdb = _fake_for(session, str(core))
    gdbtarget.install(gdb)
    pc = session.backend.gdb_registers.get(session.backend.pc_reg, session.backend.pc_reg)
    assert pt_regs_checked(session, lambda task: gdb.frames(task.cpu, pc)) >= 1


def test_kaslr_slide_is_found_from_a_cpu_pc_and_checked_by_vmcoreinfo() -> None:
    """A kernel loaded at its link address plus a slide (by construction: the image's text around a pc
    and the VMCOREINFO text, both at the slid addresses): the slide is the one whose KERNELOFFSET agrees."""
    image = Session.load(REPO / DUMPS[0]).image
    symbols = image.symbols
    slide = 0x2A00000
    pc = symbols.address("schedule") + 0x20
    data, size = symbols.address("vmcoreinfo_data"), symbols.address("vmcoreinfo_size")
    page = 0xFFFF_8880_0123_4000

    def memory(offset: str) -> Memory:
        text = f"OSRELEASE=6.12.117+deb13-amd64\nKERNELOFFSET={offset}\n".encode()
        window = image.text(pc - 64, 128)
        return Memory([Segment(pc + slide - 64, window), Segment(size + slide, len(text).to_bytes(8, "little")),
                       Segment(data + slide, page.to_bytes(8, "little")), Segment(page, text)])

    good = FakeGdb(_reader(memory(f"{slide:x}")), {}, [], None)
    text, found = gdbtarget.kernel_vmcoreinfo_kaslr(gdbtarget.GdbMemory(good), image, [pc + slide])
    assert found == slide and f"KERNELOFFSET={slide:x}" in text
    assert gdbtarget.kernel_vmcoreinfo(gdbtarget.GdbMemory(good), symbols) == ""  # nothing at the link address
    wrong = FakeGdb(_reader(memory(f"{slide + 0x200000:x}")), {}, [], None)  # the kernel says another slide
    assert gdbtarget.kernel_vmcoreinfo_kaslr(gdbtarget.GdbMemory(wrong), image, [pc + slide]) == ("", 0)


def _through_selected_cpu(gdb: FakeGdb, pc: str) -> FakeGdb:
    """Reads as QEMU's gdbstub makes them with page table isolation: through the selected CPU's page tables,
    which map no kernel memory while that CPU runs user code (its pc is not a kernel address)."""
    inner = gdb._read

    def read(addr: int, n: int) -> bytes | None:
        assert gdb.thread is not None
        return inner(addr, n) if gdb.cpus[gdb.thread.num - 1][pc] >> 63 else None

    gdb._read = read
    return gdb


def test_commands_read_through_a_cpu_in_kernel_mode() -> None:
    """The selected CPU runs user code (its pc set to a user address): ``unwind-ps`` reads through the other
    CPU, which runs kernel code, and gives the tasks ``unwind ps`` gives from the file; the user's thread is
    selected again after. With every CPU in user mode, one line says why (an error, or a warning first)."""
    session = Session.load(REPO / VMCORES[0])
    pc = session.backend.gdb_registers.get(session.backend.pc_reg, session.backend.pc_reg)
    gdb = _through_selected_cpu(_with_vmcoreinfo(session, _fake_for(session, None)), pc)
    assert len(gdb.threads) >= 2 and all(regs[pc] >> 63 for regs in gdb.cpus.values())
    gdb.cpus[0][pc] = 0x401000  # cpu0 in user mode
    gdbtarget.install(gdb)
    gdb.thread = gdb.threads[0]
    assert gdb.run("unwind-ps").splitlines() == ps_lines(session)
    assert gdb.thread is gdb.threads[0]
    for regs in gdb.cpus.values():
        regs[pc] = 0x401000
    gdb.reset()
    try:
        said = gdb.run("unwind-ps").splitlines()[0]  # what could not be read is shown as unknown
    except gdb.GdbError as e:
        said = str(e)
        assert "\n" not in said
    assert "no CPU is in kernel mode" in said
    assert gdb.thread is gdb.threads[0]


def test_unwinder_says_when_the_cpu_it_cannot_walk_runs_user_code() -> None:
    session = Session.load(REPO / VMCORES[0])
    pc = session.backend.gdb_registers.get(session.backend.pc_reg, session.backend.pc_reg)
    gdb = _through_selected_cpu(_with_vmcoreinfo(session, _fake_for(session, None)), pc)
    for regs in gdb.cpus.values():
        regs[pc] = regs["pc"] = 0x401000  # gdb's $pc is the arch's pc register
    gdbtarget.install(gdb)
    assert gdb.backtrace(0, pc) == [0x401000]  # frame 0 alone: no kernel frame to walk
    # a note the unwinder gives (a read failed) names the CPU running user code
    assert all(n.endswith(" (cpu0 runs user code (pc 0x401000)): gdb's own unwinders go on\n") for n in gdb.stderr)
    pending = PendingFrame(0, gdb.cpus[0])
    assert gdbtarget.user_mode(pending, gdb.threads[0], gdb) == "cpu0 runs user code (pc 0x401000)"
    assert gdbtarget.user_mode(PendingFrame(0, {"pc": 0xFFFFFFFF81000000}), gdb.threads[0], gdb) is None


def test_unrecovered_hijacks_in_a_row_are_each_a_frame_of_bt(monkeypatch: pytest.MonkeyPatch) -> None:
    """riscv 6.12 prints ``return_to_handler+0x0`` once per hijacked record it does not recover
    (``ftrace_graph_func()`` records ``&fregs->ra``, ``walk_stackframe()`` searches ``&frame->ra``): gdb's
    frames through the unwinder have both, and the lab's count of them (:func:`frame_pcs`) keeps both,
    leaving out only inline frames."""
    from arch.riscv.synth import fgraph_unrecovered
    from unwind.lab.gdbcompare import frame_pcs

    scenario = fgraph_unrecovered()
    session, task = scenario.session, scenario.task()
    gdb = FakeGdb(_reader(session.dump.memory), {task.cpu: _gdb_regs(session, task.regs)}, [], None)
    monkeypatch.setattr(gdbtarget, "open_session", lambda *_, **__: session)
    gdbtarget.install(gdb)
    r2h = scenario.synth.at("return_to_handler")
    assert scenario.faithful.count(r2h) == 2
    assert frame_pcs(gdb) == scenario.faithful
    gdb.reset()
    gdb.inline = 2  # frame 0 is two inline frames deep: gdb's levels 0-2 have its pc
    assert frame_pcs(gdb) == scenario.faithful
