"""``unwind ps`` and ``unwind convert``: a dump's or vmcore's task list, and a vmcore made small.

``convert`` writes the project's dump (:class:`unwind.formats.dump.DumpWriter`) with
only what a replay of the chosen tasks reads: their stacks (and their CPUs'
per-CPU stacks), the CPUs' registers, VMCOREINFO and the task metadata, so
the result replays exactly as the vmcore does.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from unwind.formats.dump import DumpWriter
from unwind.session.replay import Session, load_session
from unwind.core.target import Task


def _hex(v: int) -> str:
    return f"{v:#x}"


def task_json(task: Task) -> dict[str, Any]:
    """The ``tasks[]`` entry of the dump's JSON note for ``task`` (docs/dump-format.md)."""
    # a dump's running task has its CPU's registers: one whose registers are missing is written without its CPU
    out: dict[str, Any] = {"pid": task.pid, "comm": task.comm, "state": task.state,
                           "cpu": task.cpu if task.running else None}
    if task.context is not None:
        out["context"] = {k: _hex(v) for k, v in task.context.items()}
    if task.fgraph:
        out["fgraph"] = [{"ret": _hex(e.ret), "retp": _hex(e.retp), "func": _hex(e.func), "fp": _hex(e.fp)}
                         for e in task.fgraph]
    if task.kretprobes:
        out["kretprobes"] = [{"ret": _hex(e.ret), "fp": _hex(e.fp)} for e in task.kretprobes]
    out.update(task.extra)
    return out


def convert(session: Session, tasks: list[Task]) -> DumpWriter:
    """A dump holding ``tasks`` as the session's vmcore (or dump) shows them, and nothing else."""
    dump = session.dump
    w = DumpWriter(session.backend)
    stacks: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for task in tasks:
        for seg in dump.task_memory(task).segments:
            w.add_memory(seg.start, seg.data)
        for s in task.stacks:
            pid = task.pid if s.kind == "task" else None
            key = (s.kind, s.low, s.high, s.cpu, pid, task.extra.get("task") if pid is not None else None)
            if key not in seen:
                seen.add(key)
                entry = {"kind": s.kind, "low": _hex(s.low), "high": _hex(s.high), "cpu": s.cpu, "pid": pid}
                if pid is not None and "task" in task.extra:
                    entry["task"] = task.extra["task"]
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
    w.meta["capture"] = {**dump.meta.get("capture", {}), "converted_from": dump.path}
    return w


def ps_lines(session: Session) -> list[str]:
    """The task list as crash ``ps`` prints it: ``>`` marks a task running on a CPU; a task the dump
    holds only part of says what is missing after its name."""
    lines = ["   PID  CPU  TASK              ST  COMM"]
    for t in sorted(session.dump.tasks(), key=lambda t: (t.pid is None, t.pid or 0, t.cpu is None)):
        task = t.extra.get("task", "-")
        addr = f"{int(task, 0):016x}" if isinstance(task, str) and task.startswith("0x") else str(task)
        cpu = t.cpu if t.cpu is not None else t.extra.get("last_cpu", "-")
        lacks = f"  ({t.lacks.what})" if t.lacks is not None else ""
        lines.append(f"{'>' if t.cpu is not None else ' '}{t.pid if t.pid is not None else '?':>5}  {cpu!s:>3}  "
                     f"{addr:<16}  {t.state or '?':<2}  {t.comm}{lacks}")
    return lines


def cmd_ps(args: argparse.Namespace) -> int:
    """``unwind ps``: every task with pid, CPU, ``task_struct`` and state."""
    session = load_session(args.dump, vmlinux=args.vmlinux)
    for w in session.warnings:
        print(f"unwind: warning: {w}", file=sys.stderr)
    print("\n".join(ps_lines(session)))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """``unwind convert``: write the chosen tasks of a vmcore as the project's small dump."""
    session = load_session(args.dump, vmlinux=args.vmlinux)
    for w in session.warnings:
        print(f"unwind: warning: {w}", file=sys.stderr)
    tasks = session.select(pid=args.task, cpu=args.cpu, every=args.all)
    w = convert(session, tasks)
    w.write(args.output)
    print(f"wrote {args.output}: {len(tasks)} task{'s' * (len(tasks) != 1)}", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``ps`` and ``convert`` to the top-level parser."""
    p = sub.add_parser("ps", help="list the tasks of a vmcore or dump (pid, cpu, task_struct, state, comm)")
    p.add_argument("dump", help="vmcore (ELF, kdump-compressed, flattened) or dump file")
    p.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (default: found by build-id)")
    p.set_defaults(func=cmd_ps)

    c = sub.add_parser("convert", help="write a vmcore's tasks as a small dump that replays the same")
    c.add_argument("dump", help="vmcore (or dump) file")
    c.add_argument("-o", "--output", required=True, help="output dump (.xz/.gz compress)")
    c.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (default: found by build-id)")
    sel = c.add_mutually_exclusive_group()
    sel.add_argument("--task", type=int, metavar="PID", help="only the task with this pid")
    sel.add_argument("--cpu", type=int, metavar="N", help="only the task running on CPU N")
    sel.add_argument("--all", action="store_true", help="every task (default: the running ones)")
    c.set_defaults(func=cmd_convert)
