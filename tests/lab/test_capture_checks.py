"""Capture refuses a vmlinux that is not the running kernel, plans stops as asked, and reads a stop's tasks
through the kernel model."""

from types import SimpleNamespace

import pytest

from unwind.lab.capture import Plan, run_capture
from unwind.lab.guest import CaptureError, CaptureSession, StopResult, task_fgraph


def _session(image_id: str, vmcoreinfo: str) -> CaptureSession:
    s = CaptureSession.__new__(CaptureSession)
    s.img = SimpleNamespace(build_id=image_id, notes_addr=0, notes_data=b"")
    s.vmcoreinfo = vmcoreinfo
    s.log = lambda msg: None
    return s


def test_build_id_mismatch_is_refused() -> None:
    s = _session("aa" * 20, "OSRELEASE=6.12.0\nBUILD-ID=" + "bb" * 20 + "\n")
    with pytest.raises(CaptureError, match="does not match the running kernel"):
        s.check_build_id()


def test_build_id_match_and_kaslr() -> None:
    _session("aa" * 20, "BUILD-ID=" + "aa" * 20 + "\nKERNELOFFSET=0\n").check_build_id()
    with pytest.raises(CaptureError, match="KASLR"):
        _session("aa" * 20, "BUILD-ID=" + "aa" * 20 + "\nKERNELOFFSET=2a000000\n").check_build_id()


def test_plan_interleaves_breakpoints() -> None:
    p = Plan(7, [("irq", "a"), ("syscall-entry", "b")])
    assert p.kinds() == [("random", None), ("random", None), ("irq", "a"), ("random", None),
                         ("random", None), ("syscall-entry", "b"), ("random", None)]
    assert Plan(3, []).kinds() == [("random", None)] * 3
    assert Plan(2, [("breakpoint", "f")], random_share=0).kinds() == [("breakpoint", "f")] * 2


class _DyingRsp:
    """Stops twice, then the guest is gone."""

    def __init__(self) -> None:
        self.halts = 0

    def cont(self) -> None:
        pass

    def halt(self, timeout: float = 10.0) -> bytes:
        self.halts += 1
        if self.halts > 2:
            from unwind.lab.rsp import RspError
            raise RspError("gdb stub closed the connection (guest gone?)")
        return b"T02thread:01;"


def test_guest_dying_mid_capture_keeps_written_dumps(tmp_path) -> None:
    from unwind.lab.rsp import RspError

    s = CaptureSession.__new__(CaptureSession)
    s.rsp = _DyingRsp()
    s.log = lambda msg: None
    s.capture_stop = lambda label, hit=None: StopResult(meta={"tasks": [], "capture": {"kind": label}})
    s.write_dump = lambda res, path, release, extra: path.write_bytes(b"dump")
    with pytest.raises(RspError, match="guest gone"):
        run_capture(s, Plan(5, [], delay=(0, 0)), tmp_path, "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stop-000-random.bin.xz", "stop-001-random.bin.xz"]


@pytest.mark.parametrize("gen", ["new", "old"])
def test_capture_reads_fgraph_in_both_ret_stack_layouts(gen: str) -> None:
    # "old" is 6.1's array of struct ftrace_ret_stack, "new" the 6.11+ tagged words
    from tests.vmtasks.kernelgen import SynthKernel
    from tests.vmtasks.test_kernel_tasks import _procs
    from unwind.kernel.model import Kernel

    k = SynthKernel(gen)
    procs = _procs()
    k.build(procs, [None, None])
    mem = k.memory()
    kernel = Kernel(mem, k.btf, k.symbol)
    task = next(t for t in kernel.tasks() if t.pid == 100)
    res = StopResult()
    entries = task_fgraph(kernel, task, res)
    assert [(int(e["ret"], 16), int(e["func"], 16), int(e["retp"], 16)) for e in entries] == procs[0].fgraph
    [(ptr, raw)] = res.memory.items()
    assert raw == mem.read(ptr, len(raw)) and len(raw) >= len(entries) * k.btf.sizeof("ftrace_ret_stack")


class _HartsRsp:
    """Two stopped riscv vCPUs; QEMU's vCPU 0 is hart 0, vCPU 1 hart 1."""

    def __init__(self) -> None:
        self.tid = ""

    def select_thread(self, tid: str) -> None:
        self.tid = tid

    def read_registers(self, names: list[str]) -> dict[str, int]:
        hart = int(self.tid) - 1
        return {"pc": 0xffffffff80001000 + hart, "sp": 0xffffffc600000000, "priv": 1, "mhartid": hart}


def _riscv_session(hartid_map: list[int]) -> CaptureSession:
    import arch.riscv.lab as lab

    s = CaptureSession.__new__(CaptureSession)
    s.rsp, s.lab, s.threads, s.ncpu = _HartsRsp(), lab, ["01", "02"], 2
    table = b"".join(h.to_bytes(8, "little") for h in hartid_map)
    s.kernel = SimpleNamespace(nr_cpus=2,  # type: ignore[assignment]
                               symbol=lambda name: 0xffffffff81000000 if name == "__cpuid_to_hartid_map" else None,
                               read=lambda addr, size: table[addr - 0xffffffff81000000:][:size])
    s.hw_cpu_ids = lab.hw_cpu_ids(s.kernel, 2)
    return s


