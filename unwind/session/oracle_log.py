"""A dump's replays compared with the traces a console or dmesg log printed for the same tasks.

Each block of printed trace (:mod:`unwind.formats.console`) is matched to a task of the dump: a
``task:`` header (sysrq-t, a hung task) by pid and comm; an ``NMI backtrace for cpu N`` or a ``CPU: N``
line (panic, oops, ``WARN``) by the task running on that CPU, whose pid and comm must agree with the
ones printed. The task is replayed faithfully, and the frame lines its replay prints are read back with
the same parser as the log's, so both are compared pc for pc: as ``name+0xoff``, or by address where
both lines print one (riscv's ``[<address>]``); the ``? `` guesses are not compared.

A ``CPU:`` block was printed by the crashing task on its way to the dump: the dump's registers were
taken later on the same path (``__crash_kexec()`` after ``panic()`` printed), so the two are two moments of
one stack. They are compared below the frame where they part: the first printed frame whose function the
replay also holds (``panic``, which called ``dump_stack()`` and then ``__crash_kexec()``); from that frame
when both print the same pc, else from the frames below it. The frames above are reported as left out.
Where the faithful walk holds none of the printed functions (x86-64's crash CPU: ``__crash_kexec()`` has
no ORC, so the kernel's unwinder prints only ``? `` words from those registers), the ``--complete`` walk is
compared instead, as crash's ``bt`` and drgn walk that CPU, and the comparison says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unwind.core.target import Options, Task
from unwind.core.trace import kernel_text
from unwind.core.walk import Stop
from unwind.formats.console import BlockKind, PrintedFrame, PrintedTrace, parse_frame, parse_traces
from .output import trace_lines
from .replay import Session

#: how many characters of a comm the kernel prints (``TASK_COMM_LEN`` - 1)
COMM_LEN = 15


@dataclass(frozen=True, slots=True)
class FrameDifference:
    """One frame where the log and the replay disagree (``None``: that side has no frame there)."""

    index: int
    printed: str | None
    replayed: str | None
    #: the log's line of the printed frame, if any
    line: int | None


@dataclass(slots=True)
class LogComparison:
    """One printed trace and the replay of the task it was matched to."""

    trace: PrintedTrace
    task: Task
    #: the frames of the kernel's walk the log printed, and those the replay prints
    printed: list[PrintedFrame]
    replayed: list[PrintedFrame]
    #: frames left out at the top of (the log, the replay): a crash block is compared below where they part
    cut: tuple[int, int] = (0, 0)
    #: the replay's stop (what ends its frames)
    stop: Stop | None = None
    #: the faithful walk's stop when the ``--complete`` walk was compared instead (it holds none of the printed
    #: functions), else ``None``
    faithful_stop: Stop | None = None
    differences: list[FrameDifference] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """Equal pc for pc (below the cut)."""
        return not self.differences

    @property
    def mode(self) -> str:
        """The replay compared: ``faithful``, or ``complete`` (see :attr:`faithful_stop`)."""
        return "faithful" if self.faithful_stop is None else "complete"

    @property
    def parted(self) -> tuple[str, str] | None:
        """The printed and the replayed frame just above the cut, where the two moments part (the same
        function at two calls), or ``None`` when either side has no frame left out."""
        i, j = self.cut
        if not i or not j:
            return None
        return self.printed[i - 1].key, self.replayed[j - 1].key


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A printed trace no task of the dump answers to, and why."""

    trace: PrintedTrace
    why: str


@dataclass(slots=True)
class LogDiff:
    """Every printed trace of a log: compared, or unmatched."""

    compared: list[LogComparison] = field(default_factory=list)
    unmatched: list[Unmatched] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """Every matched trace equals its replay (and at least one was matched)."""
        return bool(self.compared) and all(c.agrees for c in self.compared)


def _comm(comm: str | None) -> str:
    return (comm or "").strip()[:COMM_LEN]


