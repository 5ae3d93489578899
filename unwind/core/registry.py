"""Arch backends register here by name; a dump's ELF machine selects one.

The core names no architecture: backends are the subpackages of
``unwind.arch``, each of which calls :func:`register_lazy` on import with its
name, aliases and ELF machine; the backend's own modules are imported when it
is first asked for.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from abc import ABC, abstractmethod
from types import ModuleType
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable

if TYPE_CHECKING:
    import random
    from collections.abc import Sequence

    from unwind.session.batch import Job, Walked
    from unwind.kernel.btf import Btf
    from unwind.formats.image import Image
    from unwind.formats.vmcore.virtual import PhysReader, Translator
    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
    from .frame import Frame
    from unwind.session.replay import Replay
    from .target import SavedRegs, Target
    from .trace import TraceLine
    from .walk import Stop, Unwinder


class ArchError(Exception):
    """Unknown arch, or an arch that disagrees with the dump."""


class ArchBackend(ABC):
    """What the core needs from an architecture."""

    #: registry name: "arm64", "x86_64", "riscv"
    name: ClassVar[str]
    #: why a walk cannot go without the kernel image (then a dump without one is refused up front),
    #: or ``None`` when raw addresses will do
    image_required: ClassVar[str | None] = None
    #: other spellings users type for it (``--arch amd64``)
    aliases: ClassVar[tuple[str, ...]] = ()
    #: :class:`~unwind.core.target.Options` fields this backend acts on beyond ``complete``, ``record`` and
    #: ``generation``; any other one set is refused rather than silently ignored
    options: ClassVar[frozenset[str]] = frozenset()
    #: ELF machine as pyelftools names it, e.g. "EM_AARCH64", and its number
    elf_machine: ClassVar[str]
    e_machine: ClassVar[int]
    #: ELF header flags for a core of this arch
    e_flags: ClassVar[int] = 0
    #: register names in NT_PRSTATUS ``pr_reg`` order
    prstatus_regs: ClassVar[tuple[str, ...]]
    #: the registers holding pc and sp
    pc_reg: ClassVar[str]
    sp_reg: ClassVar[str]
    #: the names of capstone's constants for this arch's decoder: the arch, then the mode flags
    #: (names, so that capstone is imported only when a decoder is made: :meth:`capstone_mode`)
    capstone: ClassVar[tuple[str, ...]]
    #: byte lengths a call instruction may have, shortest first
    call_lengths: ClassVar[tuple[int, ...]]
    #: can :meth:`vmcoreinfo_from_memory` find VMCOREINFO in a vmcore that has no note of it?
    vmcoreinfo_in_memory: ClassVar[bool] = False
    #: the kernel structs the walk reads, with the members it needs: ``unwind capture`` writes
    #: their BTF layout into the dump's ``offsets`` (:func:`unwind.kernel.layout.resolve_layout`)
    layouts: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: the keys of a blocked task's saved ``context`` in the dump's note (``None``: any);
    #: the note's schema drops any other key with a warning (``unwind/formats/note_schema.py``)
    context_keys: ClassVar[frozenset[str] | None] = None
    #: the fewest stack bytes one frame consumes (the default frame limit, ``unwind.core.walk.frame_limit``):
    #: an arm64 or riscv frame record {fp, lr} is 16
    min_frame_bytes: ClassVar[int] = 16
    #: gdb's name of this architecture (``set architecture``), and the register holding the frame pointer
    #: (a :attr:`prstatus_regs` name)
    gdb_arch: ClassVar[str | None] = None
    fp_reg: ClassVar[str | None] = None
    #: gdb's names of the :attr:`prstatus_regs` it spells otherwise (those absent are spelt alike)
    gdb_registers: ClassVar[dict[str, str]] = {}

    def frame_registers(self, frames: "list[Frame]", index: int, target: "Target") -> dict[str, int]:
        """The registers the walk of ``target`` establishes for ``frames[index]``, by :attr:`prstatus_regs`
        names (what ``unwind gdb`` hands gdb for a caller frame): its pc, and its sp and frame pointer
        where the walk knows them. A backend adds what it restores: a ``pt_regs`` crossed at an exception
        boundary (:attr:`Frame.pt_regs <unwind.core.frame.Frame.pt_regs>`), the return-address register."""
        frame = frames[index]
        out = {self.pc_reg: frame.pc}
        if frame.sp is not None:
            out[self.sp_reg] = frame.sp
        if self.fp_reg is not None and frame.fp is not None:
            out[self.fp_reg] = frame.fp
        return out

    @abstractmethod
    def unwinder(self, target: "Target") -> "Unwinder":
        """A walk of ``target.task`` under ``target.options``."""

    @abstractmethod
    def is_call(self, mnemonic: str, op_str: str) -> bool:
        """Is this decoded instruction a call that leaves a return address?"""

    def capstone_mode(self) -> tuple[int, int]:
        """:attr:`capstone` as capstone's ``(arch, mode)`` numbers; capstone is imported here, on first use."""
        import capstone

        arch, mode = getattr(capstone, self.capstone[0]), 0
        for name in self.capstone[1:]:
            mode |= getattr(capstone, name)
        return arch, mode

    def call_site_length(self, text: Callable[[int, int], bytes | None], ret: int) -> int | None:
        """The length of the call that ends at ``ret`` when its bytes alone settle that capstone's
        reading (each of :attr:`call_lengths`, shortest first, judged by :meth:`is_call`) would
        find a call of that length; ``None`` to ask capstone. ``text(addr, size)`` reads the image."""
        return None

    def no_call_site(self, text: Callable[[int, int], bytes | None], ret: int) -> bool:
        """True when the bytes before ``ret`` alone settle that capstone's reading (each of
        :attr:`call_lengths`, judged by :meth:`is_call`) finds no call ending there; False to ask
        capstone. The instruction that does end there is then decoded only when it is read."""
        return False

    @abstractmethod
    def format_trace(self, frames: "list[Frame]", stop: "Stop", target: "Target") -> "list[TraceLine]":
        """The trace as the kernel of ``target.release`` prints it.

        Each line says what it is and carries its values and the frame it
        prints (``--explain`` puts provenance under it, ``--json`` carries it).
        """

    def translator(self, info: "VmcoreInfo", phys: "PhysReader",
                   symbol: "Callable[[str], int | None]") -> "Translator":
        """Kernel virtual-to-physical translation of a vmcore (``arch/<arch>/mm.py``).

        ``info`` is the dump's VMCOREINFO, ``phys`` its physical memory and
        ``symbol`` gives the runtime address (KASLR applied) of an image symbol.
        """
        raise ArchError(f"{self.name}: no kernel address translation for vmcores")

    def vmcoreinfo_from_memory(self, phys: "PhysReader", ranges: "Iterable[tuple[int, int]]",
                               symbol: "Callable[[str], int | None]",
                               btf: "Btf | None" = None) -> "tuple[VmcoreInfo, str]":
        """The kernel's own VMCOREINFO found in memory, for a dump that carries no note of it.

        ``ranges`` are the dump's physical ``[start, end)`` ranges, ``symbol``
        the image's link-time addresses, ``btf`` the image's BTF when it has one. Returns the text and a sentence
        saying where it was found; an input error (:class:`ArchError`,
        :class:`~unwind.core.errors.DumpError`) when it cannot be.
        """
        raise ArchError(f"{self.name}: the dump has no VMCOREINFO note")

    def batch_walk(self, jobs: "list[Job]") -> "Walked | None":
        """Walk the tasks of ``jobs`` in lockstep (:mod:`unwind.session.batch`), or ``None`` when this arch has no
        batch walk (every task then goes to :meth:`~unwind.session.replay.Session.replay`).

        The walk takes only the unwinder's plain step and leaves a lane to the scalar path whenever
        anything else applies. Each frame it reports consumes at least :attr:`min_frame_bytes` of the
        task's captured stack, so it never reaches the default frame limit.
        """
        return None

    def saved_regs(self, target: "Target") -> "SavedRegs | None":
        """The saved context of the blocked task ``target`` walks, as its kernel's context switch left it
        (every register of it the dump holds); ``None`` for a task running on a CPU."""
        return None

    def categorize(self, oracle: dict, expected: list[int], replay: "Replay") -> str | None:
        """Name the documented category of a difference from an oracle, or ``None`` if unexplained."""
        return None

    @property
    def kernel(self) -> ModuleType:
        """The arch's hooks for reading a stopped kernel (``arch/<arch>/kernel.py``): saved contexts,
        per-CPU stacks, CPU modes (see :mod:`unwind.kernel.model`)."""
        return importlib.import_module(f"{type(self).__module__.rpartition('.')[0]}.kernel")

    def fuzz_image(self, rng: "random.Random", image: "Image", release: str | None,
                   words: "Sequence[int]") -> "Callable[[], None] | None":
        """``unwind fuzz``'s arch family: corrupt what this arch reads from the image (x86-64: ORC)
        for the next walks; returns what puts it back, or ``None`` when nothing was changed."""
        return None

    def symbolize(self, frame: "Frame", target: "Target") -> str:
        """The symbol text the kernel would print for this frame (``%pS`` by default): a function of the
        frame's ``pc`` and ``source`` and of ``target.symbols`` alone (a session keeps each answer)."""
        if target.symbols is None:
            return hex(frame.pc)
        return target.symbols.format(frame.pc)


