"""Task filters and the typed task fields on a dump built by construction: which task has which state,
command, pid, parent and frames is known before anything reads it."""

from __future__ import annotations

import json
import re

import pytest

from arch.arm64.synth import TASK_LOW, Arm64Synth, FUNCS, ret
from unwind.cli.main import main
from unwind.session.filters import FilterError, TaskFilter, select
from unwind.session.replay import ReplayError

#: pid: (comm, state, functions of its frames, outermost last), ppid, tgid, kthread, last CPU
TASKS = {
    10: ("sh", "S", (1, 2), 1, 10, False, 1),
    11: ("kworker/0:1", "I", (3, 2), 2, 11, True, 0),
    12: ("kworker/1:0", "D", (4,), 2, 12, True, None),
    13: ("dd", "D", (5, 1), 10, 13, False, 1),
}
#: the task running on cpu0
RUNNING = (14, "dd", (6, 1), 10, 14, False)


def _build() -> Arm64Synth:
    a = Arm64Synth("6.12")
    for i, (pid, (comm, state, funcs, ppid, tgid, kthread, last)) in enumerate(TASKS.items()):
        st = a.task_stack(pid, TASK_LOW + i * 0x10000)
        fps = [st.low + 0x800 + 0x30 * k for k in range(len(funcs) - 1)]
        a.chain(st, fps, [ret(f) for f in funcs[1:]], a.final_fp(st))
        extra = {"state": state, "ppid": ppid, "tgid": tgid, "kthread": kthread, "task": hex(0xFFFF000010000000 + pid)}
        if last is not None:
            extra["last_cpu"] = last
        a.blocked(pid, comm, fp=fps[0] if fps else a.final_fp(st), pc=ret(funcs[0]), sp=st.low + 0x700, **extra)
    pid, comm, funcs, ppid, tgid, kthread = RUNNING
    st = a.task_stack(pid, TASK_LOW + 0x80000, cpu=0)
    fp = st.low + 0x800
    a.chain(st, [fp], [ret(funcs[1])], a.final_fp(st))
    a.running(pid, comm, 0, pc=ret(funcs[0]), x29=fp, sp=st.low + 0x700, ppid=ppid, tgid=tgid, kthread=kthread)
    return a


@pytest.fixture(scope="module")
def synth() -> Arm64Synth:
    return _build()


@pytest.fixture()
def session(synth):
    return synth.session(FUNCS)


def _everyone() -> dict[int, tuple[str, str, tuple[int, ...]]]:
    out = {pid: (comm, state, funcs) for pid, (comm, state, funcs, *_) in TASKS.items()}
    out[RUNNING[0]] = (RUNNING[1], "R", RUNNING[2])
    return out


def _want(state=None, comm=None, function=None, pids=None) -> list[int]:
    """The pids with every property, from the construction."""
    return sorted(pid for pid, (c, s, funcs) in _everyone().items()
                  if (state is None or s in state) and (comm is None or re.search(comm, c))
                  and (function is None or function in funcs) and (pids is None or pid in pids))