def match_task(tasks: list[Task], trace: PrintedTrace) -> Task | str:
    """The task of ``tasks`` (a dump's) that ``trace`` was printed for, or why there is none."""
    if trace.kind is BlockKind.TASK:
        same_pid = [t for t in tasks if t.pid == trace.pid]
        hit = [t for t in same_pid if _comm(t.comm) == _comm(trace.comm)]
        if hit:
            return min(hit, key=lambda t: t.running)  # a blocked task before an idle task of the same pid
        if same_pid:
            return f"pid {trace.pid} is {same_pid[0].comm!r} in the dump, not {trace.comm!r}"
        return f"no task with pid {trace.pid} in the dump (one that started after the capture, or exited before it)"
    if trace.cpu is None:
        return "nothing before it says whose trace it is (no task: header, no CPU: line)"
    running = [t for t in tasks if t.running and t.cpu == trace.cpu]
    if not running:
        return f"no task running on cpu{trace.cpu} in the dump"
    task = running[0]
    if trace.pid is not None and (task.pid != trace.pid or _comm(task.comm) != _comm(trace.comm)):
        return f"cpu{trace.cpu} runs pid {task.pid} ({task.comm}) in the dump, not pid {trace.pid} ({trace.comm})"
    return task


def replayed_frames(session: Session, task: Task, options: Options) -> tuple[list[PrintedFrame], Stop]:
    """Each frame line the replay of ``task`` prints, read back (no ``? `` guesses), and the walk's stop."""
    r = session.replay(task, options)
    out = []
    for line in trace_lines(session, r):
        fr = parse_frame(kernel_text(line))
        if fr is not None and not fr.guess:
            out.append(fr)
    return out, r.stop


def _same_function(p: PrintedFrame, r: PrintedFrame) -> bool:
    return p.symbol is not None and r.symbol is not None and \
        (p.symbol.name, p.symbol.module) == (r.symbol.name, r.symbol.module)


def _parting(printed: list[PrintedFrame], replayed: list[PrintedFrame]) -> tuple[int, int] | None:
    """(i, j): where the printed trace and the replay, two moments of one stack, are compared from. The first
    printed frame whose function the replay also holds, at ``j``: from there when both print the same pc, else
    (the same function at another call) from the frames below it; ``None`` when the replay holds none."""
    for i, p in enumerate(printed):
        for j, r in enumerate(replayed):
            if p.same_pc(r):
                return i, j
            if _same_function(p, r):
                return i + 1, j + 1
    return None


def compare_trace(session: Session, trace: PrintedTrace, task: Task) -> LogComparison:
    """``trace`` against the replay of ``task``, frame by frame: the faithful replay, or for a crash block whose
    functions it holds none of, the ``--complete`` one."""
    printed = trace.reliable
    replayed, stop = replayed_frames(session, task, Options())
    faithful_stop = None
    cut: tuple[int, int] | None = (0, 0)
    if trace.kind is BlockKind.CRASH:
        cut = _parting(printed, replayed)
        if cut is None:
            complete, complete_stop = replayed_frames(session, task, Options(complete=True))
            cut = _parting(printed, complete)
            if cut is not None:
                faithful_stop, replayed, stop = stop, complete, complete_stop
    cut = cut or (0, 0)
    out = LogComparison(trace, task, printed, replayed, cut, stop, faithful_stop)
    a, b = printed[cut[0]:], replayed[cut[1]:]
    for k in range(max(len(a), len(b))):
        p = a[k] if k < len(a) else None
        r = b[k] if k < len(b) else None
        if p is None or r is None or not p.same_pc(r):
            out.differences.append(FrameDifference(cut[0] + k, p.key if p else None, r.key if r else None,
                                                   p.line if p else None))
    return out


def compare_log(session: Session, text: str) -> LogDiff:
    """Every printed trace of console or dmesg ``text``, matched to the dump's tasks and compared."""
    out = LogDiff()
    tasks = session.dump.tasks()
    for trace in parse_traces(text):
        task = match_task(tasks, trace)
        if isinstance(task, str):
            out.unmatched.append(Unmatched(trace, task))
        else:
            out.compared.append(compare_trace(session, trace, task))
    return out
