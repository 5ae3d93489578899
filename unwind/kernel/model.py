"""A stopped kernel read from its memory through BTF: tasks, CPUs, stacks, modules.

What drgn's and crash's task helpers do, for a memory image of the whole
kernel (a vmcore): every offset comes from the kernel's BTF, every address
from its symbols, so no generation is assumed. Lists are walked as the
kernel walks them (``list_for_each``), with cycle detection and a count
limit, since a hostile vmcore can hold any bytes. The per-arch parts (a
blocked task's saved context, the per-CPU stacks) are the arch's
``kernel`` hooks (``arch/<arch>/kernel.py``), which read through the
:class:`KernelReader` methods below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Iterator, NamedTuple, Protocol, TypeVar

from .btf import Btf, BtfError
from unwind.core.memory import MemoryFault
from unwind.formats.note_limits import MAX_MODULE_BYTES, MAX_TRAMPOLINE_BYTES
from unwind.core.dumpinfo import BpfSymbol, FtraceTrampoline, ModuleInfo, ModuleOrc, ModuleRegion
from unwind.core.target import FgraphEntry, KretprobeInstance

#: most tasks, threads, modules or list nodes any one walk accepts
MAX_TASKS = 1 << 16
MAX_MODULES = 4096
MAX_MODULE_SYMBOLS = 1 << 18
MAX_CPUS = 8192
MAX_FGRAPH_WORDS = 1 << 14
MAX_KRETPROBES = 1024
MAX_MODULE_ORCS = 1 << 20
#: include/linux/threads.h: pid_max is at most PID_MAX_LIMIT (4M on 64-bit), so no pid is above it
PID_MAX_LIMIT = 4 * 1024 * 1024
#: include/linux/kallsyms.h: a symbol name and its NUL
KSYM_NAME_LEN = 512

# include/linux/sched.h: the task state bits task_state_index() reads (stable 5.14 .. 7.x)
TASK_REPORT = 0x7F
TASK_IDLE = 0x402
TASK_RTLOCK_WAIT = 0x1000
TASK_FROZEN = 0x8000
TASK_UNINTERRUPTIBLE = 0x2
TASK_STATE_CHARS = "RSDTtXZPI"
#: include/linux/sched.h: task_struct.flags of a kernel thread (unchanged since 2.6)
PF_KTHREAD = 0x00200000


class KernelError(Exception):
    """The kernel's structures cannot be read; the message is one line."""


class KernelReader(Protocol):
    """What an arch's ``kernel`` hooks read through (a vmcore, or a live guest during capture)."""

    btf: Btf
    thread_size: int

    def read(self, addr: int, size: int) -> bytes: ...
    def read_u64(self, addr: int) -> int: ...
    def symbol(self, name: str) -> int | None: ...
    def var_size(self, name: str) -> int: ...
    def percpu_addr(self, name: str, cpu: int) -> int: ...


def btf_has(btf: Btf, struct: str, path: str) -> bool:
    """Does ``struct`` have the member ``path`` in this kernel's BTF?"""
    return btf.has_member(struct, path)


def field_int(btf: Btf, data: bytes, struct: str, path: str, signed: bool = False) -> int:
    """The integer member ``path`` of a ``struct`` whose bytes are ``data`` (offset and size from BTF)."""
    m = btf.member(struct, path)
    size = m.size or 8
    if m.offset + size > len(data):
        raise KernelError(f"{struct}.{path} lies past the {len(data)} bytes read")
    return int.from_bytes(data[m.offset:m.offset + size], "little", signed=signed)


#: INIT_TASK_DATA() (include/asm-generic/vmlinux.lds.h) ends init_stack at THREAD_SIZE:
#: ``__end_init_stack`` since v6.2, ``__end_init_task`` before
INIT_STACK_ENDS = ("__end_init_stack", "__end_init_task")


def thread_size(btf: Btf, symbol: Callable[[str], int | None]) -> int:
    """THREAD_SIZE: the extent of ``init_stack`` as the linker script lays it out, else ``sizeof(union thread_union)``.

    The symbols exist in every generation (6.1 names the end ``__end_init_task``);
    ``thread_union`` is in BTF only when some type refers to it (not in 6.1).
    """
    lo = symbol("init_stack")
    for end in INIT_STACK_ENDS:
        hi = symbol(end)
        if lo is not None and hi is not None and 0 < hi - lo <= 1 << 20 and (hi - lo) & (hi - lo - 1) == 0:
            return hi - lo
    if btf.has("thread_union", "union"):
        return btf.sizeof("thread_union")
    raise KernelError("cannot tell THREAD_SIZE: no init_stack/__end_init_stack/__end_init_task symbols, "
                      "no thread_union in BTF")


# __task_state_index() and task_index_to_char() (include/linux/sched.h)
def task_state_char(state: int, exit_state: int) -> str:
    """The letter ``ps`` and sysrq-t print for ``__state`` and ``exit_state``."""
    index = (state | exit_state) & TASK_REPORT
    if state & TASK_IDLE == TASK_IDLE:
        index = TASK_REPORT + 1
    if state & (TASK_RTLOCK_WAIT | TASK_FROZEN):
        index = TASK_UNINTERRUPTIBLE
    return TASK_STATE_CHARS[index.bit_length()] if index.bit_length() < len(TASK_STATE_CHARS) else "?"


