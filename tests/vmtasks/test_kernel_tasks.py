"""Tasks, CPUs, contexts, stacks, fgraph and kretprobes read back from a synthetic kernel built by construction."""

import struct

import pytest

from unwind.core import registry
from unwind.core.dumpinfo import BpfSymbol
from unwind.formats.dump import Dump
from unwind.core.memory import ExcludedPage, Memory, MemoryFault, Segment
from unwind.session.output import replay_json
from unwind.session.replay import Session
from unwind.kernel.symbols import KernelSymbols, ModuleSymbols, SymbolTable
from unwind.cli.tasks import convert, ps_lines
from unwind.core.walk import StopReason
from unwind.formats.elfcore import prstatus_bytes
from unwind.kernel.model import Kernel, task_state_char
from unwind.formats.vmdump import VmcoreDump

from .kernelgen import THREAD_SIZE, SynthKernel, SynthTask


def _procs() -> list[SynthTask]:
    sh = SynthTask(100, 100, "sh", 1, cpu=1, fgraph=[(0xFFFF800080001234, 0xFFFF800080001000, 0xFFFF800090003F00),
                                                      (0xFFFF800080005678, 0xFFFF800080005000, 0xFFFF800090003E00)])
    worker = SynthTask(200, 200, "worker", 0x402, kretprobes=[(0xFFFF80008000AAAA, 0x1111), (0xFFFF80008000BBBB, 0x2222)])
    worker.parent = sh
    worker.threads = [SynthTask(201, 200, "worker-t1", 2, parent=sh), SynthTask(202, 200, "worker-t2", 0, cpu=1,
                                                                                  parent=sh)]
    # forked by a thread that is not its group's leader: its ppid is that thread's tgid, as /proc says
    zombie = SynthTask(300, 300, "zombie", 0, exit_state=0x20, parent=worker.threads[0], kthread=True)
    return [sh, worker, zombie]


def _ppid(t: SynthTask) -> int:
    """The tgid of the task's real_parent, by construction (init_task, tgid 0, when none)."""
    return t.parent.tgid if t.parent is not None else 0


def _prstatus(cpu: int, regs: dict[str, int]) -> bytes:
    names = registry.get("arm64").prstatus_regs
    return prstatus_bytes(len(names), [regs.get(n, 0) for n in names], cpu + 1)  # QEMU numbers pr_pid cpu + 1


@pytest.mark.parametrize("gen", ["new", "old"])
def test_every_task_once_with_its_fields(gen: str) -> None:
    k = SynthKernel(gen)
    procs = _procs()
    everyone, idle = k.build(procs, [None, procs[1].threads[1]])
    kern = Kernel(k.memory(), k.btf, k.symbol)
    got = {t.addr: t for t in kern.tasks()}
    assert sorted(got) == sorted(t.addr for t in everyone)
    assert not kern.warnings
    for t in everyone:
        g = got[t.addr]
        assert (g.pid, g.tgid, g.comm, g.stack, g.cpu) == (t.pid, t.tgid, t.comm, t.stack, t.cpu)
        assert (g.ppid, g.kthread) == (_ppid(t), t.kthread)
        assert g.state == task_state_char(t.state, t.exit_state)
    assert got[procs[1].threads[1].addr].running_on == 1
    assert got[idle[0]].running_on == 0 and got[idle[0]].idle
    assert got[idle[1]].running_on is None and got[idle[1]].idle
    assert [got[p.addr].state for p in procs] == ["S", "I", "Z"]


def test_state_letters_follow_task_state_index() -> None:
    assert [task_state_char(s, 0) for s in (0, 1, 2, 4, 8, 0x40, 0x402, 0x1000, 0x8000 | 1)] == \
        ["R", "S", "D", "T", "t", "P", "I", "D", "D"]
    assert task_state_char(0, 0x10) == "X" and task_state_char(0, 0x20) == "Z"


