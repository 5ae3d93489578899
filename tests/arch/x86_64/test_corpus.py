"""Real-data acceptance: every committed x86-64 dump against the oracles stored in it.

For each dump under ``corpora/x86_64/`` (captured by the real-kernel lab,
image found beside it by build-id): every blocked task's faithful replay
against the kernel's own sysrq-t trace, reliable entries only, pc for pc;
running CPUs against drgn/gdb where the dump holds them. A difference passes
only when it is exact or in a documented category (``backend.CATEGORIES``).
"""

from __future__ import annotations

import os
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from unwind.arch.x86_64.backend import CATEGORIES
from unwind.session.replay import Session, load_session
from unwind.cli.corpus import compare_oracle, paths_under

CORPUS = Path(os.environ.get("UNWIND_CORPORA", Path(__file__).resolve().parents[3] / "corpora")) / "x86_64"
DUMPS = paths_under(CORPUS) if CORPUS.is_dir() else []

if not DUMPS:
    pytestmark = pytest.mark.skip(reason=f"no x86-64 dumps under {CORPUS} yet (the real-kernel lab writes them)")


@lru_cache(maxsize=None)
def _session(dump: str) -> Session:
    """One session per dump for all the tests here (the image is decoded once anyway)."""
    return load_session(dump)


@pytest.mark.parametrize("dump", DUMPS or ["none"], ids=lambda p: Path(p).name)
def test_dump_matches_its_oracles(dump: str) -> None:
    session = _session(dump)
    counts: Counter[str] = Counter()
    unexplained = []
    for oracle in session.dump.oracles():
        res = compare_oracle(session, oracle)
        if res is None:
            continue
        counts[f"{res.source}:{res.category}"] += 1
        if res.category != "exact" and res.category not in CATEGORIES:
            unexplained.append(f"{res.source} {res.who}: want {[hex(a) for a in res.expected]} "
                               f"got {[hex(a) for a in res.got]}")
    print(f"{Path(dump).name}: {dict(counts)}")
    assert not unexplained, "\n".join(unexplained[:5])
    # the kernel's own sysrq-t trace, or (peer stops) drgn's pure-ORC trace of every task, matches exactly
    assert any(k.startswith(("sysrq-t:exact", "drgn:exact")) for k in counts) or not counts


@pytest.mark.parametrize("dump", DUMPS or ["none"], ids=lambda p: Path(p).name)
def test_every_task_walks(dump: str) -> None:
    """No task makes the unwinder raise anything but a stop; blocked tasks mostly end cleanly."""
    session = _session(dump)
    blocked = [t for t in session.select(every=True) if not t.running]
    clean = sum(session.replay(t, symbolize=False).stop.clean for t in blocked)
    assert clean >= 0.9 * len(blocked)


#: lines the replay does not print: sched_show_task()/show_regs_print_info() headers, the console prompt,
#: and Code: bytes (the kernel shows its live-patched text, the image holds the file's)
_NOT_TRACE = ("task:", "Workqueue:", "Code:", "NMI backtrace for cpu", "CPU:", "Hardware name:", "~ #")


def _trace_text(lines: list[str]) -> list[str]:
    """The trace lines a replay prints."""
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith(_NOT_TRACE)]


@pytest.mark.parametrize("dump", DUMPS or ["none"], ids=lambda p: Path(p).name)
def test_printed_text_matches_sysrq(dump: str) -> None:
    """The whole printed trace of each matched sysrq-t task and sysrq-l CPU: ``? `` scan lines, markers,
    register blocks (a running CPU's system registers too)."""
    session = _session(dump)
    same = differ = 0
    first = ""
    for oracle in session.dump.oracles():
        res = compare_oracle(session, oracle)
        if oracle.get("source") not in ("sysrq-t", "sysrq-l") or res is None \
                or res.category not in ("exact", "printed"):
            continue
        task = next(t for t in session.select(every=True)
                    if (t.running_cpu == oracle["cpu"] if oracle.get("cpu") is not None else t.pid == oracle["pid"]
                        and not t.running))
        r = session.replay(task)
        ours = _trace_text([line.text for line in session.backend.format_trace(r.frames, r.stop, r.target)])
        if ours == _trace_text(oracle.get("text", "").splitlines()):
            same += 1
        else:
            differ += 1
            first = first or f"{oracle['source']} pid {task.pid}"
    print(f"{Path(dump).name}: printed text same {same}, differs {differ} {first}")
    assert differ == 0, f"{differ} traces print differently, first {first}"


#: the first stop of each generation sample whose slim image has BTF (bookworm 6.1, sid 7.2)
BTF_STOPS = [p for p in (CORPUS / "6.1.0-57-amd64" / "stop-000-random.bin.xz",
                         CORPUS / "7.2.13+deb14-amd64" / "stop-001-random.bin.xz") if p.exists()]


@pytest.mark.parametrize("path", BTF_STOPS, ids=lambda p: p.parent.name)
def test_pt_regs_derived_from_the_stacks_equals_btf(path):
    """The layout a dump without BTF or offsets would derive equals the kernel's BTF: sizeof(struct pt_regs),
    its IRET members, and the padding above it (16 exactly when the kernel has FRED: struct fred_info)."""
    from unwind import Options
    from unwind.arch.x86_64.unwind_orc import derived_pt_regs

    s = load_session(path)
    btf = s.image.btf
    task = next(t for t in s.select(every=True) if not t.running)
    target = s.target(task, Options())
    got = derived_pt_regs(target, s.backend.unwinder(target).table)
    assert got is not None and got.source == "derived"
    assert got.size == btf.sizeof("pt_regs")
    assert {m: got[m] for m in ("ip", "cs", "sp")} == {m: btf.offsetof("pt_regs", m) for m in ("ip", "cs", "sp")}
    fred = btf.has("fred_info", "struct")
    assert f"TOP_OF_KERNEL_STACK_PADDING {16 if fred else 0})" in got.detail
