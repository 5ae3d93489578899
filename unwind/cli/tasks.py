"""``unwind ps`` and ``unwind convert``: a dump's or vmcore's task list, and a vmcore made small.

``convert`` writes the project's dump (:class:`unwind.formats.dump.DumpWriter`) with
only what a replay of the chosen tasks reads: their stacks (and their CPUs'
per-CPU stacks), the CPUs' registers, VMCOREINFO and the task metadata, so
the result replays exactly as the vmcore does.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from unwind.formats.dump import DumpWriter, hole_fault_name
from unwind.session.replay import ReplayError, Session, load_session
from unwind.core.target import Task


def _hex(v: int) -> str:
    return f"{v:#x}"


def task_json(task: Task) -> dict[str, Any]:
    """The ``tasks[]`` entry of the dump's JSON note for ``task`` (docs/dump-format.md)."""
    # a dump's running task has its CPU's registers: one whose registers are missing is written without its CPU
    out: dict[str, Any] = {"pid": task.pid, "comm": task.comm, "state": task.state,
                           "cpu": task.cpu if task.regs is not None else None}
    known = {"task": None if task.task_struct is None else _hex(task.task_struct),
             "last_cpu": None if task.regs is not None else task.cpu, "ppid": task.ppid, "tgid": task.tgid,
             "kthread": task.kthread}
    out.update({k: v for k, v in known.items() if v is not None})
    if task.context is not None:
        out["context"] = {k: _hex(v) for k, v in task.context.items()}
    if task.fgraph:
        out["fgraph"] = [{"ret": _hex(e.ret), "retp": _hex(e.retp), "func": _hex(e.func), "fp": _hex(e.fp)}
                         for e in task.fgraph]
    if task.kretprobes:
        out["kretprobes"] = [{"ret": _hex(e.ret), "fp": _hex(e.fp)} for e in task.kretprobes]
    if task.lacks is not None:  # its walk stops on it in the dump as in the vmcore
        out["lacks"] = {"what": task.lacks.what, "registers": task.lacks.registers}
    out.update({k: v for k, v in (("fgraph_lacks", task.fgraph_lacks), ("kretprobes_lacks", task.kretprobes_lacks))
                if v is not None})
    out.update(task.extra)
    return out


def convert(session: Session, tasks: list[Task]) -> DumpWriter:
    """A dump holding ``tasks`` as the session's vmcore (or dump) shows them, and nothing else."""
    dump = session.dump
    w = DumpWriter(session.backend)
    stacks: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    holes: dict[tuple[int, int], str] = {}
    for task in tasks:
        memory = dump.task_memory(task)
        for seg in memory.segments:
            w.add_memory(seg.start, seg.data)
        for lo, hi, fault in getattr(memory, "holes", ()):  # why the vmcore lacked it, for the same stop
            holes[(lo, hi)] = hole_fault_name(fault)
        for s in task.stacks:
            pid = task.pid if s.kind == "task" else None
            key = (s.kind, s.low, s.high, s.cpu, pid, task.task_struct if pid is not None else None)
            if key not in seen:
                seen.add(key)
                entry = {"kind": s.kind, "low": _hex(s.low), "high": _hex(s.high), "cpu": s.cpu, "pid": pid}
                if pid is not None and task.task_struct is not None:
                    entry["task"] = _hex(task.task_struct)
                stacks.append(entry)
    cpus = {c.cpu: c for c in dump.cpus}
    for cpu in range(max(cpus, default=-1) + 1):  # the i-th NT_PRSTATUS is CPU i
        c = cpus.get(cpu)
        w.add_cpu(cpu, c.regs if c else {}, c.pid if c else None)
    w.vmcoreinfo = dump.vmcoreinfo_text
    w.meta.update({k: v for k, v in dump.meta.items() if k not in ("format", "arch")})
    w.meta["cpus"] = [{"cpu": c.cpu, "pid": c.pid, "mode": c.mode} for c in dump.cpus]
    w.meta["stacks"] = stacks
    w.meta["tasks"] = [task_json(t) for t in tasks]
    if holes:
        w.meta["holes"] = [{"low": _hex(lo), "high": _hex(hi), "fault": f} for (lo, hi), f in sorted(holes.items())]
    w.meta["capture"] = {**dump.meta.get("capture", {}), "converted_from": dump.path}
    return w