@pytest.mark.parametrize("gen", ["new", "old"])
def test_fgraph_and_kretprobes_per_generation(gen: str) -> None:
    k = SynthKernel(gen)
    procs = _procs()
    k.build(procs, [None, None])
    kern = Kernel(k.memory(), k.btf, k.symbol)
    by_pid = {t.pid: t for t in kern.tasks()}
    fg = kern.fgraph(by_pid[100]).entries
    assert [(e.ret, e.func, e.retp) for e in fg] == procs[0].fgraph
    kr = kern.kretprobes(by_pid[200]).entries
    assert [(e.ret, e.fp) for e in kr] == procs[1].kretprobes
    assert kern.fgraph(by_pid[200]) == ([], None) and kern.kretprobes(by_pid[100]) == ([], None)


@pytest.mark.parametrize("gen", ["new", "old"])
def test_a_list_the_dump_lacks_part_of_is_read_up_to_the_gap_and_says_where(gen: str) -> None:
    k = SynthKernel(gen)
    procs = _procs()
    k.build(procs, [None, None])
    sh, worker = procs[0], procs[1]
    mem = k.memory()
    head, node_t = ("rethooks", "rethook_node") if gen == "new" else ("kretprobe_instances", "kretprobe_instance")
    ret_stack = mem.read_u64(sh.addr + k.off("task_struct", "ret_stack"))
    older = mem.read_u64(mem.read_u64(worker.addr + k.off("task_struct", head)))  # the newest node's next
    del k.segs[ret_stack]  # the return stack's page is not in the dump
    del k.segs[older - k.off(node_t, "llist")]  # nor the older instance's node
    kern = Kernel(k.memory(), k.btf, k.symbol)
    by_pid = {t.pid: t for t in kern.tasks()}
    fg = kern.fgraph(by_pid[100])
    assert fg.entries == [] and fg.lacks is not None and f"task->ret_stack {ret_stack:#x}" in fg.lacks
    kr = kern.kretprobes(by_pid[200])
    assert [(e.ret, e.fp) for e in kr.entries] == worker.kretprobes[:1]
    assert kr.lacks is not None and f"node {older:#x}" in kr.lacks


def test_a_looping_task_list_ends_with_a_warning() -> None:
    k = SynthKernel()
    procs = _procs()
    k.build(procs, [None, None])
    off = k.off("task_struct", "tasks")
    k.u64(procs[2].addr + off, procs[1].addr + off)  # zombie -> worker: a cycle that never reaches init_task
    kern = Kernel(k.memory(), k.btf, k.symbol)
    pids = sorted(t.pid for t in kern.tasks())
    assert pids == [0, 0, 100, 200, 201, 202, 300]
    assert any("loops back" in w for w in kern.warnings)


def test_vmcore_dump_tasks_regs_contexts_and_stacks() -> None:
    k = SynthKernel()
    procs = _procs()
    running = procs[1].threads[1]
    everyone, idle = k.build(procs, [None, running])
    regs1 = {"pc": 0xFFFF800080004444, "sp": running.stack + 0x3000, "x29": running.stack + 0x3010,
             "pstate": 0x5}
    regs0 = {"pc": 0xFFFF800080003333, "sp": k.irq_stacks[0] + 0x100, "pstate": 0x5}
    d = VmcoreDump("synthetic", registry.get("arm64"), k.memory(), [_prstatus(1, regs1), _prstatus(0, regs0)],
                   "OSRELEASE=6.12.0-synthetic\nBUILD-ID=" + "ab" * 20 + "\n", k.symbol, k.btf)
    assert d.build_id == "ab" * 20 and d.release == "6.12.0-synthetic"
    assert [c.cpu for c in d.cpus] == [0, 1] and d.cpus[1].regs["pc"] == regs1["pc"]
    tasks = d.tasks()
    assert [(t.cpu, t.pid) for t in tasks[:2]] == [(0, 0), (1, 202)]
    t202 = tasks[1]
    assert t202.regs == {**{n: 0 for n in registry.get("arm64").prstatus_regs}, **regs1}
    assert t202.stacks[0].low == running.stack and t202.stacks[0].high == running.stack + THREAD_SIZE
    kinds = {s.kind: (s.low, s.high, s.cpu) for s in t202.stacks[1:]}
    assert kinds["irq"] == (k.irq_stacks[1], k.irq_stacks[1] + THREAD_SIZE, 1)
    ovf = k.symbols["overflow_stack"] + k.percpu_offset[1]
    assert kinds["overflow"] == (ovf, ovf + 4096, 1)
    blocked = {t.pid: t for t in tasks[2:] if t.pid}
    assert blocked[201].context == procs[1].threads[0].ctx and not blocked[201].running
    assert blocked[201].cpu == procs[1].threads[0].cpu  # the CPU it last ran on
    assert [s.kind for s in blocked[201].stacks] == ["task"]
    assert blocked[100].fgraph and blocked[200].kretprobes
    assert blocked[201].task_struct == procs[1].threads[0].addr
    made = {t.addr: t for t in everyone}
    for t in tasks:
        want = made[t.task_struct]
        assert (t.pid, t.ppid, t.tgid, t.kthread) == (want.pid, _ppid(want), want.tgid, want.kthread)
        # rq->curr of cpu0 is its idle task, of cpu1 worker-t2: each runs on its own thread_info.cpu
        assert t.cpu == want.cpu and t.running == (want in (everyone[0], running)), t.describe()