@dataclass(slots=True)
class KernelTask:
    """One ``task_struct`` as ``ps`` shows it, with what a walk of it needs."""

    addr: int
    pid: int
    tgid: int
    comm: str
    state: str
    stack: int
    on_cpu: int
    #: ``thread_info.cpu`` (or ``task_struct.cpu``): the CPU it last ran on; ``None`` past ``NR_CPUS``
    cpu: int | None
    switches: int
    #: the CPU it is running on at the stop (``rq->curr``), else ``None``
    running_on: int | None = None
    #: the idle task of a CPU (from ``rq->idle``, not on the task list)
    idle: bool = False
    data: bytes = b""
    #: the members the dump lacks (read as zeros in ``data``), each ``member at address: why``
    missing: tuple[str, ...] = ()
    #: ``real_parent->tgid`` (0 once the task is no longer ``pid_alive()``), ``None`` when unreadable
    ppid: int | None = None
    #: ``flags & PF_KTHREAD``, ``None`` when BTF has no ``flags``
    kthread: bool | None = None

    def lacks(self, members: Iterable[str]) -> str | None:
        """The first of ``members`` (in their order) the dump lacks, as a sentence (``None``: all were read)."""
        by_member = {m.split(" ", 1)[0]: m for m in self.missing}
        return next((by_member[m] for m in members if m in by_member), None)


@dataclass(frozen=True, slots=True)
class LostTask:
    """A ``task_struct`` some route of the kernel reaches whose pid or comm cannot be read."""

    addr: int
    #: the member, its address and why it is unreadable
    why: str


_Entry = TypeVar("_Entry")


class ListRead(NamedTuple, Generic[_Entry]):
    """A task's list as the dump holds it: the entries read, and what the dump lacks of the rest."""

    entries: list[_Entry]
    #: where the read stopped and why (``None``: the whole list was read)
    lacks: str | None


class PerCpuUnread(KernelError):
    """A per-CPU variable cannot be found: the dump lacks ``__per_cpu_offset`` (:attr:`Kernel.per_cpu_unread`)."""


class _Cut(Exception):
    """A walk of a ring ended before its head; the message says where and why."""


