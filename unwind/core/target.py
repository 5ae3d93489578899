"""What one walk needs: the task, its usable stacks, memory, symbols and options."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping

from .dumpinfo import DumpInfo
from .memory import Memory
from .stackinfo import StackInfo

if TYPE_CHECKING:
    from unwind.kernel.symbols import SymbolTable
    from unwind.formats.image import Image


_VERSION = re.compile(r"^\s*v?(\d{1,3})\.(\d{1,3})(?![\d])")


def kernel_version(text: object) -> tuple[int, int] | None:
    """``(major, minor)`` of a kernel release or ``--generation`` value (``6.12``, ``v6.13``,
    ``7.2.13+deb14-arm64``); ``None`` when it does not start with one."""
    m = _VERSION.match(text) if isinstance(text, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(slots=True)
class FgraphEntry:
    """One function-graph return-stack entry: the hijacked return address and where it lived."""

    ret: int
    retp: int
    func: int = 0
    #: the frame pointer recorded at the hijack (HAVE_FUNCTION_GRAPH_FP_TEST: riscv's caller s0), 0 if none
    fp: int = 0


@dataclass(slots=True)
class KretprobeInstance:
    """One kretprobe/rethook instance: the original return address and its frame key."""

    ret: int
    fp: int


@dataclass(frozen=True, slots=True)
class Lack:
    """What a dump lacks that a walk of a task needs: the walk stops on it, saying so."""

    #: one sentence: which member or CPU, at which address, and why it is missing
    what: str
    #: the missing thing is its CPU's registers (else memory of the task)
    registers: bool = False


class _Fields:
    """What :class:`Task` and :class:`Target` have of a dataclass: equality and ``repr`` by their fields
    (:attr:`FIELDS`, in order, as :meth:`_fields` gives them), and :meth:`replace`. A plain base class
    rather than ``@dataclass``: the compiled build (``target.pxd``) makes both extension types."""

    __slots__ = ()

    #: the fields, in order
    FIELDS: tuple[str, ...] = ()

    def _fields(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in self.FIELDS])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclasses they replace

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self.FIELDS, self._fields()))})"

    def replace(self, **changes: Any) -> Any:
        """A copy with the fields named in ``changes`` set to their values (as :func:`dataclasses.replace`)."""
        values = dict(zip(self.FIELDS, self._fields()))
        values.update(changes)
        return type(self)(**values)


#: :class:`Task`'s fields, in order
_TASK_FIELDS = ("pid", "comm", "state", "cpu", "regs", "context", "stacks", "fgraph", "kretprobes", "user_regs",
                "extra", "lacks", "task_struct", "ppid", "tgid", "kthread", "fgraph_lacks", "kretprobes_lacks")


class Task(_Fields):
    """A task in a dump.

    ``regs`` are the registers of the CPU it runs on (a running task);
    ``context`` is the saved context of a blocked task. ``stacks`` are the
    stacks the kernel would let a walk of this task use: the task stack,
    plus the per-CPU stacks of its CPU when it was running there.

    ``cpu`` is the CPU a running task runs on, else the CPU a blocked task last ran on
    (``task_cpu()``); :attr:`running` says which. Running is one fact, the task was its CPU's
    current; whether the dump holds that CPU's registers is another: ``regs``, or ``None`` with
    ``lacks.registers`` saying so (its note was lost), and then its walk stops on that.
    ``task_struct``, ``ppid``, ``tgid``, ``kthread`` and a blocked task's ``cpu`` are
    ``None`` where the dump does not say.

    A plain slotted class rather than a dataclass (:class:`_Fields`), as :class:`Target` is: the compiled
    build makes it an extension type, whose fields compiled code reads without a lookup. ``stacks``,
    ``fgraph``, ``kretprobes`` and ``extra`` default to new empty ones.
    """

    __slots__ = _TASK_FIELDS
    FIELDS = _TASK_FIELDS

    pid: int | None
    comm: str
    state: str
    cpu: int | None
    regs: dict[str, int] | None
    context: dict[str, int] | None
    stacks: list[StackInfo]
    fgraph: list[FgraphEntry]
    kretprobes: list[KretprobeInstance]
    user_regs: dict[str, int] | None
    #: what the dump says beyond these fields (``switches``, a capture's ``note``), by the note's keys
    extra: dict[str, Any]
    #: what the dump lacks that a walk needs (a walk stops on it), else ``None``
    lacks: Lack | None
    #: the address of its ``task_struct``
    task_struct: int | None
    #: ``task->real_parent->tgid``, as ``ps`` and sysrq-t print it
    ppid: int | None
    #: ``task->tgid``: the pid of its thread group's leader
    tgid: int | None
    #: a kernel thread (``task->flags & PF_KTHREAD``)
    kthread: bool | None
    #: what the dump lacks of the return stack (``fgraph`` is then empty: it is read whole or not at all)
    fgraph_lacks: str | None
    #: what the dump lacks of the kretprobe/rethook list (``kretprobes`` holds the instances before it)
    kretprobes_lacks: str | None

    def __init__(self, pid: int | None, comm: str, state: str = "", cpu: int | None = None,
                 regs: dict[str, int] | None = None, context: dict[str, int] | None = None,
                 stacks: list[StackInfo] | None = None, fgraph: list[FgraphEntry] | None = None,
                 kretprobes: list[KretprobeInstance] | None = None, user_regs: dict[str, int] | None = None,
                 extra: dict[str, Any] | None = None, lacks: Lack | None = None, task_struct: int | None = None,
                 ppid: int | None = None, tgid: int | None = None, kthread: bool | None = None,
                 fgraph_lacks: str | None = None, kretprobes_lacks: str | None = None) -> None:
        self.pid = pid
        self.comm = comm
        self.state = state
        self.cpu = cpu
        self.regs = regs
        self.context = context
        self.stacks = [] if stacks is None else stacks
        self.fgraph = [] if fgraph is None else fgraph
        self.kretprobes = [] if kretprobes is None else kretprobes
        self.user_regs = user_regs
        self.extra = {} if extra is None else extra
        self.lacks = lacks
        self.task_struct = task_struct
        self.ppid = ppid
        self.tgid = tgid
        self.kthread = kthread
        self.fgraph_lacks = fgraph_lacks
        self.kretprobes_lacks = kretprobes_lacks

    def __copy__(self) -> "Task":
        return Task(*self._fields())

    @property
    def running(self) -> bool:
        """True for the task that was running on a CPU when the dump was taken (its ``cpu`` is that CPU), with
        that CPU's registers in ``regs`` or without them (``lacks.registers``); a walk starts from registers
        where ``regs is not None``."""
        return self.regs is not None or (self.lacks is not None and self.lacks.registers)

    @property
    def running_cpu(self) -> int | None:
        """:attr:`cpu` for a running task, ``None`` for a blocked one."""
        return self.cpu if self.running else None

    def describe(self) -> str:
        """``pid 12 (sh) on cpu1`` style text."""
        where = f" on cpu{self.running_cpu}" if self.running_cpu is not None else " blocked"
        pid = "?" if self.pid is None else str(self.pid)
        return f"pid {pid} ({self.comm}){where}"


@dataclass(frozen=True, slots=True)
class SavedRegs:
    """A blocked task's saved context: the registers the kernel's context switch left for it
    (:meth:`unwind.core.registry.ArchBackend.saved_regs`)."""

    #: register name -> value, in the order of the kernel's struct
    regs: dict[str, int]
    #: where the kernel keeps them, e.g. ``task_struct.thread.cpu_context``
    source: str
    #: registers of that context the dump does not hold (a dump's note may keep fewer), in order
    missing: tuple[str, ...] = ()

    @classmethod
    def of_context(cls, task: Task, names: tuple[str, ...], source: str) -> "SavedRegs | None":
        """The registers ``names`` of a blocked task's :attr:`Task.context` (``None`` for a running task)."""
        ctx = task.context
        if task.running or ctx is None:
            return None
        return cls({n: ctx[n] for n in names if n in ctx}, source, tuple(n for n in names if n not in ctx))


