"""Real-data acceptance: every riscv dump under ``corpora/riscv/`` against its stored oracles.

- blocked tasks: the faithful replay equals the kernel's own ``sysrq-t`` trace, pc for pc;
- IRQ context: the faithful replay equals the ftrace ``stacktrace`` trigger's trace (which ends at
  ``call_on_irq_stack``, as 6.12 does) from its first pc: the dump is taken at ``stacktrace_trigger+0``
  and the kernel's walk skipped the tracer's own frames, so exactly that one replay frame is above it;
- running CPUs: complete mode equals gdb's chained DWARF unwind (inline frames dropped), and every
  difference falls in a documented category (``unwind.arch.riscv.backend.CATEGORIES``).

The dumps are written by the real-kernel lab; the tests skip until they exist. The slim image with the
kernel's text sits beside them (found by build-id). The first test checks the same comparison machinery
on a synthetic dump whose oracles are known.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from unwind.arch.riscv import structs
from unwind.arch.riscv import synth as S
from unwind.arch.riscv.backend import CATEGORIES
from unwind.formats.dump import DumpWriter
from unwind.core.frame import Source
from unwind.session.replay import Replay, load_session
from unwind.core.target import Options
from tests.corpus_checks import assert_blocked_tasks_equal_sysrq_t, running_cpu_results
from unwind.cli.corpus import compare_oracle, paths_under

CORPUS = Path(__file__).resolve().parents[3] / "corpora" / "riscv"
#: the full debug vmlinux in the real-kernel lab's cache (for the chained gdb check)
LAB_VMLINUX = sorted((Path.home() / ".cache" / "unwind" / "kernels").glob("*riscv64*/vmlinux"))
DUMPS = paths_under(CORPUS) if CORPUS.is_dir() else []
NO_DUMPS = f"no riscv dumps under {CORPUS} yet (written by the real-kernel lab)"

#: per oracle source, category counts over the whole corpus (printed at the end of the module)
COUNTS: dict[str, Counter[str]] = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for source, c in sorted(COUNTS.items()):
        print(f"\nriscv corpus {source}: {sum(c.values())} traces: {dict(sorted(c.items()))}")


def hexes(pcs: list[int]) -> list[str]:
    """Addresses as the oracles store them."""
    return [hex(p) for p in pcs]


def test_categories_on_synthetic_oracles():
    sc = S.exception_on_syscall(leaf_code=False)  # complete mode cannot prove read_zero: no text
    gdb = [*sc.faithful[:4], sc.synth.at("read_zero", 0x5E), *sc.faithful[4:]]
    blocked = S.deep_chain(4)
    oracles = {
        "exact": (blocked, {"source": "sysrq-t", "pid": blocked.pid, "cpu": None, "frames": hexes(blocked.faithful)}),
        "stale": (blocked, {"source": "sysrq-t", "pid": blocked.pid, "cpu": None, "frames": ["0x1"], "stale": True}),
        "entry-or-leaf": (sc, {"source": "gdb", "pid": None, "cpu": 0, "frames": hexes(gdb)}),
        "oracle-stops-early": (sc, {"source": "gdb", "pid": None, "cpu": 0, "frames": hexes(sc.faithful[:3])}),
        "unexplained": (blocked, {"source": "sysrq-t", "pid": blocked.pid, "cpu": None,
                                  "frames": hexes(blocked.faithful[1:])}),
    }
    irq = S.irq_on_irq_stack()
    tracer = [irq.synth.at("hrtimer_nanosleep", 0x10), *irq.faithful]
    oracles["tracer-frames"] = (irq, {"source": "ftrace-stacktrace", "pid": irq.pid, "cpu": 0, "frames": hexes(tracer)})
    oracles["exact-complete"] = (irq, {"source": "gdb", "pid": None, "cpu": 0, "frames": hexes(irq.complete)})
    fg = S.fgraph_hijack(kernel_retp=False)  # complete mode recovers; gdb stops at return_to_handler
    oracles["oracle-fgraph"] = (fg, {"source": "gdb", "pid": None, "cpu": 0,
                                     "frames": hexes([*fg.faithful[:3], fg.synth.at("return_to_handler")])})
    trap = S.trap_entry()
    oracles["oracle-trap-entry"] = (trap, {"source": "gdb", "pid": None, "cpu": 0,
                                           "frames": hexes([trap.complete[0], trap.complete[2], trap.complete[2]])})
    for want, (scenario, oracle) in oracles.items():
        res = compare_oracle(scenario.session, oracle)
        assert res is not None and res.category == want.split("-complete")[0], (want, res)
    assert set(CATEGORIES) >= {w for w in oracles if w not in ("exact", "exact-complete", "unexplained")}


def _name(path: str) -> str:
    return str(Path(path).relative_to(CORPUS))


@pytest.mark.skipif(not DUMPS, reason=NO_DUMPS)
@pytest.mark.parametrize("dump", DUMPS, ids=_name)
def test_blocked_tasks_equal_sysrq_t(dump):
    assert_blocked_tasks_equal_sysrq_t(dump, COUNTS)


@pytest.mark.skipif(not DUMPS, reason=NO_DUMPS)
@pytest.mark.parametrize("dump", DUMPS, ids=_name)
def test_running_cpus_within_documented_categories(dump):
    session = load_session(dump)
    for res, detail in running_cpu_results(session, COUNTS):
        if res.source == "ftrace-stacktrace":
            assert res.category in ("exact", "tracer-frames", "stale"), detail  # real stops: exact, above
        else:
            assert res.category == "exact" or res.category in CATEGORIES, detail


FTRACE = [d for d in DUMPS if "-ftrace-" in Path(d).name]


@pytest.mark.skipif(not FTRACE, reason="no ftrace-stacktrace stops in the riscv corpus")
@pytest.mark.parametrize("dump", FTRACE, ids=_name)
def test_irq_context_equals_ftrace_stacktrace(dump):
    """The trigger's walk (arch_stack_walk from inside stack_trace_save) printed after skipping 6 frames:
    arch_stack_walk, stack_trace_save, __ftrace_trace_stack, __trace_stack, stacktrace_trigger,
    event_triggers_post_call. The stop is at stacktrace_trigger+0, where the faithful walk from regs
    shows the pc and drops the ra-held event_triggers_post_call: one frame above the oracle."""
    session = load_session(dump)
    (oracle,) = [o for o in session.dump.oracles() if o["source"] == "ftrace-stacktrace"]
    res = compare_oracle(session, oracle)
    assert res is not None and res.category == "exact" and res.cut == 1, res
    (task,) = [t for t in session.dump.tasks() if t.running_cpu == oracle["cpu"]]
    r = session.replay(task, Options(), symbolize=False)
    trigger = r.target.symbol_address("stacktrace_trigger")
    assert trigger is not None and r.frames[0].pc == trigger
    assert [hex(f.pc) for f in r.frames[1:]] == oracle["frames"]
    assert oracle["frames"][-1] == hex(r.target.symbol_address("call_on_irq_stack") + 0x32)
    COUNTS.setdefault("ftrace-stacktrace (cut 1)", Counter())["exact"] += 1


def _segments(r: Replay) -> list[tuple[dict[str, int], list[int]]]:
    """Register sets where gdb must be restarted (past each pt_regs and call_on_irq_stack record) and
    the complete-mode pcs from there to the next restart."""
    frames = r.frames
    starts = [i for i, f in enumerate(frames) if i and (f.source is Source.STACK_SWITCH or (
        f.source is Source.EXCEPTION_FRAME and not (f.extra and "complete" in f.extra)))]
    out = []
    for j, k in enumerate(starts):
        f = frames[k]
        if f.source is Source.EXCEPTION_FRAME:  # all GPRs from the pt_regs, pc = epc
            pr = structs.pt_regs.parse(r.target.mem.read(f.sp, structs.PT_SIZE))
            regs = {n: pr[n] for n in structs.GPR_NAMES}
            regs["pc"] = pr["epc"]
        else:  # past call_on_irq_stack: pc = [s0 - 8], sp = s0, s0 = [s0 - 16]
            regs = {n: 0 for n in structs.GPR_NAMES}
            regs.update(pc=f.pc, sp=f.sp, s0=f.fp)
        out.append((regs, [x.pc for x in frames[k:(starts + [len(frames)])[j + 1]]]))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not DUMPS, reason=NO_DUMPS)
def test_complete_mode_equals_chained_gdb(tmp_path):
    """gdb-multiarch restarted past every exception and IRQ-stack boundary, as real-kernels.md chains it."""
    if shutil.which("gdb-multiarch") is None or not LAB_VMLINUX:
        pytest.skip("needs gdb-multiarch and the lab's riscv64 debug vmlinux")
    from unwind.lab.oracles import gdb_backtraces

    jobs = []
    for dump in DUMPS:
        session = load_session(dump)
        for task in session.dump.tasks():
            if not task.running:
                continue
            r = session.replay(task, Options(complete=True), symbolize=False)
            for regs, ours in _segments(r):
                w = DumpWriter("riscv")
                for seg in r.target.mem.segments:
                    w.add_memory(seg.start, seg.data)
                w.add_cpu(0, regs)
                core = tmp_path / f"{len(jobs):04d}.core"
                w.write(core)
                jobs.append((core, ours, session))
    if not jobs:
        pytest.skip("no exception or IRQ-stack boundary in the corpus")
    syms = jobs[0][2].symbols
    text = (syms.address("_stext"), syms.address("_etext"))
    got = gdb_backtraces(LAB_VMLINUX[0], [j[0] for j in jobs], "riscv:rv64", text)
    handler = syms.address("return_to_handler")
    counts: Counter[str] = Counter()
    for core, ours, _s in jobs:
        gdb = [int(x, 16) for e in got[str(core)] for x in e["frames"]]
        if gdb[:len(ours)] == ours:
            counts["exact"] += 1
        elif gdb and gdb[-1] == handler and ours[:len(gdb) - 1] == gdb[:-1]:
            counts["oracle-fgraph"] += 1
        elif gdb and ours[:len(gdb)] == gdb and syms.lookup(gdb[-1]).name.startswith("ftrace_"):
            counts["gdb-stops-in-ftrace-trampoline"] += 1
        else:
            counts["unexplained"] += 1
    COUNTS["gdb chained"] = counts
    assert not counts["unexplained"], dict(counts)


#: a sid 7.2 stop with two tasks long blocked under function_graph (a fifo reader in vfs_read, a fifo
#: opener in do_sys_openat2): the kernel's sysrq-t prints return_to_handler for the hijacked returns
FGRAPH_7X = CORPUS / "7.2.13+deb14-riscv64" / "stop-004-random.bin.xz"


@pytest.mark.skipif(not FGRAPH_7X.exists(), reason="no riscv 7.2 fgraph stop")
def test_7x_fgraph_faithful_prints_return_to_handler_and_complete_recovers():
    """7.x ret_stack retp is &fregs->ra in ftrace_caller's frame: the kernel's walk misses the match and
    prints return_to_handler; faithful must too, and complete gives the recorded return, flagged."""
    from unwind.core.frame import Flag

    session = load_session(FGRAPH_7X)
    rth = session.symbols.address("return_to_handler")
    trampolines = {rth, session.symbols.address("arch_rethook_trampoline")}
    hijacked = []
    for o in session.dump.oracles():
        frames = [int(x, 16) for x in o["frames"]]
        if o["source"] == "sysrq-t" and not o.get("stale") and rth in frames:
            hijacked.append((o["pid"], frames))
    assert len(hijacked) >= 2
    for pid, kernel in hijacked:
        task = session.select(pid=pid)[0]
        faithful = session.replay(task, Options())
        assert [f.pc for f in faithful.frames] == kernel
        complete = session.replay(task, Options(complete=True))
        assert len(complete.frames) == len(kernel) and not trampolines & {f.pc for f in complete.frames}
        for k, f in zip(kernel, complete.frames):
            if k in trampolines:
                assert f.flags & Flag.COMPLETE and f.flags & (Flag.FGRAPH | Flag.KRETPROBE), f
            else:
                assert f.pc == k


@pytest.mark.parametrize("path", sorted(CORPUS.glob("7.*/stop-000-*.bin.xz")), ids=lambda p: p.parent.name)
def test_pt_regs_derived_from_the_stacks_equals_btf(path):
    """The pt_regs place a dump without BTF or offsets would derive (where the record chains end on a
    first pt_regs) equals the kernel's BTF: ALIGN(sizeof(struct pt_regs), STACK_ALIGN)."""
    from unwind.arch.riscv.ptregs import derived_pt_regs
    from unwind.arch.riscv.stacktrace import fp_is_valid
    from unwind.arch.riscv.structs import PT_REGS_TABLE, STACK_ALIGN

    s = load_session(path)
    task = next(t for t in s.select(every=True) if not t.running)
    got = derived_pt_regs(s.target(task, Options()), PT_REGS_TABLE, fp_is_valid)
    size = s.image.btf.sizeof("pt_regs")
    assert got is not None and got.size == (size + STACK_ALIGN - 1) // STACK_ALIGN * STACK_ALIGN
    assert got.detail.startswith(f"32 of 32 task record chains end at top-{got.size:#x}")