def test_riscv_cpus_are_numbered_by_the_kernels_hart_map() -> None:
    # OpenSBI's boot hart becomes Linux CPU 0: hart 1 booted, so vCPU 1 is cpu0 and vCPU 0 is cpu1
    cpus = _riscv_session([1, 0]).read_cpus()
    assert [(c.cpu, c.tid) for c in cpus] == [(0, "02"), (1, "01")]
    assert cpus[0].cpu_from == "mhartid 1 = __cpuid_to_hartid_map[0]"
    cpus = _riscv_session([0, 1]).read_cpus()
    assert [(c.cpu, c.tid) for c in cpus] == [(0, "01"), (1, "02")]


def test_cpu_numbers_fall_back_to_the_vcpu_index() -> None:
    # an unknown hart (map not filled in) keeps QEMU's order, and says so
    cpus = _riscv_session([7, 7]).read_cpus()
    assert [(c.cpu, c.tid, c.cpu_from) for c in cpus] == [(0, "01", "vCPU index"), (1, "02", "vCPU index")]


class _SynthStub:
    """A GDB stub in front of a synthetic arm64 kernel: two vCPUs at EL1, ``sp`` on their tasks' stacks."""

    def __init__(self, mem, sps: list[int]) -> None:  # type: ignore[no-untyped-def]
        self.mem, self.sps, self.tid, self.running, self.reads = mem, sps, "01", False, 0

    def threads(self) -> list[str]:
        return ["01", "02"]

    def select_thread(self, tid: str) -> None:
        self.tid = tid

    def read_registers(self, names: list[str]) -> dict[str, int]:
        cpu = int(self.tid) - 1
        return {**{f"x{i}": 0 for i in range(31)}, "sp": self.sps[cpu], "pc": 0xFFFF800080001000,
                "cpsr": 0x3C5}  # EL1h: PSTATE.EL 1; SP_EL0 unknown, so current is __entry_task

    def read_memory(self, addr: int, size: int) -> bytes:
        from unwind.core.memory import MemoryFault
        from unwind.lab.rsp import RspMemoryError

        self.reads += 1
        try:
            return self.mem.read(addr, size)
        except MemoryFault:
            raise RspMemoryError(f"cannot read {size} bytes at {addr:#x}") from None


def _synth_session(k, everyone, running) -> tuple[CaptureSession, _SynthStub]:  # type: ignore[no-untyped-def]
    """A capture session on the built synthetic kernel ``k``: cpu0 runs init_task, cpu1 ``running``."""
    from tests.vmtasks.kernelgen import THREAD_SIZE

    k.define("vmcoreinfo_data", 8)
    k.define("vmcoreinfo_size", 8)
    init = everyone[0]
    stub = _SynthStub(k.memory(), [init.stack + THREAD_SIZE - 0x80, running.stack + THREAD_SIZE - 0x80])
    img = SimpleNamespace(arch="arm64", btf=k.btf, get=k.symbol, addr=k.symbols.__getitem__, build_id="b",
                          notes_addr=0, notes_data=b"")
    s = CaptureSession(stub, img, log=lambda msg: None)  # type: ignore[arg-type]
    s.setup()
    return s, stub


@pytest.mark.parametrize("gen", ["new", "old"])
def test_a_stop_is_read_through_the_kernel_model(gen: str) -> None:
    # every answer is the synthetic kernel's construction; the letters are the kernel's
    # task_state_to_char() of each state word (include/linux/sched.h: fls of state & TASK_REPORT)
    from tests.vmtasks.kernelgen import THREAD_SIZE, SynthKernel, SynthTask
    from tests.vmtasks.test_kernel_tasks import _procs

    k = SynthKernel(gen)
    procs = _procs() + [SynthTask(400, 400, "parked", 0x40), SynthTask(500, 500, "waking", 0x200)]
    running = procs[1].threads[1]
    everyone, idle = k.build(procs, [None, running])
    s, stub = _synth_session(k, everyone, running)
    res = s.capture_stop("random")
    assert not isinstance(res, str)
    tasks = {t["pid"]: t for t in res.meta["tasks"]}
    # swapper/0 runs on cpu0; swapper/1 (cpu1's idle task, on no list) is not running: left out
    assert sorted(tasks) == [0, 100, 200, 201, 202, 300, 400, 500]
    assert {p: (t["comm"], t["state"], t["cpu"]) for p, t in tasks.items()} == {
        0: ("swapper/0", "R", 0), 100: ("sh", "S", None), 200: ("worker", "I", None),
        201: ("worker-t1", "D", None), 202: ("worker-t2", "R", 1), 300: ("zombie", "Z", None),
        400: ("parked", "P", None), 500: ("waking", "R", None)}
    by_addr = {hex(t.addr): t for t in everyone}
    for pid, t in tasks.items():
        want = by_addr[t["task"]]
        assert (want.pid, t["switches"]) == (pid, pid * 3)
        if t["cpu"] is None:
            assert t["context"] == {r: hex(v) for r, v in want.ctx.items()}
            sp = want.ctx["sp"]
        else:
            sp = stub.sps[t["cpu"]]
        assert res.memory[sp] == stub.mem.read(sp, want.stack + THREAD_SIZE - sp)
    assert [(int(e["ret"], 16), int(e["func"], 16), int(e["retp"], 16)) for e in tasks[100]["fgraph"]] == \
        procs[0].fgraph
    assert [(int(e["ret"], 16), int(e["fp"], 16)) for e in tasks[200]["kretprobes"]] == procs[1].kretprobes
    assert [(c["cpu"], c["pid"], c["current_from"]) for c in res.meta["cpus"]] == \
        [(0, 0, "__entry_task"), (1, 202, "__entry_task")]
    irq = [(st["cpu"], int(st["low"], 16)) for st in res.meta["stacks"] if st["kind"] == "irq"]
    assert irq == [(0, k.irq_stacks[0]), (1, k.irq_stacks[1])]
    assert res.meta["capture"]["unreadable_tasks"] == 0


