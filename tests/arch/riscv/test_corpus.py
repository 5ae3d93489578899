"""Real-data acceptance: every riscv dump under ``corpora/riscv/`` against its stored oracles.

- blocked tasks: the faithful replay equals the kernel's own ``sysrq-t`` trace, pc for pc;
- IRQ context: the faithful replay equals the tail of the ftrace ``stacktrace`` trigger's trace (which
  ends at ``call_on_irq_stack``, as 6.12 does);
- running CPUs: complete mode equals gdb's chained DWARF unwind (inline frames dropped), and every
  difference falls in a documented category (``unwind.arch.riscv.backend.CATEGORIES``).

The dumps are written by the real-kernel lab; the tests skip until they exist. The slim image with the
kernel's text sits beside them (found by build-id). The first test checks the same comparison machinery
on a synthetic dump whose oracles are known.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from unwind.arch.riscv import synth as S
from unwind.arch.riscv.backend import CATEGORIES
from unwind.replay import load_session
from unwind.target import Options
from unwind.tools import compare_oracle, paths_under

CORPUS = Path(__file__).resolve().parents[3] / "corpora" / "riscv"
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
    session = load_session(dump)
    tasks = {t.pid: t for t in session.dump.tasks() if not t.running}
    checked = 0
    for oracle in session.dump.oracles():
        if oracle.get("source") != "sysrq-t" or oracle.get("stale") or oracle.get("pid") not in tasks:
            continue
        r = session.replay(tasks[oracle["pid"]], Options(), symbolize=False)
        got = [hex(f.pc) for f in r.frames]
        want = [hex(int(x, 0)) for x in oracle["frames"]]
        COUNTS.setdefault("sysrq-t", Counter())["exact" if got == want else "DIFFERENT"] += 1
        assert got == want, f"pid {oracle['pid']} ({oracle.get('comm')}): stop {r.stop}"
        checked += 1
    if not checked:
        pytest.skip("no fresh sysrq-t oracle for a blocked task in this dump")


@pytest.mark.skipif(not DUMPS, reason=NO_DUMPS)
@pytest.mark.parametrize("dump", DUMPS, ids=_name)
def test_running_cpus_within_documented_categories(dump):
    session = load_session(dump)
    seen = 0
    for oracle in session.dump.oracles():
        if oracle.get("cpu") is None:
            continue
        res = compare_oracle(session, oracle)
        if res is None:
            continue
        seen += 1
        COUNTS.setdefault(res.source, Counter())[res.category] += 1
        detail = f"{res.source} {res.who}: {res.category}: expected {[hex(x) for x in res.expected]}, " \
                 f"replayed {[hex(x) for x in res.got]}"
        if res.source == "ftrace-stacktrace":
            assert res.category in ("exact", "tracer-frames", "stale"), detail
        else:
            assert res.category == "exact" or res.category in CATEGORIES, detail
    if not seen:
        pytest.skip("no running-CPU oracle in this dump")
