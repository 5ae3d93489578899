"""What a dump or vmcore tells a walk besides its tasks and memory, as typed values.

A dump's ``UNWIND`` note (``docs/dump-format.md``) and a vmcore read through BTF
(:mod:`unwind.formats.vmdump`) give the same :class:`DumpInfo`: the formats parse
their input into it once, at open, and the core and the backends read its fields
(``Target.info``), never the note's JSON. Each is an immutable ``NamedTuple`` (a frozen
dataclass costs five times as long to define at import).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple

#: an empty mapping, the default of the mapping fields (shared, so read-only)
_NONE: Mapping = MappingProxyType({})


class ModuleRegion(NamedTuple):
    """One ``mod->mem[]`` (or ``core_layout``/``init_layout``) region: ``[base, base + size)``."""

    kind: str
    base: int
    size: int


class ModuleOrc(NamedTuple):
    """x86-64 ``mod->arch.orc_unwind_ip``/``orc_unwind``/``num_orcs``, and ``sizeof(struct orc_entry)``."""

    orc_unwind_ip: int
    orc_unwind: int
    num_orcs: int
    entry_size: int

    def ranges(self) -> list[tuple[int, int]]:
        """Where ``orc_unwind_ip`` (s32 each) and ``orc_unwind`` lie."""
        return [(self.orc_unwind_ip, self.orc_unwind_ip + 4 * self.num_orcs),
                (self.orc_unwind, self.orc_unwind + self.entry_size * self.num_orcs)]


class ModuleInfo(NamedTuple):
    """One loaded ``struct module``: its regions (text first), kallsyms and (x86-64) ORC tables."""

    name: str
    addr: int | None = None
    state: int | None = None
    regions: tuple[ModuleRegion, ...] = ()
    #: ``(address, name)`` of each kallsyms entry
    symbols: tuple[tuple[int, str], ...] = ()
    orc: ModuleOrc | None = None

    def contains(self, addr: int) -> bool:
        """``within_module()``: does one of the module's regions hold ``addr``?"""
        return any(r.base <= addr < r.base + r.size for r in self.regions)


class BpfSymbol(NamedTuple):
    """One ``struct bpf_ksym`` on ``bpf_kallsyms``: a JITed BPF program or trampoline ``[start, end)``."""

    start: int
    end: int
    name: str


class FtraceTrampoline(NamedTuple):
    """A dynamic ftrace trampoline (``ops->trampoline``, ``trampoline_size``; x86-64 ``orc_ftrace_find()``)."""

    addr: int
    size: int
    ops: int | None = None
    #: ``ops->flags & FTRACE_OPS_FL_SAVE_REGS``: a copy of ``ftrace_regs_caller``
    save_regs: bool = False


class StructOffsets(NamedTuple):
    """A struct's size and member offsets as the capture read them from BTF."""

    size: int | None
    members: Mapping[str, int]


class CpuNote(NamedTuple):
    """What the capture recorded of one CPU beyond its registers (a vmcore records none)."""

    cpu: int
    pid: int | None = None
    #: ``kernel``, ``user`` or ``firmware``
    mode: str = "kernel"
    #: system registers (MSRs, control registers, ``VBAR_EL1``, ``sepc``...)
    sysregs: Mapping[str, int] = _NONE
    #: how the capture normalised the CPU's registers: text, or an object of text
    normalised: str | Mapping[str, object] | None = None


class StackNote(NamedTuple):
    """A stack range ``[low, high)`` a dump's note declares, with the task (pid, ``task_struct``) or CPU it is of."""

    kind: str
    low: int
    high: int
    cpu: int | None = None
    pid: int | None = None
    task: int | None = None


class BlockedContext(NamedTuple):
    """A blocked task as a dump's note lists it: its pid and saved context (a vmcore lists none)."""

    pid: int | None
    context: Mapping[str, int]


class DumpInfo(NamedTuple):
    """The facts of one dump or vmcore a walk may read: release, build-id, symbol hints, modules, BPF
    symbols, ftrace trampolines, struct offsets, and what a dump's note declares of CPUs, stacks and
    blocked tasks."""

    release: str | None = None
    #: a generation the capture pinned (``kernel.generation``), followed unless ``--generation`` is given
    generation: str | None = None
    build_id: str | None = None
    #: runtime addresses of symbols the capture recorded (the image's own are authoritative)
    symbols: Mapping[str, int] = _NONE
    modules: tuple[ModuleInfo, ...] = ()
    bpf_symbols: tuple[BpfSymbol, ...] = ()
    #: ``None``: the kernel's ``ftrace_ops_list`` was unreadable
    ftrace_trampolines: tuple[FtraceTrampoline, ...] | None = ()
    #: struct layouts by name (``None``: the capture recorded none)
    offsets: Mapping[str, StructOffsets] | None = None
    cpus: tuple[CpuNote, ...] = ()
    stacks: tuple[StackNote, ...] = ()
    #: the blocked tasks a dump's note lists, in its order
    blocked: tuple[BlockedContext, ...] = ()

    def cpu(self, cpu: int | None) -> CpuNote | None:
        """What the capture recorded of CPU ``cpu``, if anything."""
        for c in self.cpus:
            if c.cpu == cpu:
                return c
        return None