class Kernel:
    """The kernel in ``mem``: reads through BTF and symbols, walks its lists with bounds.

    ``mem`` is any reader with ``read``/``read_u64`` raising
    :class:`~unwind.core.memory.MemoryFault`; ``symbol`` gives runtime addresses
    (KASLR applied); ``context_members`` are the ``task_struct`` members the
    arch's saved context is in; ``warnings`` collects what the walks had to skip.
    """

    def __init__(self, mem: Any, btf: Btf, symbol: Callable[[str], int | None],
                 context_members: tuple[str, ...] = ()) -> None:
        self.mem = mem
        #: the task_struct members the arch's saved context lives in (its ``CONTEXT_MEMBERS``)
        self.context_members = context_members
        self.btf = btf
        self._symbol = symbol
        self.warnings: list[str] = []
        #: the ``task_struct``\ s :meth:`tasks` reached but could not list (no pid or comm)
        self.lost_tasks: list[LostTask] = []
        #: CPU -> why :meth:`tasks` could not read its runqueue
        self.unread_runqueues: dict[int, str] = {}
        self._mem_names: dict[int, str] | None = None
        self._tsize = self._sizeof("task_struct")
        self.thread_size = self._thread_size()
        #: why ``__per_cpu_offset`` could not be read (a dump cut before it), else ``None``
        self.per_cpu_unread: str | None = None
        self.per_cpu_offset = self._per_cpu_offsets()

    # -- the KernelReader surface -------------------------------------------
    def read(self, addr: int, size: int) -> bytes:
        """Bytes of kernel memory (MemoryFault when not in the dump)."""
        return self.mem.read(addr, size)

    def read_u64(self, addr: int) -> int:
        """A 64-bit word of kernel memory."""
        return self.mem.read_u64(addr)

    def read_u32(self, addr: int) -> int:
        """A 32-bit word of kernel memory."""
        return int.from_bytes(self.mem.read(addr, 4), "little")

    def readable(self, addr: int, size: int = 8) -> bool:
        """Can ``size`` bytes at ``addr`` be read?"""
        try:
            self.mem.read(addr, size)
            return True
        except MemoryFault:
            return False

    def symbol(self, name: str) -> int | None:
        """The runtime address of a kernel symbol, or ``None``."""
        return self._symbol(name)

    def require(self, name: str) -> int:
        """The runtime address of a symbol the walk cannot do without."""
        addr = self._symbol(name)
        if addr is None:
            raise KernelError(f"the kernel image has no symbol {name}")
        return addr

    def var_size(self, name: str) -> int:
        """The size of a global or per-CPU variable from its BTF ``VAR`` (0 when BTF has none)."""
        try:
            return self.btf.sizeof_id(self.btf.type(self.btf.find(name, "var")).size_or_type)
        except BtfError:
            return 0

    # per_cpu_ptr() (include/linux/percpu-defs.h): &var + __per_cpu_offset[cpu]
    def percpu_addr(self, name: str, cpu: int) -> int:
        """The address of per-CPU variable ``name`` on ``cpu``."""
        if self.per_cpu_unread is not None:
            raise PerCpuUnread(f"per-CPU offsets unread ({self.per_cpu_unread})")
        if not 0 <= cpu < len(self.per_cpu_offset):
            raise KernelError(f"cpu{cpu} is not below nr_cpu_ids ({len(self.per_cpu_offset)})")
        return (self.require(name) + self.per_cpu_offset[cpu]) & (2**64 - 1)

    # -- layouts -------------------------------------------------------------
    def _sizeof(self, struct: str) -> int:
        try:
            return self.btf.sizeof(struct)
        except BtfError as e:
            raise KernelError(f"kernel BTF: {e}") from None

    def has(self, struct: str, path: str) -> bool:
        """Does this kernel's ``struct`` have ``path``?"""
        return btf_has(self.btf, struct, path)

    def offsetof(self, struct: str, path: str) -> int:
        """``offsetof()`` from BTF, as a :class:`KernelError` when missing."""
        try:
            return self.btf.offsetof(struct, path)
        except BtfError as e:
            raise KernelError(f"kernel BTF: {e}") from None

    def _thread_size(self) -> int:
        """THREAD_SIZE of this kernel (see :func:`thread_size`)."""
        return thread_size(self.btf, self._symbol)

    def _per_cpu_offsets(self) -> list[int]:
        """``__per_cpu_offset[0 .. nr_cpu_ids)`` (one zero offset on a kernel built without SMP); none, with
        :attr:`per_cpu_unread` saying why, when the dump lacks them (every per-CPU read then fails, saying so)."""
        base = self._symbol("__per_cpu_offset")
        if base is None:
            return [0]
        nr = self._symbol("nr_cpu_ids")
        n = self.var_size("__per_cpu_offset") // 8 or MAX_CPUS
        what = "nr_cpu_ids"
        try:
            if nr is not None:
                n = min(n, self.read_u32(nr))
            what = "__per_cpu_offset"
            raw = self.read(base, 8 * n)
        except MemoryFault as e:
            self.per_cpu_unread = f"{what}: {e}"
            self.warnings.append(f"per-CPU offsets unread ({self.per_cpu_unread}): runqueues, per-CPU stacks "
                                 "and each CPU's current are not read")
            return []
        if not 0 < n <= MAX_CPUS:
            raise KernelError(f"nr_cpu_ids is {n}: not a kernel this reader trusts")
        return [int.from_bytes(raw[i * 8:i * 8 + 8], "little") for i in range(n)]

    @property
    def nr_cpus(self) -> int:
        """``nr_cpu_ids`` (0 when :attr:`per_cpu_unread`)."""
        return len(self.per_cpu_offset)

    # cpumask_test_cpu(cpu, cpu_online_mask)
    def online_cpus(self) -> list[int]:
        """The CPUs set in ``__cpu_online_mask`` (all possible ones when it is unreadable)."""
        mask = self._symbol("__cpu_online_mask")
        if mask is None:
            return list(range(self.nr_cpus))
        try:
            raw = self.read(mask, (self.nr_cpus + 63) // 64 * 8)
        except MemoryFault:
            return list(range(self.nr_cpus))
        bits = int.from_bytes(raw, "little")
        return [c for c in range(self.nr_cpus) if bits >> c & 1]

    # -- lists ---------------------------------------------------------------
    # list_for_each() (include/linux/list.h)
    def list_for_each(self, head: int, what: str, limit: int) -> Iterator[int]:
        """The nodes of the ``list_head`` ring at ``head``; a cycle or ``limit`` ends the walk with a warning."""
        seen: set[int] = set()
        node = self.read_u64(head)
        while node != head:
            if node in seen:
                self.warnings.append(f"{what}: the list loops back to {node:#x} without reaching its head")
                return
            if len(seen) >= limit:
                self.warnings.append(f"{what}: more than {limit} entries; the rest is not read")
                return
            seen.add(node)
            yield node
            node = self.read_u64(node)

    # -- tasks ---------------------------------------------------------------
    #: the task_struct members read for every task (each generation's names; absent ones are skipped)
    TASK_MEMBERS = ("pid", "tgid", "comm", "__state", "state", "exit_state", "stack", "on_cpu", "thread_info.cpu",
                    "cpu", "nvcsw", "nivcsw", "tasks", "signal", "thread_node", "thread_group", "ret_stack",
                    "curr_ret_stack", "rethooks", "kretprobe_instances", "flags", "real_parent", "thread_pid")

    def read_members(self, addr: int, struct: str, paths: Iterable[str]) -> bytes:
        """``struct`` at ``addr`` with only the members ``paths`` read (the rest zero): a struct that
        straddles a page the dump left out still gives the members that are in it."""
        data, missing = self.read_some_members(addr, struct, paths)
        if missing:
            raise missing[0][1]
        return data

    def read_some_members(self, addr: int, struct: str,
                          paths: Iterable[str]) -> tuple[bytes, list[tuple[str, MemoryFault]]]:
        """Like :meth:`read_members`, but a member the dump lacks is left zero and returned with its fault."""
        buf = bytearray(self._sizeof(struct))
        missing: list[tuple[str, MemoryFault]] = []
        for path in paths:
            if not self.has(struct, path):
                continue
            m = self.btf.member(struct, path)
            size = m.size or 8
            try:
                buf[m.offset:m.offset + size] = self.read(addr + m.offset, size)
            except MemoryFault as e:
                missing.append((path, e))
        return bytes(buf), missing

    #: what ``ps`` cannot list a task without
    TASK_NAMES = ("pid", "comm")
    #: the members whose loss leaves the state letter unknown
    STATE_MEMBERS = ("__state", "state", "exit_state")

    def task(self, addr: int) -> KernelTask:
        """The ``task_struct`` at ``addr``, with the members the dump lacks named in ``missing``
        (:class:`KernelError` when its pid or comm is among them: there is no task to list)."""
        data, faults = self.read_some_members(addr, "task_struct", self.TASK_MEMBERS + self.context_members)
        missing = tuple(f"{path} at {addr + self.btf.offsetof('task_struct', path):#x}: {e}" for path, e in faults)
        lost = [m for m in missing if m.split(" ", 1)[0] in self.TASK_NAMES]
        if lost:
            raise KernelError(f"task_struct.{lost[0]}")
        b = self.btf

        def u(path: str) -> int:
            return field_int(b, data, "task_struct", path)

        comm_m = b.member("task_struct", "comm")
        comm = data[comm_m.offset:comm_m.offset + comm_m.size].split(b"\0")[0].decode("utf-8", "replace")
        state = u("__state") if self.has("task_struct", "__state") else u("state")
        cpu_path = "thread_info.cpu" if self.has("task_struct", "thread_info.cpu") else "cpu"
        if u("pid") > PID_MAX_LIMIT:  # alloc_pid() hands out pids below pid_max only
            raise KernelError(f"pid {u('pid')} is past PID_MAX_LIMIT ({PID_MAX_LIMIT}): not a task")
        cpu = u(cpu_path) if self.has("task_struct", cpu_path) else 0
        letter = task_state_char(state & 0xFFFFFFFF, u("exit_state"))
        unread = {path for path, _ in faults}
        if unread & set(self.STATE_MEMBERS):
            letter = "?"
        return KernelTask(addr=addr, pid=u("pid"), tgid=u("tgid"), comm=comm, state=letter, stack=u("stack"),
                          on_cpu=u("on_cpu"), cpu=cpu if cpu < MAX_CPUS else None,  # set_task_cpu(): a possible CPU
                          switches=u("nvcsw") + u("nivcsw"), data=data, missing=missing,
                          ppid=None if {"real_parent", "thread_pid"} & unread else self._ppid(data),
                          kthread=None if "flags" in unread or not self.has("task_struct", "flags")
                          else bool(u("flags") & PF_KTHREAD))

    # task_tgid_nr_ns(rcu_dereference(p->real_parent)) of do_task_stat(), behind pid_alive(p)
    def _ppid(self, data: bytes) -> int | None:
        """The parent's tgid, as ``ps`` shows it: 0 for a task no longer ``pid_alive()``."""
        if not self.has("task_struct", "real_parent"):
            return None
        if self.has("task_struct", "thread_pid") and not field_int(self.btf, data, "task_struct", "thread_pid"):
            return 0
        parent = field_int(self.btf, data, "task_struct", "real_parent")
        tgid = self.btf.member("task_struct", "tgid")
        try:
            raw = self.read(parent + tgid.offset, tgid.size or 4)
        except MemoryFault:
            return None
        ppid = int.from_bytes(raw, "little")
        return ppid if ppid <= PID_MAX_LIMIT else None  # alloc_pid() hands out pids below pid_max only

    # list_for_each() and list_for_each_prev() (include/linux/list.h): a ring read both ways round
    def ring(self, head: int, what: str, limit: int) -> Iterator[int]:
        """The nodes of the ``list_head`` ring at ``head``, forwards through ``next``.

        When the forward walk is cut (a node the dump lacks, a loop, the
        count ``limit``), the ring is read backwards through ``prev`` from the
        head up to the nodes already seen, so one bad node loses only itself.
        """
        seen: set[int] = set()
        try:
            yield from self._follow(head, 0, seen, limit)
            return
        except _Cut as e:
            self.warnings.append(f"{what}: {e}; read backwards from its head")
        try:
            yield from self._follow(head, self.offsetof("list_head", "prev"), seen, limit)
        except _Cut as e:
            self.warnings.append(f"{what} backwards: {e}")

    def _follow(self, head: int, link: int, seen: set[int], limit: int) -> Iterator[int]:
        """The nodes from ``head`` through the pointer at ``link`` (``next``'s offset 0, or ``prev``'s) until the head,
        or (backwards) a node ``seen`` already; :class:`_Cut` says why a walk ended anywhere else."""
        try:
            node = self.read_u64(head + link)
            while node != head:
                if node in seen:
                    if link:
                        return  # the backward walk meets the forward one
                    raise _Cut(f"the list loops back to {node:#x} without reaching its head")
                if len(seen) >= limit:
                    raise _Cut(f"more than {limit} entries; the rest is not read")
                seen.add(node)
                yield node
                node = self.read_u64(node + link)
        except MemoryFault as e:
            raise _Cut(f"cut at a node the dump lacks ({e})") from None

    # for_each_process() (include/linux/sched/signal.h)
    def processes(self) -> Iterator[int]:
        """``init_task`` and every task on ``init_task.tasks`` (both ways round: :meth:`ring`)."""
        init = self.require("init_task")
        yield init
        off = self.offsetof("task_struct", "tasks")
        for node in self.ring(init + off, "init_task.tasks", MAX_TASKS):
            yield node - off

    # for_each_thread() (include/linux/sched/signal.h), by generation
    def threads(self, task: KernelTask) -> Iterator[int]:
        """The threads of ``task``'s group: ``signal->thread_head`` (3.14+), else the ``thread_group`` ring."""
        if self.has("signal_struct", "thread_head") and self.has("task_struct", "thread_node"):
            signal = field_int(self.btf, task.data, "task_struct", "signal")
            if not signal or task.lacks(("signal",)):
                return
            off = self.offsetof("task_struct", "thread_node")
            head = signal + self.offsetof("signal_struct", "thread_head")
            for node in self.ring(head, f"threads of task {task.addr:#x}", MAX_TASKS):
                yield node - off
            return
        off = self.offsetof("task_struct", "thread_group")
        for node in self.ring(task.addr + off, f"thread_group of task {task.addr:#x}", MAX_TASKS):
            yield node - off

    def _thread_group(self, task: KernelTask) -> int:
        """What names ``task``'s thread group once: ``signal`` (or the task itself, with ``thread_group``)."""
        if self.has("signal_struct", "thread_head") and self.has("task_struct", "thread_node"):
            return field_int(self.btf, task.data, "task_struct", "signal")
        return task.addr

    # idr_for_each(&init_pid_ns.idr) (lib/idr.c) then pid_task(pid, PIDTYPE_PID) (kernel/pid.c)
    def pid_tasks(self) -> Iterator[int]:
        """Every task the pid namespace's IDR names: ``struct pid`` -> ``tasks[PIDTYPE_PID].first``.

        The IDR is an XArray (a radix tree) of ``struct pid *``; a node the
        dump lacks loses only the pids under it.
        """
        ns = self._symbol("init_pid_ns")
        if ns is None or not (self.has("pid_namespace", "idr.idr_rt.xa_head") and self.has("xa_node", "slots")
                              and self.has("pid", "tasks") and self.has("task_struct", "pid_links")):
            return
        try:
            pidtype = self.btf.enum_value("PIDTYPE_PID")
            first = self.offsetof("pid", f"tasks[{pidtype}]")
            link = self.offsetof("task_struct", f"pid_links[{pidtype}]")
        except BtfError:
            return
        for pid in self._xa_entries(ns + self.offsetof("pid_namespace", "idr.idr_rt"), "init_pid_ns.idr"):
            try:
                node = self.read_u64(pid + first)
            except MemoryFault as e:
                self.warnings.append(f"struct pid at {pid:#x} unreadable: {e}")
                continue
            if node:
                yield node - link

    # xa_for_each() (include/linux/xarray.h, lib/xarray.c)
    def _xa_entries(self, xa: int, what: str) -> Iterator[int]:
        """The pointer entries of the XArray at ``xa``, depth first; internal entries (nodes, siblings,
        the zero and retry entries) and value entries are not pointers and are skipped."""
        slots_m = self.btf.member("xa_node", "slots")
        _, nslots = self.btf.array(slots_m.type_id)
        try:
            todo = [self.read_u64(xa + self.offsetof("xarray", "xa_head"))]
        except (MemoryFault, BtfError) as e:
            self.warnings.append(f"{what}: its head is unreadable: {e}")
            return
        seen: set[int] = set()
        entries = 0
        while todo:
            entry = todo.pop()
            if entry & 3 == 2 and entry > 4096:  # xa_is_node()
                node = entry - 2
                if node in seen or len(seen) >= MAX_TASKS:
                    self.warnings.append(f"{what}: node {node:#x} seen twice or past {MAX_TASKS} nodes: not read")
                    continue
                seen.add(node)
                try:
                    raw = self.read(node + slots_m.offset, 8 * nslots)
                except MemoryFault as e:
                    self.warnings.append(f"{what}: node {node:#x} unreadable: {e}")
                    continue
                todo += reversed([int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)])
            elif entry and entry & 3 == 0:  # a pointer (xa_is_value() and xa_is_internal() are not)
                entries += 1
                if entries > MAX_TASKS:
                    self.warnings.append(f"{what}: more than {MAX_TASKS} entries; the rest is not read")
                    return
                yield entry

    # per_cpu(runqueues, cpu).curr / .idle (kernel/sched/sched.h)
    def rq_task(self, cpu: int, member: str) -> int:
        """``cpu_rq(cpu)->curr`` or ``->idle``."""
        return self.read_u64(self.percpu_addr("runqueues", cpu) + self.offsetof("rq", member))

    def tasks(self, current: dict[int, int] | None = None, cpus: Iterable[int] = (),
              note_pids: dict[int, int] | None = None) -> list[KernelTask]:
        """Every task, once, reached by every route the kernel keeps: each CPU's idle task, the process
        list (both ways round), each thread group, the pid IDR, each CPU's current.

        ``running_on`` is set from ``current`` (CPU -> task, the arch's own
        ``current``), else from ``rq->curr``, for the online CPUs and ``cpus``
        (those that saved registers). Where neither can be read,
        ``note_pids`` (CPU -> the pid its crash note names) places the task.
        A ``task_struct`` whose pid or comm cannot be read is in
        :attr:`lost_tasks`, one line each.
        """
        running: dict[int, int] = {}
        idle: list[int] = []
        unread: list[int] = []
        # a CPU the crash IPI stopped has left __cpu_online_mask (arm64 and riscv ipi_cpu_crash_stop() call
        # set_cpu_online(cpu, false) after crash_save_cpu()), yet its registers and its current are in the dump
        for cpu in sorted(set(self.online_cpus()) | set(cpus) | set(current or {})):
            try:
                curr = (current or {}).get(cpu) or self.rq_task(cpu, "curr")
                running.setdefault(curr, cpu)
            except (MemoryFault, KernelError) as e:
                if not isinstance(e, PerCpuUnread):  # said once, when the offsets were read
                    self.warnings.append(f"cpu{cpu}: cannot read its runqueue: {e}")
                self.unread_runqueues[cpu] = str(e)
                unread.append(cpu)
            try:
                idle.append(self.rq_task(cpu, "idle"))
            except (MemoryFault, KernelError):
                pass
        out: list[KernelTask] = []
        found: dict[int, KernelTask | None] = {}
        groups: set[int] = set()
        self.lost_tasks = []

        def add(addr: int, is_idle: bool) -> KernelTask | None:
            if addr in found or addr <= 0 or len(found) >= MAX_TASKS:  # a node below its member's offset is no task
                return found.get(addr)
            try:
                t = found[addr] = self.task(addr)
            except (MemoryFault, KernelError, BtfError) as e:
                found[addr] = None
                self.lost_tasks.append(LostTask(addr, str(e)))
                return None
            t.running_on = running.get(addr)
            t.idle = is_idle
            out.append(t)
            return t

        def add_group(t: KernelTask | None) -> None:
            if t is None or self._thread_group(t) in groups or t.addr in groups:
                return
            groups.add(self._thread_group(t))
            try:
                for thread in self.threads(t):
                    groups.add(thread)  # a thread_group ring has no head: each of its tasks names it
                    add(thread, False)
            except (MemoryFault, KernelError) as e:
                self.warnings.append(f"threads of task {t.addr:#x} cut short: {e}")

        for addr in idle:
            add(addr, True)
        for leader in self.processes():
            add_group(add(leader, leader in idle))
        for addr in self.pid_tasks():
            add_group(add(addr, False))
        for addr in running:  # a task on a CPU but on no list (exiting, or mid-fork)
            add(addr, False)
        if len(found) >= MAX_TASKS:
            self.warnings.append(f"more than {MAX_TASKS} tasks; the rest is not read")
        self._place_by_note(out, unread, note_pids or {})
        return out

    # crash_save_cpu() (kernel/crash_core.c) records the pid of each CPU's current in its note
    def _place_by_note(self, tasks: list[KernelTask], cpus: list[int], note_pids: dict[int, int]) -> None:
        """Put on each CPU of ``cpus`` (whose runqueue is unreadable) the task its note's pid names."""
        by_pid: dict[int, KernelTask] = {}
        for t in tasks:
            if t.running_on is None and (t.pid or t.addr == self._symbol("init_task")):
                by_pid.setdefault(t.pid, t)
        for cpu in cpus:
            pid = note_pids.get(cpu)
            if pid is None or (pid == 0 and cpu != 0):  # another CPU's idle task is on no list
                continue
            t = by_pid.pop(pid, None)
            if t is None:
                self.warnings.append(f"cpu{cpu}: its note names pid {pid}, which no list of the kernel holds")
                continue
            t.running_on = cpu
            self.warnings.append(f"cpu{cpu}: pid {pid} ({t.comm}) placed there by the pid its crash note records")

    # -- function graph and kretprobes -----------------------------------------
    def fgraph(self, task: KernelTask) -> ListRead[FgraphEntry]:
        """The task's function-graph return stack, bottom to top (``ftrace_graph_get_ret_stack()``); read
        whole or not at all."""
        if not (self.has("task_struct", "ret_stack") and self.has("task_struct", "curr_ret_stack")):
            return ListRead([], None)
        b = self.btf
        ptr = field_int(b, task.data, "task_struct", "ret_stack")
        curr = field_int(b, task.data, "task_struct", "curr_ret_stack", signed=True)
        if not ptr or curr < 0:
            return ListRead([], None)
        fields = [n for n in ("ret", "func", "retp", "fp") if self.has("ftrace_ret_stack", n)]
        size = self._sizeof("ftrace_ret_stack")
        try:
            if self._ret_stack_is_words():
                return ListRead(self._fgraph_words(ptr, curr, size, fields), None)
            return ListRead(self._fgraph_array(ptr, curr, size, fields), None)
        except (MemoryFault, KernelError, BtfError) as e:
            self.warnings.append(f"pid {task.pid}: fgraph ret_stack unreadable: {e}")
            return ListRead([], f"task->ret_stack {ptr:#x}: {e}")

    def ret_stack_span(self, task: KernelTask) -> tuple[int, int] | None:
        """``(address, bytes)`` of the part of ``task->ret_stack`` in use: what :meth:`fgraph` reads
        (``curr_ret_stack`` words since 6.11, ``curr_ret_stack + 1`` entries before)."""
        if not (self.has("task_struct", "ret_stack") and self.has("task_struct", "curr_ret_stack")):
            return None
        ptr = field_int(self.btf, task.data, "task_struct", "ret_stack")
        curr = field_int(self.btf, task.data, "task_struct", "curr_ret_stack", signed=True)
        if not ptr or curr < 0:
            return None
        if self._ret_stack_is_words():
            return (ptr, curr * 8) if curr else None
        return ptr, (curr + 1) * self._sizeof("ftrace_ret_stack")

    def _ret_stack_is_words(self) -> bool:
        """6.11+ keeps ``unsigned long *ret_stack`` (tagged words); before, an array of ``ftrace_ret_stack``."""
        m = self.btf.member("task_struct", "ret_stack")
        return self.btf.kind(self.btf.pointee(m.type_id)) != "struct"

    def _entry(self, data: bytes, fields: list[str]) -> FgraphEntry:
        v = {n: field_int(self.btf, data, "ftrace_ret_stack", n) for n in fields}
        return FgraphEntry(v.get("ret", 0), v.get("retp", 0), v.get("func", 0), v.get("fp", 0))

    # ftrace_graph_get_ret_stack() of 6.1: ret_stack[0 .. curr_ret_stack]
    def _fgraph_array(self, ptr: int, curr: int, size: int, fields: list[str]) -> list[FgraphEntry]:
        n = curr + 1
        if n * size > MAX_FGRAPH_WORDS * 8:
            raise MemoryFault(ptr, n * size)
        raw = self.read(ptr, n * size)
        return [self._entry(raw[i * size:(i + 1) * size], fields) for i in range(n)]

    # get_ret_stack() of 6.11+ (kernel/trace/fgraph.c): each frame's top word holds its offset in words
    def _fgraph_words(self, ptr: int, curr: int, size: int, fields: list[str]) -> list[FgraphEntry]:
        if curr > MAX_FGRAPH_WORDS:
            raise MemoryFault(ptr, curr * 8)
        raw = self.read(ptr, curr * 8)
        words = [int.from_bytes(raw[i * 8:i * 8 + 8], "little") for i in range(curr)]
        out = []
        offset = curr
        while offset > 0:
            offset -= 1
            offs = words[offset] & 0x3FF  # FGRAPH_FRAME_OFFSET_MASK
            if offs <= 0 or offs > offset:  # the kernel's WARN_ON_ONCE: no frame here
                break
            offset -= offs
            out.append(self._entry(raw[offset * 8:offset * 8 + size], fields))
        out.reverse()
        return out

    def kretprobes(self, task: KernelTask) -> ListRead[KretprobeInstance]:
        """The task's kretprobe (``kretprobe_instances``) or rethook (``rethooks``) instances, newest first:
        those before the first node the dump lacks."""
        b = self.btf
        for head, node_t, ret_f, fp_f in (("kretprobe_instances", "kretprobe_instance", "ret_addr", "fp"),
                                          ("rethooks", "rethook_node", "ret_addr", "frame")):
            if not all(btf_has(b, st, f) for st, f in (("task_struct", head), (node_t, "llist"),
                                                        (node_t, ret_f), (node_t, fp_f))):
                continue
            node = field_int(b, task.data, "task_struct", head)
            llist, ro, fo = (b.offsetof(node_t, f) for f in ("llist", ret_f, fp_f))
            out: list[KretprobeInstance] = []
            seen: set[int] = set()
            try:
                while node and node not in seen and len(out) < MAX_KRETPROBES:
                    seen.add(node)
                    base = node - llist
                    out.append(KretprobeInstance(self.read_u64(base + ro), self.read_u64(base + fo)))
                    node = self.read_u64(node)
            except (MemoryFault, KernelError) as e:
                self.warnings.append(f"pid {task.pid}: {head} list unreadable: {e}")
                return ListRead(out, f"task->{head} node {node:#x}: {e}")
            return ListRead(out, None)
        return ListRead([], None)

    # bpf_ksym_add() keeps every JITed program and trampoline on bpf_kallsyms (kernel/bpf/core.c)
    def bpf_symbols(self) -> list[BpfSymbol]:
        """Each ``struct bpf_ksym`` on ``bpf_kallsyms`` (``__bpf_address_lookup()``)."""
        head = self._symbol("bpf_kallsyms")
        if head is None or not self.has("bpf_ksym", "lnode"):
            return []
        b = self.btf
        off = self.offsetof("bpf_ksym", "lnode")
        out = []
        try:
            for node in self.list_for_each(head, "bpf_kallsyms", MAX_MODULE_SYMBOLS):
                data = self.read_members(node - off, "bpf_ksym", ("start", "end", "name"))
                name_m = b.member("bpf_ksym", "name")
                name = data[name_m.offset:name_m.offset + name_m.size].split(b"\0")[0].decode("utf-8", "replace")
                start, end = field_int(b, data, "bpf_ksym", "start"), field_int(b, data, "bpf_ksym", "end")
                if start < end and name:
                    out.append(BpfSymbol(start, end, name))
        except MemoryFault as e:
            self.warnings.append(f"bpf_kallsyms cut short: {e}")
        return out

    # -- modules -------------------------------------------------------------
    def modules(self) -> list[ModuleInfo]:
        """Every module on the ``modules`` list with its regions, kallsyms and ORC tables."""
        head = self._symbol("modules")
        if head is None or not self.has("module", "list"):
            return []
        off = self.offsetof("module", "list")
        out = []
        try:
            for node in self.list_for_each(head, "modules", MAX_MODULES):
                try:
                    out.append(self.module(node - off))
                except (MemoryFault, KernelError, BtfError) as e:
                    self.warnings.append(f"module at {node - off:#x} unreadable: {e}")
        except MemoryFault as e:
            self.warnings.append(f"the module list is cut short: {e}")
        return out

    def module(self, addr: int) -> ModuleInfo:
        """The ``struct module`` at ``addr``."""
        data = self.read(addr, self._sizeof("module"))
        b = self.btf
        name_m = b.member("module", "name")
        name = data[name_m.offset:name_m.offset + name_m.size].split(b"\0")[0].decode("utf-8", "replace")
        regions, symbols = tuple(self._module_regions(data, name)), tuple(self._module_symbols(data, name))
        orc = None
        if self.has("module", "arch.orc_unwind_ip"):
            ip, entries, n = (field_int(b, data, "module", f"arch.{k}")
                              for k in ("orc_unwind_ip", "orc_unwind", "num_orcs"))
            if n > MAX_MODULE_ORCS:
                self.warnings.append(f"module {name}: {n} ORC entries; its ORC tables are not read")
            elif n and ip and entries:
                orc = ModuleOrc(ip, entries, n, self._sizeof("orc_entry"))
        return ModuleInfo(name, addr, field_int(b, data, "module", "state"), regions, symbols, orc)

    def _module_regions(self, data: bytes, name: str) -> list[ModuleRegion]:
        """``mem[type].{base,size}`` (6.4+), else ``core_layout``/``init_layout`` (4.5-6.3)."""
        b = self.btf
        fields = []
        if self.has("module", "mem"):
            names = self._mod_mem_names()
            count = b.member("module", "mem").size // max(1, self._sizeof("module_memory"))
            fields = [(names.get(i, f"mem{i}"), f"mem[{i}]") for i in range(count)]
        else:
            fields = [(kind, layout) for layout, kind in (("core_layout", "text"), ("init_layout", "init_text"))
                      if self.has("module", f"{layout}.base")]
        out = []
        for kind, path in fields:
            base = field_int(b, data, "module", f"{path}.base")
            size = field_int(b, data, "module", f"{path}.size")
            if base and size:
                out.append(ModuleRegion(kind, base, module_region(name, kind, base, size)))
        return out

    def _mod_mem_names(self) -> dict[int, str]:
        """``enum mod_mem_type`` values to names (``text``, ``data``, ..., ``init_text``), once."""
        if self._mem_names is None:
            self._mem_names = {}
            for enum in ("MOD_TEXT", "MOD_DATA", "MOD_RODATA", "MOD_RO_AFTER_INIT", "MOD_INIT_TEXT",
                         "MOD_INIT_DATA", "MOD_INIT_RODATA"):
                try:
                    self._mem_names[self.btf.enum_value(enum)] = enum[4:].lower()
                except BtfError:
                    pass
        return self._mem_names

    def _module_symbols(self, data: bytes, name: str) -> list[tuple[int, str]]:
        """``mod->kallsyms``: named, defined symbols of ``symtab`` (``find_kallsyms_symbol()``'s candidates)."""
        b = self.btf
        if not self.has("module", "kallsyms") or not self.has("mod_kallsyms", "symtab"):
            return []
        ks = field_int(b, data, "module", "kallsyms")
        if not ks:
            return []
        kd = self.read(ks, self._sizeof("mod_kallsyms"))
        symtab = field_int(b, kd, "mod_kallsyms", "symtab")
        num = field_int(b, kd, "mod_kallsyms", "num_symtab")
        strtab = field_int(b, kd, "mod_kallsyms", "strtab")
        if num > MAX_MODULE_SYMBOLS:
            raise KernelError(f"module {name}: {num} symbols")
        sym_size = self._sizeof("elf64_sym") if self._has_type("elf64_sym") else 24
        raw = self.read(symtab, num * sym_size) if num else b""
        if sym_size < ELF64_SYM_HEAD or sym_size % 8:
            raise KernelError(f"module {name}: elf64_sym is {sym_size} bytes")
        # st_name (u32 at 0), st_shndx (u16 at 6), st_value (u64 at 8) of entries 1.. (0 is the null symbol),
        # each field read as a column; an SHN_UNDEF (0) entry is no candidate
        view = memoryview(raw)
        st_name = view.cast("I")[sym_size // 4::sym_size // 4].tolist()
        st_shndx = view.cast("H")[sym_size // 2 + 3::sym_size // 2].tolist()
        st_value = view.cast("Q")[sym_size // 8 + 1::sym_size // 8].tolist()
        names_needed = [(value, name) for name, shndx, value in zip(st_name, st_shndx, st_value) if shndx]
        if not names_needed:
            return []
        end = max(off for _, off in names_needed) + 1
        blob = self._read_string_table(strtab, end)
        out = []
        size = len(blob)
        for value, off in names_needed:
            if off >= size or blob.startswith(_MAPPING_SYMBOL, off):
                continue
            nul = blob.find(b"\0", off)
            name = blob[off:nul if nul >= 0 else size].decode("utf-8", "replace")
            if name:
                out.append((value, name[:KSYM_NAME_LEN - 1]))  # kallsyms_lookup(): strscpy(.., KSYM_NAME_LEN)
        out.sort()
        return out

    def _read_string_table(self, addr: int, upto: int) -> bytes:
        """``strtab`` up to ``upto`` plus one name's length (read a page at a time, stopping at a fault)."""
        want = upto + 512
        out = bytearray()
        while len(out) < want:
            step = min(4096 - (addr + len(out)) % 4096, want - len(out))
            try:
                out += self.read(addr + len(out), step)
            except MemoryFault:
                break
        return bytes(out)

    def _has_type(self, name: str) -> bool:
        return self.btf.has(name)


# module_alloc_size() places a region in the module area (MODULES_VADDR..MODULES_END: at most 2 GiB)
def module_region(name: str, kind: str, base: int, size: int) -> int:
    """``size``, for a region that fits the address space and no larger than :data:`MAX_MODULE_BYTES`."""
    if size > MAX_MODULE_BYTES or base + size >= 2**64:
        raise KernelError(f"module {name}: its {kind} region of {size:#x} bytes at {base:#x} is no module region")
    return size


# is_mapping_symbol() (include/linux/module_symbol.h)
#: the bytes of ``struct elf64_sym`` (``include/uapi/linux/elf.h``) up to ``st_value``'s end
ELF64_SYM_HEAD = 16


#: how the names of mapping symbols and local labels start: never a kallsyms name
_MAPPING_SYMBOL = (b"$", b".L", b"L0")


# ftrace_ops_list (kernel/trace/ftrace.c): the ops with a dynamically allocated trampoline
def ftrace_trampolines(k: KernelReader, limit: int = 64) -> list[FtraceTrampoline]:
    """Dynamic ftrace trampolines (x86-64 ``orc_ftrace_find()`` needs them)."""
    head, end = k.symbol("ftrace_ops_list"), k.symbol("ftrace_list_end")
    if head is None or not btf_has(k.btf, "ftrace_ops", "trampoline"):
        return []
    try:
        save_regs = k.btf.enum_value("FTRACE_OPS_FL_SAVE_REGS")
    except BtfError:
        save_regs = 0
    offs = {n: k.btf.offsetof("ftrace_ops", n) for n in ("next", "flags", "trampoline", "trampoline_size")}
    out: list[FtraceTrampoline] = []
    seen: set[int] = set()
    ops = k.read_u64(head)
    while ops and ops != end and ops not in seen and len(seen) < limit:
        seen.add(ops)
        data = k.read(ops, max(offs.values()) + 8)
        v = {n: int.from_bytes(data[o:o + 8], "little") for n, o in offs.items()}
        # create_trampoline() copies ftrace_caller: a size of 0 or past MAX_TRAMPOLINE_BYTES is no trampoline
        if v["trampoline"] and 0 < v["trampoline_size"] <= MAX_TRAMPOLINE_BYTES:
            out.append(FtraceTrampoline(v["trampoline"], v["trampoline_size"], ops, bool(v["flags"] & save_regs)))
        ops = v["next"]
    return out