def _session() -> tuple[Session, SynthKernel, list[SynthTask]]:
    k = SynthKernel()
    procs = _procs()
    running = procs[1].threads[1]
    k.build(procs, [None, running])
    regs1 = {"pc": 0xFFFF800080004444, "sp": running.stack + 0x3000, "x29": running.stack + 0x3010, "pstate": 0x5}
    k.write(running.stack + 0x3010, struct.pack("<QQ", 0, 0))  # a final frame record
    d = VmcoreDump("synthetic", registry.get("arm64"), k.memory(), [_prstatus(1, regs1)],
                   "OSRELEASE=6.12.0-synthetic\n", k.symbol, k.btf)
    return Session(d, None, None), k, procs  # type: ignore[arg-type]


def test_convert_keeps_every_task_and_replays_the_same(tmp_path) -> None:
    session, k, procs = _session()
    tasks = session.select(every=True)
    out = tmp_path / "dump.bin"
    convert(session, tasks).write(out)
    again = Session(Dump.open(out), None, None)
    back = again.select(every=True)
    # cpu0's swapper runs without its CPU's registers: written with no cpu and lacks.registers, it is running still
    key = lambda t: (t.pid, t.cpu, t.running, t.regs is not None, t.task_struct, t.ppid, t.tgid, t.kthread)  # noqa: E731
    assert sorted(map(key, back)) == sorted(map(key, tasks))
    assert [t.pid for t in tasks if t.running and t.regs is None] == [0]
    by = {key(t): t for t in back}
    for t in tasks:
        b = by[key(t)]
        assert (b.comm, b.state, b.regs, b.context, b.fgraph, b.kretprobes) == \
            (t.comm, t.state, t.regs, t.context, t.fgraph, t.kretprobes)
        assert sorted((s.kind, s.low, s.high) for s in b.stacks) == sorted((s.kind, s.low, s.high) for s in t.stacks)
        r1, r2 = session.replay(t, symbolize=False), again.replay(b, symbolize=False)
        assert [f.pc for f in r1.frames] == [f.pc for f in r2.frames] and r1.stop.reason == r2.stop.reason
    assert out.stat().st_size < 200_000