@dataclass(slots=True)
class Options:
    """How to walk: faithful or complete, with or without provenance, overrides."""

    #: recover what the kernel's walk drops where the dump proves it (``--complete``); each such frame is flagged
    complete: bool = False
    #: keep each frame's :class:`~unwind.core.frame.Provenance`: the rule and the words read (``--explain``)
    record: bool = False
    #: walk the user stack too (riscv, ``--user``)
    user: bool = False
    #: the kernel generation whose unwinder to follow (``6.1``, ``6.13``), instead of the dump's release
    generation: str | None = None
    #: the ORC format generation (x86-64, ``--orc-version``), refused where the image names another
    orc_version: str | None = None


#: :class:`Target`'s fields, in order
_TARGET_FIELDS = ("arch", "mem", "task", "release", "vmcoreinfo", "symbols", "image", "info", "options", "shared")


class Target(_Fields):
    """Everything one walk of one task reads.

    A plain slotted class rather than a dataclass (:class:`_Fields`): a walk makes one per task, and the
    compiled build (:mod:`unwind.accel`, ``target.pxd``) makes it an extension type.
    """

    __slots__ = _TARGET_FIELDS
    FIELDS = _TARGET_FIELDS

    arch: str
    mem: Memory
    task: Task
    release: str | None
    vmcoreinfo: Mapping[str, str]
    symbols: SymbolTable | None
    image: "Image | None"
    #: the dump's facts beyond its tasks (modules, symbol hints, what its note declares)
    info: DumpInfo
    options: Options
    #: what a backend derives once per dump, image and options (symbol addresses, layouts, the generation):
    #: :meth:`unwind.session.replay.Session.target` hands the same dict to every walk with equal options; a
    #: Target made on its own gets a dict of its own, so nothing is shared wrongly
    shared: dict[Hashable, Any]

    def __init__(self, arch: str, mem: Memory, task: Task, release: str | None = None,
                 vmcoreinfo: Mapping[str, str] | None = None, symbols: SymbolTable | None = None,
                 image: "Image | None" = None, info: DumpInfo | None = None, options: Options | None = None,
                 shared: dict[Hashable, Any] | None = None) -> None:
        self.arch = arch
        self.mem = mem
        self.task = task
        self.release = release
        self.vmcoreinfo = {} if vmcoreinfo is None else vmcoreinfo
        self.symbols = symbols
        self.image = image
        self.info = DumpInfo() if info is None else info
        self.options = Options() if options is None else options
        self.shared = {} if shared is None else shared

    def per_dump(self, key: Hashable, make: "Callable[[Target], Any]") -> Any:
        """``make(self)`` the first time ``key`` is asked for among the walks sharing :attr:`shared`."""
        try:
            return self.shared[key]
        except KeyError:
            value = self.shared[key] = make(self)
            return value

    def symbol_address(self, name: str) -> int | None:
        """A symbol's address from the image's symbols, else from the dump's symbol hints."""
        if self.symbols is not None:
            addr = self.symbols.address(name)
            if addr is not None:
                return addr
        return self.info.symbols.get(name)