def _ps_order(tasks: list[Task]) -> list[Task]:
    """By pid, the running task of a pid first (idle tasks share pid 0)."""
    return sorted(tasks, key=lambda t: (t.pid is None, t.pid or 0, t.running_cpu is None))


def ps_lines(session: Session, tasks: list[Task] | None = None) -> list[str]:
    """The task list (default: every task) as crash ``ps`` prints it: ``>`` marks a task running on a CPU;
    CPU is the one it runs on, or last ran on; ``-`` where the dump does not say; a task the dump holds only
    part of says what is missing after its name."""
    lines = ["   PID   PPID  CPU  TASK              ST  COMM"]
    for t in _ps_order(session.dump.tasks() if tasks is None else tasks):
        addr = "-" if t.task_struct is None else f"{t.task_struct:016x}"
        lacks = f"  ({t.lacks.what})" if t.lacks is not None else ""
        lines.append(f"{'>' if t.running else ' '}{_dash(t.pid):>5}  {_dash(t.ppid):>5}  "
                     f"{_dash(t.cpu):>3}  {addr:<16}  {t.state or '?':<2}  {t.comm}{lacks}")
    return lines


def _dash(v: int | None) -> str:
    return "-" if v is None else str(v)


def ps_json(task: Task) -> dict[str, Any]:
    """One task of ``unwind ps --json`` (docs/json.md): ``null`` where the dump does not say."""
    return {"pid": task.pid, "ppid": task.ppid, "tgid": task.tgid, "cpu": task.cpu,
            "running": task.running, "state": task.state or None, "comm": task.comm,
            "task_struct": None if task.task_struct is None else _hex(task.task_struct), "kthread": task.kthread,
            "lacks": None if task.lacks is None else task.lacks.what}


def _load_selected(args: argparse.Namespace) -> tuple[Session, list[Task]]:
    """The dump's session, its warnings said, and the tasks the command line's filters select."""
    from .main import selected, task_filter

    f = task_filter(args)
    session = load_session(args.dump, vmlinux=args.vmlinux)
    for w in session.warnings:
        print(f"unwind: warning: {w}", file=sys.stderr)
    return session, selected(session, args, f)


def cmd_ps(args: argparse.Namespace) -> int:
    """``unwind ps``: the tasks (every one, or the filters') with pid, parent, CPU, ``task_struct`` and state."""
    session, tasks = _load_selected(args)
    if args.json:
        for t in _ps_order(tasks):
            print(json.dumps(ps_json(t)))
    else:
        print("\n".join(ps_lines(session, tasks)))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """``unwind convert``: write the chosen tasks of a vmcore as the project's small dump."""
    session, tasks = _load_selected(args)
    w = convert(session, tasks)
    try:
        w.write(args.output)
    except OSError as e:
        raise ReplayError(f"cannot write {args.output}: {e.strerror or e}") from None
    print(f"wrote {args.output}: {len(tasks)} task{'s' * (len(tasks) != 1)}", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``ps`` and ``convert`` to the top-level parser."""
    from .main import add_filter_arguments

    p = sub.add_parser("ps", help="list the tasks of a vmcore or dump (pid, parent, cpu, task_struct, state, comm)",
                       description="List every task (or the filters' tasks), as crash's ps: > marks a task running "
                       "on a CPU, CPU is the one it runs on or last ran on, - what the dump does not say.")
    p.add_argument("dump", help="vmcore (ELF, kdump-compressed, flattened) or dump file")
    p.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (default: found by build-id)")
    p.add_argument("--json", action="store_true", help="one JSON object per task (docs/json.md)")
    add_filter_arguments(p)
    p.set_defaults(func=cmd_ps, all=True)

    c = sub.add_parser("convert", help="write a vmcore's tasks as a small dump that replays the same")
    c.add_argument("dump", help="vmcore (or dump) file")
    c.add_argument("-o", "--output", required=True, help="output dump (.xz/.gz compress)")
    c.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (default: found by build-id)")
    sel = c.add_mutually_exclusive_group()
    sel.add_argument("--cpu", type=int, metavar="N", help="only the task running on CPU N")
    sel.add_argument("--all", action="store_true", help="every task (default: the running ones, or the filters')")
    add_filter_arguments(c)
    c.set_defaults(func=cmd_convert)