def test_ps_lists_every_task_with_its_task_struct() -> None:
    session, k, procs = _session()
    lines = ps_lines(session)
    assert lines[0].split() == ["PID", "PPID", "CPU", "TASK", "ST", "COMM"]
    rows = [ln.lstrip(">").split() for ln in lines[1:]]
    assert sorted(int(r[0]) for r in rows) == [0, 0, 100, 200, 201, 202, 300]
    made = {t.addr: t for p in procs for t in (p, *p.threads)}
    for r in rows:
        if int(r[0]):
            t = made[int(r[3], 16)]
            assert (int(r[1]), int(r[2]), r[5]) == (_ppid(t), t.cpu, t.comm)
    running = [ln for ln in lines if ln.startswith(">")]
    # only cpu1 saved registers: cpu0's swapper runs too, and says its registers are missing; its stale saved
    # context is not walked
    assert len(running) == 2 and f"{procs[1].threads[1].addr:016x}" in running[1] and "worker-t2" in running[1]
    assert running[0].split()[1:5] == ["0", "0", "0", f"{k.symbols['init_task']:016x}"]  # pid, ppid, cpu, task
    assert running[0].endswith("(cpu0's registers are not in the dump (no NT_PRSTATUS note for it))")
    swapper = next(t for t in session.dump.tasks() if t.cpu == 0)
    r = session.replay(swapper)
    assert r.frames == [] and r.stop.reason is StopReason.MISSING_REGISTER and "cpu0's registers" in r.stop.detail
    # running as ps shows it for every command: --cpu 0 and the default selection take it, the JSON says so
    assert (swapper.running, swapper.running_cpu, swapper.regs) == (True, 0, None)
    assert session.select(cpu=0) == [swapper] and swapper in session.select()
    task = replay_json(session, r)["task"]
    assert (task["cpu"], task["running"], task["regs"]) == (0, True, None)


@pytest.mark.parametrize("gen", ["new", "old"])
def test_module_symbols_print_with_their_module(gen: str) -> None:
    k = SynthKernel(gen)
    k.build(_procs(), [None, None])
    text = 0xFFFF800078000000
    mods = [k.module("fuse", text, 0x3000, [(text + 0x100, "fuse_dev_read"), (text + 0x40, "fuse_init"),
                                            (text + 0x100, "$x"), (text + 0x2000, "fuse_get_req")]),
            k.module("virtio_rng", text + 0x10000, 0x1000, [(text + 0x10000, "random_recv_done")])]
    k.link(k.define("modules", 16), [m + k.off("module", "list") for m in mods])
    kern = Kernel(k.memory(), k.btf, k.symbol)
    got = kern.modules()
    assert [m.name for m in got] == ["fuse", "virtio_rng"]
    assert (got[0].regions[0].base, got[0].regions[0].size) == (text, 0x3000)
    assert [n for _, n in got[0].symbols] == ["fuse_init", "fuse_dev_read", "fuse_get_req"]  # $x is a mapping symbol
    table = KernelSymbols(SymbolTable([(0xFFFF800080000000, "T", "_stext"), (0xFFFF800080100000, "T", "_end")]),
                          [ModuleSymbols.of(m) for m in got])
    assert table.format(text + 0x123) == "fuse_dev_read+0x23/0x1f00 [fuse]"
    assert table.format(text + 0x2fff) == "fuse_get_req+0xfff/0x1000 [fuse]"   # to the end of the text region
    assert table.format(text + 0x10010) == "random_recv_done+0x10/0x1000 [virtio_rng]"
    assert table.format(text + 0x10) == hex(text + 0x10)                        # below the first symbol
    assert table.format(0xFFFF800080000010) == "_stext+0x10/0x100000"


def test_a_converted_vmcore_gives_the_walks_the_same_modules(tmp_path) -> None:
    """The modules read through BTF come back, equal, from the note ``unwind convert`` writes."""
    k = SynthKernel()
    procs = _procs()
    running = procs[1].threads[1]
    k.build(procs, [None, running])
    text = 0xFFFF800078000000
    mods = [k.module("fuse", text, 0x3000, [(text + 0x100, "fuse_dev_read"), (text + 0x40, "fuse_init")])]
    k.link(k.define("modules", 16), [m + k.off("module", "list") for m in mods])
    regs = {"pc": 0xFFFF800080004444, "sp": running.stack + 0x3000, "x29": running.stack + 0x3010, "pstate": 0x5}
    d = VmcoreDump("synthetic", registry.get("arm64"), k.memory(), [_prstatus(1, regs)], "OSRELEASE=6.12.0\n",
                   k.symbol, k.btf)
    (fuse,) = d.info.modules
    assert (fuse.name, fuse.addr, [(r.base, r.size) for r in fuse.regions]) == ("fuse", mods[0], [(text, 0x3000)])
    assert sorted(fuse.symbols) == [(text + 0x40, "fuse_init"), (text + 0x100, "fuse_dev_read")]
    out = tmp_path / "dump.bin"
    convert(Session(d, None, None), d.tasks()).write(out)  # type: ignore[arg-type]
    back = Dump.open(out).info
    assert (back.modules, back.bpf_symbols, back.symbols, back.release) == \
        (d.info.modules, d.info.bpf_symbols, d.info.symbols, "6.12.0")