def test_a_stop_records_the_modules_and_their_orc_tables(tmp_path) -> None:
    # the modules of the synthetic kernel, by construction: one with ORC tables (x86-64's
    # mod->arch.orc_unwind_ip/orc_unwind/num_orcs, 6-byte entries), one without
    from tests.vmtasks.kernelgen import SynthKernel
    from tests.vmtasks.test_kernel_tasks import _procs
    from unwind.core.dumpinfo import ModuleInfo, ModuleOrc, ModuleRegion
    from unwind.formats.dump import Dump

    k = SynthKernel(module_orc=True)
    procs = _procs()
    running = procs[1].threads[1]
    everyone, _ = k.build(procs, [None, running])
    text = 0xFFFF800078000000
    ips = b"".join((0x10 - 4 * i).to_bytes(4, "little", signed=True) for i in range(3))  # relative to each slot
    entries = bytes(range(18))
    fuse = k.module("fuse", text, 0x3000, [(text + 0x100, "fuse_dev_read"), (text + 0x40, "fuse_init")],
                    orc=(ips, entries))
    rng = k.module("virtio_rng", text + 0x10000, 0x1000, [(text + 0x10000, "random_recv_done")])
    k.link(k.define("modules", 16), [m + k.off("module", "list") for m in (fuse, rng)])
    s, stub = _synth_session(k, everyone, running)
    res = s.capture_stop("random")
    assert not isinstance(res, str)
    ip_at, entry_at = (int.from_bytes(stub.mem.read(fuse + k.off("module", f"arch.{n}"), 8), "little")
                       for n in ("orc_unwind_ip", "orc_unwind"))
    want = (ModuleInfo("fuse", fuse, 0, (ModuleRegion("text", text, 0x3000),),
                       ((text + 0x40, "fuse_init"), (text + 0x100, "fuse_dev_read")), ModuleOrc(ip_at, entry_at, 3, 6)),
            ModuleInfo("virtio_rng", rng, 0, (ModuleRegion("text", text + 0x10000, 0x1000),),
                       ((text + 0x10000, "random_recv_done"),)))
    assert (res.memory[ip_at], res.memory[entry_at]) == (ips, entries)
    s.offsets_meta = dict  # the synthetic BTF has no pt_regs to lay out
    s.img.build_id = "b0"
    s.write_dump(res, tmp_path / "stop.bin", "6.12.0", {})
    dump = Dump.open(tmp_path / "stop.bin")
    assert dump.info.modules == want
    assert [dump.memory.read(lo, hi - lo) for lo, hi in want[0].orc.ranges()] == [ips, entries]


def test_guest_memory_reads_a_page_once_while_held() -> None:
    from unwind.core.memory import Memory, MemoryFault, Segment
    from unwind.lab.guest import GuestMemory

    page = bytes(range(256)) * 16
    stub = _SynthStub(Memory([Segment(0x10000, page), Segment(0x20000, b"\x07" * 16)]), [])
    g = GuestMemory(SimpleNamespace(rsp=stub, mem_tid="01"))  # type: ignore[arg-type]
    with g.held():
        assert g.read(0x10010, 4) == page[0x10:0x14] and g.read_u64(0x10ff8) == int.from_bytes(page[-8:], "little")
        assert stub.reads == 1
        assert g.read(0x20004, 4) == b"\x07" * 4  # a page the stub cannot read whole: the bytes asked for
        with pytest.raises(MemoryFault):
            g.read(0x30000, 8)
    g.read(0x10010, 4)
    g.read(0x10010, 4)
    assert stub.reads == 1 + 2 + 2 + 2  # page 0x10000; page 0x20000, then its 4 bytes; page 0x30000 twice