_BACKENDS: dict[str, ArchBackend] = {}
_loaded = False
#: why no backend could be found, when none could (said by the errors of a failed look-up)
_missing = ""


class Pending:
    """An arch package's backend before its modules are imported: what picks it, and where it is."""

    def __init__(self, name: str, aliases: tuple[str, ...], elf_machine: str, where: str,
                 e_machine: int | None = None) -> None:
        self.name, self.aliases, self.elf_machine, self.where = name, aliases, elf_machine, where
        self.e_machine = e_machine

    def load(self) -> ArchBackend:
        """Import the backend's module, make the backend and register it in this entry's place."""
        module, _, cls = self.where.partition(":")
        backend: ArchBackend = getattr(importlib.import_module(module), cls)()
        if ((backend.name, tuple(backend.aliases), backend.elf_machine) != (self.name, self.aliases, self.elf_machine)
                or self.e_machine not in (None, getattr(backend, "e_machine", None))):
            raise ArchError(f"{self.where} is {backend.name} {backend.aliases} {backend.elf_machine} "
                            f"({getattr(backend, 'e_machine', None)}), registered as {self.name} {self.aliases} {self.elf_machine} "
                            f"({self.e_machine})")
        return register(backend)


_PENDING: dict[str, Pending] = {}


def register(backend: ArchBackend) -> ArchBackend:
    """Register a backend under its name."""
    _BACKENDS[backend.name] = backend
    _PENDING.pop(backend.name, None)
    return backend


