"""Filters on every committed dump and vmcore slice.

Each filter selects exactly the tasks the full replay (``replay --all --json``) shows with its property, and
the tasks the kernel itself says have it: the state letter, command, pid, parent and trace its sysrq-t
printed (kept oracles: their traces are the replay's, pc for pc), and, for the vmcore slices, the state,
command, last CPU and trace drgn recorded (``*.drgn-tasks.json.xz``).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from unwind.cli.main import main
from unwind.core.target import Task
from unwind.session.replay import Session
from tests.corpus_checks import open_slice

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
DUMPS = sorted(CORPORA.glob("*/*/stop-*.bin.xz")) + sorted(CORPORA.glob("*/*/vmcore/stop-*.bin.xz"))
SLICES = sorted(CORPORA.glob("*/*/vmcore/stop-*.elf.xz"))
#: drgn 0.3.0 does not recover function-graph or kretprobe returns (real-kernels.md §6)
DRGN_BLIND = ("return_to_handler", "__kretprobe_trampoline", "arch_rethook_trampoline", "ftrace_stub_graph")

#: sched_show_task(): ``task:%-15.15s state:%c stack:%-5lu pid:%-5d [tgid:%-5d] ppid:%-6d ...``
HEADER = re.compile(r"task:(?P<comm>.{15}) state:(?P<state>\S) .*?\bpid:\s*(?P<pid>\d+)"
                    r"(?:\s+tgid:\s*(?P<tgid>\d+))?\s+ppid:\s*(?P<ppid>\d+)")
#: a trace line the kernel printed for a frame (not a ``? `` guess): riscv's ``[<pc>]``, x86's ``RIP: cs:``
FRAME_LINE = re.compile(r"^\s*(?:\[<[0-9a-f]+>\]\s*|RIP: [0-9a-f]{4}:)?(?P<guess>\?\s+)?"
                        r"(?P<name>[A-Za-z_.$][\w.$]*)\+0x[0-9a-f]+/0x[0-9a-f]+")


def _id(p: Path) -> str:
    return "/".join(p.parts[-4:]).replace("/vmcore/", "/vmcore-")


def _replay_all(args: list[str]) -> list[dict]:
    """``unwind replay --all --json`` (every task, in the dump's order)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["replay", *args, "--all", "--json"]) in (0, 1)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _shown(o: dict) -> set[str]:
    """The functions a replay's JSON shows: each frame's printed symbol and the one its walk recovered."""
    return {s.split("+", 1)[0] for f in o["frames"] for s in (f["symbol"], f["recovered_symbol"])
            if s and not s.startswith("0x")}


def _sysrq_t(session: Session) -> dict[int, dict]:
    """The kept sysrq-t blocks of a dump by pid: the header's fields and the printed functions."""
    out = {}
    for o in session.dump.oracles():
        m = HEADER.search(o.get("text") or "")
        if o["source"] != "sysrq-t" or m is None:
            continue
        lines = o["text"].splitlines()
        names = {f["name"] for f in (FRAME_LINE.match(ln) for ln in lines[1:]) if f and not f["guess"]}
        out[int(m["pid"])] = {"comm": m["comm"].rstrip(), "state": m["state"], "names": names,
                              "ppid": int(m["ppid"]), "tgid": int(m["tgid"]) if m["tgid"] else None}
    return out


def _choices(counts: Counter[str], n: int) -> list[str]:
    """Up to ``n`` values spread from the most common to the rarest."""
    ranked = [v for v, _ in counts.most_common()]
    return list(dict.fromkeys(ranked[i * (len(ranked) - 1) // max(n - 1, 1)] for i in range(n))) if ranked else []


def _check_filters(session: Session, shown: list[dict], oracle: dict[int, dict]) -> int:
    """Every filter kind against the full replay ``shown`` and the independent ``oracle`` (pid -> state,
    comm, names); returns how many oracle tasks were compared."""
    tasks = session.dump.tasks()
    assert [o["task"]["pid"] for o in shown] == [t.pid for t in tasks]
    names = [_shown(o) for o in shown]
    ids = list(range(len(tasks)))

    def key(t: Task) -> tuple[object, ...]:  # Dump.tasks() hands out copies
        return (t.pid, t.task_struct, t.running_cpu, t.comm)

    assert len({key(t) for t in tasks}) == len(tasks)

    def got(**kw: object) -> list[int]:
        chosen = [key(t) for t in session.tasks(**kw)]
        return [i for i in ids if key(tasks[i]) in chosen]

    blocked = {t.pid for t in tasks if t.pid and not t.running}
    known = {pid: o for pid, o in oracle.items() if pid in blocked}  # pid 0: the idle tasks share it

    def agrees(picked: list[int], has: Callable[[dict], bool]) -> None:
        """The oracle's tasks among ``picked`` are exactly the oracle's tasks with the property."""
        assert {tasks[i].pid for i in picked if tasks[i].pid in known} == {pid for pid, o in known.items() if has(o)}

    states = Counter(o["task"]["state"] or "?" for o in shown)  # ps prints ? where the dump has no state
    for letter in [*states, "T"]:
        picked = got(state=letter)
        assert picked == [i for i in ids if (shown[i]["task"]["state"] or "?") == letter]
        agrees(picked, lambda o: o["state"] == letter)
    assert got(state=",".join(states)) == ids
    for regex in ("^kworker/", "sh$", r"^\S+/\d+$", "^no such command$"):
        picked = got(comm=regex)
        assert picked == [i for i in ids if re.search(regex, shown[i]["task"]["comm"])]
        agrees(picked, lambda o: re.search(regex, o["comm"]) is not None)
    pids = sorted({t.pid for t in tasks})
    for few in ([pids[0]], [pids[1], pids[-1]], [pids[-1] + 1]):
        assert got(task=few) == [i for i in ids if shown[i]["task"]["pid"] in few]
    counts = Counter(n for s in names for n in s)
    for fn in _choices(counts, 4) + _choices(Counter(n for o in known.values() for n in o["names"]), 3):
        picked = got(function=fn)
        assert picked == [i for i in ids if fn in names[i]], fn
        agrees(picked, lambda o: fn in o["names"])
    picked = got(state="S,D", comm="^[a-k]", function=counts.most_common(1)[0][0])
    assert picked == [i for i in ids if shown[i]["task"]["state"] in ("S", "D")
                      and re.search("^[a-k]", shown[i]["task"]["comm"]) and counts.most_common(1)[0][0] in names[i]]
    return len(known)


@pytest.mark.parametrize("path", DUMPS, ids=_id)
def test_filters_select_what_the_replay_and_the_kernel_show(path: Path) -> None:
    session = Session.load(path)
    oracle = _sysrq_t(session)
    compared = _check_filters(session, _replay_all([str(path)]), oracle)
    assert compared >= 20 or not any(o["source"] == "sysrq-t" for o in session.dump.oracles())


@pytest.fixture(scope="module", params=SLICES, ids=_id)
def vmcore(request, tmp_path_factory) -> dict:
    """A committed vmcore slice, decompressed, with its slim image, drgn's record and the capture's sysrq-t."""
    stop = open_slice(request.param, tmp_path_factory.mktemp("slice"))
    return {**stop, "session": Session.load(stop["elf"], vmlinux=stop["slim"]),
            "sysrq": _sysrq_t(Session.load(stop["capture"], vmlinux=stop["slim"]))}


def test_vmcore_filters_select_what_the_replay_and_drgn_show(vmcore) -> None:
    session = vmcore["session"]
    shown = _replay_all([str(vmcore["elf"]), "--vmlinux", str(vmcore["slim"])])
    if vmcore["drgn"] is None:  # riscv: drgn 0.3.0 cannot read it; the kernel's sysrq-t of the same stop can
        assert _check_filters(session, shown, vmcore["sysrq"]) >= 20
        return
    drgn = {}
    for t in vmcore["drgn"]["tasks"]:
        frames = [f["symbol"] for f in t.get("frames", [])]
        if t["pid"] and not t["on_cpu"] and "error" not in t and not any((s or "").startswith(DRGN_BLIND)
                                                                         for s in frames):
            # a zombie's stack is freed: the kernel shows no trace (try_get_task_stack() fails), drgn reads the freed pages
            names = {s.split("+")[0] for s in frames if s} if t["state"] != "Z" else set()
            drgn[t["pid"]] = {"state": t["state"], "comm": t["comm"], "names": names}
    assert _check_filters(session, shown, drgn) >= 40


def test_vmcore_tasks_have_the_parent_group_and_cpu_the_kernel_gives(vmcore) -> None:
    """ppid and tgid as sysrq-t printed them at the same stop, the last CPU as drgn's task_cpu(), kernel
    threads as the kernel makes them: the idle tasks, kthreadd (pid 2), and kthreadd's children."""
    tasks = {t.task_struct: t for t in vmcore["session"].dump.tasks()}
    by_pid = {t.pid: t for t in tasks.values() if t.pid}
    sysrq = vmcore["sysrq"]
    assert len(sysrq) >= 20
    for pid, o in sysrq.items():
        t = by_pid[pid]
        assert (t.ppid, t.tgid if o["tgid"] is not None else None) == (o["ppid"], o["tgid"]), (pid, t.comm)
        assert t.kthread == (pid == 2 or o["ppid"] == 2), (pid, t.comm)
    assert all(t.kthread and t.ppid in (0, 1) for t in tasks.values() if t.pid == 0)
    if vmcore["drgn"] is not None:
        for d in vmcore["drgn"]["tasks"]:
            t = tasks[int(d["task"], 16)]
            assert (t.pid, t.cpu) == (d["pid"], d["cpu"]) and (d["on_cpu"] or not t.running), d["comm"]