CASES = [dict(state="D"), dict(state="S,D"), dict(state=["S", "R"]), dict(comm="^kworker"), dict(comm="d"),
         dict(function=1), dict(function=2, state="I"), dict(task="10,14"), dict(task=[13, "11"]),
         dict(comm="dd", function=6), dict(comm="^dd$", state="D", task=13)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tasks_are_exactly_those_with_every_property(session, case) -> None:
    kw = dict(case)
    if "function" in kw:
        kw["function"] = f"func{kw['function']}"
    got = sorted(t.pid for t in session.tasks(**kw))
    pids = case.get("task")
    if pids is not None:
        pids = [pids] if isinstance(pids, int) else pids.split(",") if isinstance(pids, str) else pids
        pids = [int(p) for p in pids]
    state = case.get("state")
    want = _want(state.split(",") if isinstance(state, str) else state, case.get("comm"), case.get("function"), pids)
    assert got == want and want


def test_a_function_is_a_frame_s_function_not_a_prefix(session) -> None:
    assert session.tasks(function="func") == [] and [t.pid for t in session.tasks(function="func4")] == [12]


def test_values_that_matched_nothing_are_named(session) -> None:
    f = TaskFilter.of(state="T,D", comm="^nosuch", function="func2", task="10,99")
    sel = select(session, session.dump.tasks(), f)
    assert sel.unmatched == ["--state T", "--comm ^nosuch", "--task 99"] and sel.tasks == []
    assert sel.notes(f) == ["--state T matched no task", "--comm ^nosuch matched no task", "--task 99 matched no task"]
    both = TaskFilter.of(state="I", function="func1")  # each matches a task, none both
    sel = select(session, session.dump.tasks(), both)
    assert sel.unmatched == [] and sel.notes(both) == ["no task has all of --state I --function func1"]
    # a function only tasks the other values leave out have still matched a task
    assert select(session, session.dump.tasks(), TaskFilter.of(state="I", function="func5")).unmatched == []
    assert select(session, session.dump.tasks(), TaskFilter.of(function="func63")).unmatched == ["--function func63"]


@pytest.mark.parametrize("kw,message", [
    (dict(state="Q"), "--state Q: not a state letter"), (dict(state="SD"), "--state SD: not a state letter"),
    (dict(state=","), "--state: no state letter given"), (dict(comm="("), "--comm (: not a regular expression"),
    (dict(task="x"), "--task x: not a pid"), (dict(task="-1"), "--task -1: not a pid"),
    (dict(function="schedule+0x27"), "a function name, without offset"),
])
def test_bad_values_are_refused(kw, message) -> None:
    with pytest.raises(FilterError, match=re.escape(message)):
        TaskFilter.of(**kw)


def test_select_refuses_what_it_cannot_honour(session) -> None:
    for kw in (dict(pid=10, cpu=0), dict(pid=10, every=True), dict(cpu=0, every=True)):
        with pytest.raises(ReplayError, match="do not go together"):
            session.select(**kw)
    with pytest.raises(ReplayError, match="pid and filters"):
        session.select(pid=10, filters=TaskFilter.of(state="S"))
    with pytest.raises(ReplayError, match="not a TaskFilter"):
        session.select(filters={"state": "S"})
    assert [t.pid for t in session.select(cpu=0, filters=TaskFilter.of(comm="dd"))] == [14]
    with pytest.raises(ReplayError, match="--state D matched no task on cpu0"):
        session.select(cpu=0, filters=TaskFilter.of(state="D"))


def test_typed_fields_from_the_note(session) -> None:
    tasks = {t.pid: t for t in session.dump.tasks()}
    for pid, (comm, state, _, ppid, tgid, kthread, last) in TASKS.items():
        t = tasks[pid]
        assert (t.comm, t.state, t.ppid, t.tgid, t.kthread, t.cpu, t.running) == \
            (comm, state, ppid, tgid, kthread, last, False)
        assert t.task_struct == 0xFFFF000010000000 + pid and "task" not in t.extra
    run = tasks[RUNNING[0]]
    assert (run.cpu, run.running, run.running_cpu, run.task_struct) == (0, True, 0, None)
    assert tasks[12].running_cpu is None


def test_cli_filters_ps_json_and_notes(synth, tmp_path, capsys) -> None:
    path = tmp_path / "synth.bin"
    path.write_bytes(synth.sd.to_bytes())
    capsys.readouterr()
    assert main(["ps", str(path), "--json", "--state", "D", "--state", "I,T"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["pid"] for r in rows] == _want(state="DIT")
    assert [ln for ln in err.splitlines() if "note" in ln] == ["unwind: note: --state T matched no task"]
    assert rows[0] == {"pid": 11, "ppid": 2, "tgid": 11, "cpu": 0, "running": False, "state": "I",
                       "comm": "kworker/0:1", "task_struct": hex(0xFFFF000010000000 + 11), "kthread": True, "lacks": None}
    assert main(["ps", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["PID", "PPID", "CPU", "TASK", "ST", "COMM"]
    assert lines[1:] == ["    10      1    1  ffff00001000000a  S   sh",
                         "    11      2    0  ffff00001000000b  I   kworker/0:1",
                         "    12      2    -  ffff00001000000c  D   kworker/1:0",
                         "    13     10    1  ffff00001000000d  D   dd",
                         ">   14     10    0  -                 R   dd"]
    assert main(["replay", str(path), "--task", "13", "--task", "10,99"]) == 0
    out, err = capsys.readouterr()
    assert [ln for ln in out.splitlines() if ln.startswith("pid ")] == ["pid 10 (sh) blocked:", "pid 13 (dd) blocked:"]
    assert "unwind: note: --task 99 matched no task" in err
    smap = tmp_path / "System.map"
    smap.write_text("".join(f"{a:016x} T {n}\n" for a, n in FUNCS))
    assert main(["replay", str(path), "--system-map", str(smap), "--function", "func1", "--json"]) == 0
    assert sorted(json.loads(x)["task"]["pid"] for x in capsys.readouterr().out.splitlines()) == _want(function=1)
    assert main(["replay", str(path), "--state", "Q"]) == 2
    assert capsys.readouterr().err.startswith("unwind: error: --state Q: not a state letter")  # before the dump opens
    assert main(["replay", str(path), "--comm", "^sh$", "--state", "D"]) == 2
    assert capsys.readouterr().err.endswith("unwind: error: no task has all of --state D --comm ^sh$\n")


def test_triage_buckets_only_the_filtered_tasks(synth, tmp_path, capsys) -> None:
    path = tmp_path / "synth.bin"
    path.write_bytes(synth.sd.to_bytes())
    out = tmp_path / "t.json"
    assert main(["triage", str(path), "--workers", "1", "--comm", "^kworker", "--state", "D,Z",
                 "--json", str(out)]) == 0
    assert "unwind: note: --state Z matched no task in any dump\n" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["tasks"] == 1 and doc["options"]["filters"] == ["--state D", "--state Z", "--comm ^kworker"]
    assert [(b["state"], b["representative"]["pid"]) for b in doc["buckets"]] == [("D", 12)]
