"""The kernel reader and a vmcore's replay on hostile kernel memory: words of a synthetic kernel
(task lists, task_structs, per-CPU data, fgraph and kretprobe lists, stacks) mutated, then every
task listed and replayed in every mode. Only one-line input errors may escape."""

from __future__ import annotations

import random
import struct

from unwind.dev.fuzz import checks
from unwind.dev.fuzz.checks import MODES, _bad_value, instrument
from unwind.core import registry
from unwind.formats.dump import DumpError
from unwind.kernel.model import KernelError
from unwind.core.memory import Memory, Segment
from unwind.session.replay import ReplayError, Session
from unwind.formats.vmdump import VmcoreDump

from ..vmtasks.kernelgen import SynthKernel
from ..vmtasks.test_kernel_tasks import _prstatus, _procs

CASES = 150


def _case(rng: random.Random) -> str:
    k = SynthKernel(rng.choice(["new", "old"]))
    procs = _procs()
    running = procs[1].threads[1]
    everyone, idle = k.build(procs, [None, running])
    mem = k.memory()
    segs = {s.start: bytearray(s.data) for s in mem.segments}
    # the words the kernel reader follows: task_structs (lists, pid, comm, stack, thread), init_task,
    # the run queues and per-CPU data; now and then any word
    size = k.btf.sizeof("task_struct")
    hot = [t.addr for t in everyone] + list(idle) + [a for a in (k.symbol("init_task"), k.symbol("runqueues")) if a]
    ptrs = hot + [s.start for s in mem.segments]

    def word() -> tuple[int, int]:
        addr = rng.choice(hot) + 8 * rng.randrange(size // 8) if rng.random() < 0.85 else None
        seg = next((s for s in mem.segments if addr is not None and s.start <= addr < s.end - 7), None)
        if seg is None:
            seg = rng.choice([s for s in mem.segments if len(s.data) >= 8])
            addr = seg.start + 8 * rng.randrange(len(seg.data) // 8)
        return seg.start, addr - seg.start
    for _ in range(rng.randint(1, 8)):
        start, off = word()
        value = rng.choice((0, 2**64 - 1, rng.getrandbits(64), rng.choice(ptrs), start + off,
                            struct.unpack_from("<Q", segs[start], off)[0] ^ (1 << rng.randrange(64))))
        struct.pack_into("<Q", segs[start], off, value)
    hostile = instrument(Memory([Segment(a, bytes(d)) for a, d in segs.items()]))
    regs = {"pc": 0xFFFF800080004444, "sp": running.stack + 0x3000, "x29": running.stack + 0x3010, "pstate": 5}
    try:
        d = VmcoreDump("hostile", registry.get("arm64"), hostile, [_prstatus(1, regs)], "OSRELEASE=6.12.0-synthetic\n",
                       k.symbol, k.btf)
        session = Session(d, None, None)  # type: ignore[arg-type]
        tasks = session.select(every=True)
    except (DumpError, KernelError, ReplayError) as e:
        assert "\n" not in str(e)
        return "rejected"
    for task in tasks:
        for mode, (options, reliable) in MODES.items():
            r = session.replay(task, options, reliable=reliable, symbolize=False)
            limit = checks.frame_limit(task.stacks, d.task_memory(task), 16)
            assert len(r.frames) <= limit, (mode, task.describe())
            assert _bad_value(r.frames) is None
    return "ok"


def test_hostile_kernel_memory_is_listed_and_replayed_or_refused_in_one_line():
    kinds = [_case(random.Random(f"vmdump:{i}")) for i in range(CASES)]
    assert kinds.count("ok") > CASES // 2
