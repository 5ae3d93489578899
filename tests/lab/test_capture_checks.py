"""Capture refuses a vmlinux that is not the running kernel, and plans stops as asked."""

from types import SimpleNamespace

import pytest

from unwind.lab.capture import CaptureError, Plan, Session


def _session(image_id: str, vmcoreinfo: str) -> Session:
    s = Session.__new__(Session)
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
    from unwind.lab.capture import StopResult, run_capture
    from unwind.lab.rsp import RspError

    s = Session.__new__(Session)
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
    task = next(t for t in Kernel(mem, k.btf, k.symbol).tasks() if t.pid == 100)
    s = Session.__new__(Session)
    s.btf, s.img, s._kernel = k.btf, SimpleNamespace(get=k.symbol), None
    s.read = mem.read
    entries, (ptr, raw) = s.fgraph(task.data)
    assert [(int(e["ret"], 16), int(e["func"], 16), int(e["retp"], 16)) for e in entries] == procs[0].fgraph
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


def _riscv_session(hartid_map: list[int]) -> Session:
    import arch.riscv.lab as lab

    s = Session.__new__(Session)
    s.rsp, s.lab, s.threads, s.ncpu = _HartsRsp(), lab, ["01", "02"], 2
    s.per_cpu_offset = [0, 0x1000]
    table = b"".join(h.to_bytes(8, "little") for h in hartid_map)
    s.symbol = lambda name: 0xffffffff81000000 if name == "__cpuid_to_hartid_map" else None
    s.read = lambda addr, size: table[addr - 0xffffffff81000000:][:size]
    s.hw_cpu_ids = lab.hw_cpu_ids(s, 2)
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