def register_lazy(name: str, aliases: tuple[str, ...], elf_machine: str, where: str,
                  e_machine: int | None = None) -> None:
    """Register the backend ``where`` (``"module:Class"``) by its name, aliases and ELF machine (its name and,
    optionally, its ``e_machine`` number); its module is imported when the backend is first asked for, so a
    dump of one arch loads only that arch."""
    if name not in _BACKENDS:
        _PENDING[name] = Pending(name, aliases, elf_machine, where, e_machine)


def _load_all() -> None:
    global _loaded, _missing
    if _loaded:
        return
    _loaded = True
    try:
        pkg = importlib.import_module("unwind.arch")
    except ImportError as e:
        unwind = importlib.import_module("unwind")
        beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(unwind.__file__))), "arch")
        _missing = (f"no arch backend was found: module unwind.arch is in none of {list(unwind.__path__)} "
                    f"nor at {beside} ({e})")
        return
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.ispkg:
            importlib.import_module(f"unwind.arch.{mod.name}")


def no_backend_found() -> bool:
    """No arch backend could be found at all (the package ``unwind.arch`` is missing)."""
    _load_all()
    return bool(_missing)


def _not_found(what: str) -> ArchError:
    """``what`` has no backend; when no backend could be found at all, the error says where it looked."""
    return ArchError(f"{what}: {_missing}" if _missing else what)


def _entries() -> list[ArchBackend | Pending]:
    _load_all()
    return [*_BACKENDS.values(), *_PENDING.values()]


def _loaded_backend(entry: ArchBackend | Pending) -> ArchBackend:
    return entry.load() if isinstance(entry, Pending) else entry


def backends() -> dict[str, ArchBackend]:
    """All registered backends by name (every arch's modules imported)."""
    for entry in _entries():
        _loaded_backend(entry)
    return dict(_BACKENDS)


def get(name: str) -> ArchBackend:
    """The backend called ``name`` or one of its aliases (case-insensitive)."""
    key = name.lower()
    entries = _entries()
    for b in entries:
        if key == b.name or key in b.aliases:
            return _loaded_backend(b)
    known = ", ".join(f"{b.name} ({', '.join(b.aliases)})" if b.aliases else b.name
                      for b in sorted(entries, key=lambda b: b.name)) or "none"
    raise _not_found(f"unknown arch {name!r} (known: {known})")


def for_machine(machine: str) -> ArchBackend:
    """The backend for an ELF machine name such as ``EM_AARCH64``."""
    for b in _entries():
        if b.elf_machine == machine:
            return _loaded_backend(b)
    raise _not_found(f"no backend for ELF machine {machine}")


def for_e_machine(number: int) -> ArchBackend:
    """The backend for an ELF header's ``e_machine`` number (a backend registered without its number is
    imported to be asked)."""
    entries = _entries()
    for b in entries:
        if getattr(b, "e_machine", None) == number:
            return _loaded_backend(b)
    for b in entries:
        if isinstance(b, Pending) and b.e_machine is None and getattr(b.load(), "e_machine", None) == number:
            return _BACKENDS[b.name]
    raise _not_found(f"no backend for ELF machine {number}")