def test_bpf_programs_print_without_a_module() -> None:
    table = KernelSymbols(SymbolTable([(0xFFFF800080000000, "T", "_stext")]),
                          [ModuleSymbols.bpf([
                              BpfSymbol(0xFFFF800078100000, 0xFFFF800078100080, "bpf_prog_6deef7357e7b4530"),
                              BpfSymbol(0xFFFF800078101000, 0xFFFF800078101200, "bpf_trampoline_12")])])
    assert table.format(0xFFFF800078100010) == "bpf_prog_6deef7357e7b4530+0x10/0x80"
    assert table.format(0xFFFF8000781011FF) == "bpf_trampoline_12+0x1ff/0x200"
    assert table.format(0xFFFF800078100080) == hex(0xFFFF800078100080)


class _Filtered:
    """A vmcore's memory with one page makedumpfile excluded: reads there raise ExcludedPage."""

    def __init__(self, mem, page: int, size: int = 4096) -> None:
        self.mem, self.page, self.size = mem, page, size

    def read(self, addr: int, size: int) -> bytes:
        if addr < self.page + self.size and addr + size > self.page:
            raise ExcludedPage(addr, size)
        return self.mem.read(addr, size)

    def read_u64(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")

    def snapshot(self, ranges):
        segs = []
        for lo, hi in ranges:
            for a in range(lo & ~0xFFF, hi, 4096):
                s, e = max(a, lo), min(a + 4096, hi)
                try:
                    segs.append(Segment(s, self.read(s, e - s)))
                except MemoryFault:
                    pass
        return Memory(segs)


def test_a_page_excluded_from_the_dump_is_a_clean_memory_fault_stop() -> None:
    k = SynthKernel()
    procs = _procs()
    k.build(procs, [None, None])
    t = procs[1].threads[0]
    fp = t.stack + 0x3F00
    k.u64(t.addr + k.off("task_struct", "thread.cpu_context.fp"), fp)  # its first frame record: an excluded page
    d = VmcoreDump("synthetic", registry.get("arm64"), _Filtered(k.memory(), fp & ~0xFFF), [], "OSRELEASE=6.12.0\n",
                   k.symbol, k.btf)
    s = Session(d, None, None)  # type: ignore[arg-type]
    r = s.replay(s.select(pid=201)[0], symbolize=False)
    assert r.stop.reason is StopReason.MEMORY_FAULT and "excluded from the dump" in r.stop.detail


@pytest.mark.parametrize("seed", range(4))
def test_a_mutated_kernel_never_raises_anything_but_a_dump_error(seed: int) -> None:
    """Random words of the synthetic kernel overwritten: the task list, contexts, stacks and walks end with
    warnings, a DumpError or a stop; never another exception, never a hang."""
    import random

    from unwind.formats.dump import DumpError

    rng = random.Random(seed)
    for _ in range(25):
        k = SynthKernel(rng.choice(["new", "old"]))
        procs = _procs()
        k.build(procs, [None, procs[1].threads[1]])
        objs = [a for a, d in k.segs.items() if 16 <= len(d) <= 0x2000]
        for _ in range(rng.randint(1, 12)):
            base = rng.choice(objs)
            off = rng.randrange(0, len(k.segs[base]) - 8) & ~7
            k.u64(base + off, rng.choice([0, 2**64 - 1, rng.getrandbits(64), base, base + off, objs[0]]))
        try:
            d = VmcoreDump("fuzz", registry.get("arm64"), k.memory(), [_prstatus(1, {"pc": 1, "sp": 2, "pstate": 5})],
                           "OSRELEASE=6.12.0\n", k.symbol, k.btf)
            s = Session(d, None, None)  # type: ignore[arg-type]
            for t in s.select(every=True):
                s.replay(t, symbolize=False)
            ps_lines(s)
        except DumpError:
            pass


def test_a_real_crash_takes_each_cpus_registers_from_its_crash_notes() -> None:
    """kdump (VMCOREINFO CRASHTIME): crash_save_cpu() wrote one note per CPU into per_cpu_ptr(crash_notes, cpu);
    a CPU that saved nothing has an empty buffer. The file's notes (here: misleading ones) are not used."""
    from unwind.formats.elfcore import NT_PRSTATUS, note

    k = SynthKernel()
    procs = _procs()
    running = procs[1].threads[1]
    k.build(procs, [None, running])
    ptr = k.define("crash_notes", 8)
    area = 0xFFFF800081000400  # the per-CPU buffer's address before __per_cpu_offset
    k.u64(ptr, area)
    regs1 = {"pc": 0xFFFF800080009999, "sp": running.stack + 0x3000, "pstate": 5}
    buf = note("CORE", NT_PRSTATUS, _prstatus(1, regs1)[:])
    k.write(area + k.percpu_offset[1], buf)  # cpu0's buffer stays zero: it saved nothing
    bogus = _prstatus(0, {"pc": 0x1234})
    d = VmcoreDump("kdump", registry.get("arm64"), k.memory(), [bogus], "OSRELEASE=6.12.0\nCRASHTIME=1700000000\n",
                   k.symbol, k.btf)
    assert [(c.cpu, c.regs["pc"]) for c in d.cpus] == [(1, regs1["pc"])]
    assert [t.pid for t in d.tasks() if t.regs is not None] == [running.pid]
    (idle,) = [t for t in d.tasks() if t.running and t.regs is None]  # cpu0's current: running, its registers lost
    assert (idle.pid, idle.running_cpu, idle.lacks.registers) == (0, 0, True)


@pytest.mark.parametrize("member", ["nvcsw", "stack"])
def test_a_task_struct_member_the_dump_lacks_is_named_and_the_others_are_read(member: str) -> None:
    """A task_struct's members are read at once; where that read faults (one member's bytes excluded), each
    member is read alone: the task is listed with every other field, and the lost member is named."""
    k = SynthKernel("new")
    procs = _procs()
    everyone, _ = k.build(procs, [None, None])
    sh = procs[0]
    at = sh.addr + k.off("task_struct", member)
    kern = Kernel(_Filtered(k.memory(), at, 8), k.btf, k.symbol)
    got = {t.addr: t for t in kern.tasks()}
    assert sorted(got) == sorted(t.addr for t in everyone)
    g = got[sh.addr]
    assert (g.pid, g.tgid, g.comm, g.cpu, g.ppid) == (sh.pid, sh.tgid, sh.comm, sh.cpu, _ppid(sh))
    assert g.state == task_state_char(sh.state, sh.exit_state)
    assert [m.split(" ", 1)[0] for m in g.missing] == [member] and f"at {at:#x}: " in g.missing[0]
    assert g.stack == (0 if member == "stack" else sh.stack)
    assert all(not got[t.addr].missing for t in everyone if t.addr != sh.addr)


@pytest.mark.parametrize("gen", ["new", "old"])
def test_a_thread_ring_cut_by_a_lost_task_struct_is_read_back_from_its_head(gen: str) -> None:
    """The middle thread's task_struct is not in the dump: the thread after it is reached backwards round its
    group's ring (``signal->thread_head``, or ``thread_group`` in the old layout), and the lost one is named."""
    k = SynthKernel(gen)
    procs = _procs()
    everyone, _ = k.build(procs, [None, None])
    lost = procs[1].threads[0]
    kern = Kernel(_Filtered(k.memory(), lost.addr, 0x400), k.btf, k.symbol)
    got = {t.addr for t in kern.tasks()}
    assert got == {t.addr for t in everyone} - {lost.addr}
    assert [t.addr for t in kern.lost_tasks] == [lost.addr]
    assert kern.lost_tasks[0].why.startswith(f"task_struct.pid at {lost.addr + k.off('task_struct', 'pid'):#x}: ")
    assert any("read backwards from its head" in w for w in kern.warnings)
