"""Replay: open a dump and its image, pick tasks, run the arch's walk on each."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Mapping, NamedTuple, Sequence

from unwind.core import registry
from unwind.core.callsite import CallSiteChecker
from unwind.formats.dump import Dump, DumpError, NotADump, file_start, written_by_unwind
from unwind.core.frame import Frame
from unwind.formats.image import (IMAGE_PATH_ENV, Image, ImageError, find_image, image_machine, image_search_places,
                                  images_near, open_image)
from unwind.core.memory import Memory
from unwind.core.stackinfo import StackInfo
from unwind.kernel.symbols import KernelSymbols, ModuleSymbols, SymbolError, SymbolTable
from unwind.kernel.generation import OLDEST_FOLLOWED
from unwind.core.target import Options, SavedRegs, Target, Task, kernel_version
from unwind.core.walk import (ReliableResult, Stop, StopReason, Unwinder, UnwindStop, frame_limit,
                              kunwind_stack_walk, stack_walk_reliable)
from .result import Replay

if TYPE_CHECKING:
    import re

    from unwind.core.dumpinfo import DumpInfo
    from unwind.formats.vmdump import CpuNotesDump, VmcoreFile

    from .batch import BatchReplay
    from .filters import Selection, TaskFilter
    from .lines import FrameLines


class ReplayError(Exception):
    """Unusable input for a replay (exit status 2)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        #: what reading the input had to say before it failed (the command line prints them first)
        self.warnings: tuple[str, ...] = ()


#: tasks a session keeps the memory and frame limit of (a vmcore task's memory holds its stacks' bytes)
_MAX_TASKS = 1 << 12
#: (pc, source) texts a session keeps of its symbolised frames before it starts again
_MAX_NAMES = 1 << 16
#: :class:`Options` fields every backend acts on
COMMON_OPTIONS = frozenset({"complete", "record", "generation"})


@dataclass(frozen=True, slots=True)
class _Walk:
    """What every walk with one set of options reads alike (a :attr:`Session._walks` entry; slotted, so
    the interpreter's specialised attribute reads take its fields)."""

    #: the session's image and symbols, kept so the ids in the entry's key stay theirs
    image: Image | None
    symbols: SymbolTable | KernelSymbols | None
    #: the options a walk reads: a copy of the caller's, with the dump's pinned generation
    options: Options
    #: the :attr:`Target.shared` of these options
    shared: dict[Hashable, Any]
    #: the dump's release, VMCOREINFO and facts, and the backend's arch: read here, where the interpreter's
    #: reads of a slotted class are specialised (a session's dump may be any of several classes)
    release: str | None
    vmcoreinfo: Mapping[str, str]
    info: DumpInfo
    arch: str


class _Shared(NamedTuple):
    """A :attr:`Target.shared` dict, with the image and symbols it was made over (their ids key it)."""

    image: Image | None
    symbols: SymbolTable | KernelSymbols | None
    shared: dict[Hashable, Any]


@dataclass(slots=True)
class _PerTask:
    """What every walk of one task reads alike (a :attr:`Session._per_task` entry)."""

    #: the task's stacks list (its id keys the entry; kept so the id stays its)
    stacks: list[StackInfo]
    #: the memory its walks read (:meth:`Dump.task_memory`)
    memory: Memory
    #: the dump's memory and ``task_memory`` function :attr:`memory` was made with
    dump_memory: object
    made_by: object
    #: whether the stacks record a freed task stack (:func:`task_stack_null`)
    stack_null: bool
    #: the default frame limit, once asked for
    max_frames: int | None = None


class Session:
    """A dump with its backend, image and symbols, ready to replay tasks."""

    def __init__(self, dump: Dump, image: Image | None, symbols: SymbolTable | None) -> None:
        self.dump = dump
        self.backend = dump.backend
        self.image = image
        self.symbols: SymbolTable | KernelSymbols | None = symbols
        info = dump.info
        if symbols is not None and (info.modules or info.bpf_symbols):
            tables = [ModuleSymbols.of(m) for m in info.modules]
            self.symbols = KernelSymbols(symbols, tables + ([ModuleSymbols.bpf(info.bpf_symbols)]
                                                            if info.bpf_symbols else []))
        self.warnings: list[str] = []
        self._callsites = CallSiteChecker(self.backend, image)
        #: the :attr:`_walks` entries of the options :meth:`replay` has checked (:meth:`check_options`)
        self._checked: dict[tuple[object, ...], _Walk] = {}
        #: per options: the :attr:`Target.shared` of walks with those options
        self._shared: dict[tuple[object, ...], _Shared] = {}
        #: per options as given (and image and symbols, kept with it): what every walk with them reads alike
        self._walks: dict[tuple[object, ...], _Walk] = {}
        #: per task's stacks list (by id; the list is kept alive with them): what every walk of the task reads
        self._per_task: dict[int, _PerTask] = {}
        #: the symbol table :meth:`symbolize` last named frames over, and its texts by source value, then pc
        self._names: tuple[object, dict[str, dict[int, str]]] = (None, {})
        #: the :meth:`source_lines` made last, with the image it was made of and its modules folder
        self._lines: tuple[object, str | None, FrameLines] | None = None

    def close(self) -> None:
        """Release the dump's file (a vmcore's, and an ``.xz`` one's decompressed spool); the image stays open,
        as other sessions may share it. The session cannot read the dump afterwards."""
        self.dump.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def callsites(self) -> CallSiteChecker:
        """The call-site check of this session's image (its verdicts cached with the image)."""
        return self._callsites

    @classmethod
    def load(cls, dump_path: str | Path, *, arch: str | None = None, vmlinux: str | Path | None = None,
             system_map: str | Path | None = None) -> "Session":
        """Open ``dump_path`` (a dump, or a vmcore found by magic); find its image by build-id unless
        ``vmlinux`` is given."""
        if _vmcore_format(dump_path):
            return cls._load_vmcore(str(dump_path), arch, vmlinux, system_map)
        try:
            dump = Dump.open(dump_path)
        except NotADump:  # an xz-compressed ELF vmcore: only its notes tell it from a dump
            return cls._load_vmcore(str(dump_path), arch, vmlinux, system_map)
        if arch is not None:
            try:
                wanted = registry.get(arch)
            except registry.ArchError as e:
                raise ReplayError(str(e)) from None
            if wanted.name != dump.arch:
                raise ReplayError(f"--arch {arch} disagrees with the dump, which is {dump.arch}")
        try:
            image = find_image(dump.build_id, dump_path, vmlinux, dump.release)
        except ImageError as e:
            raise ReplayError(str(e)) from None
        if image is None and dump.backend.image_required:
            raise ReplayError(f"no image with build-id {dump.build_id} found (looked in "
                              f"{', '.join(image_search_places(dump_path, dump.release))}): "
                              f"{dump.backend.image_required}; give --vmlinux")
        if image is not None and image.machine != dump.backend.elf_machine:
            raise ReplayError(f"{image.path} is {image.machine}, the dump is {dump.backend.elf_machine}")
        symbols = None
        try:
            if system_map is not None:
                symbols = SymbolTable.from_system_map(system_map)
            elif image is not None:
                symbols = image.symbols
        except (SymbolError, ImageError) as e:
            raise ReplayError(str(e)) from None
        session = cls(dump, image, symbols)
        session.warnings.extend(dump.warnings)
        if symbols is None:
            session.warnings.append(f"no image with build-id {dump.build_id} found (looked in "
                                    f"{', '.join(image_search_places(dump_path, dump.release))}; use --vmlinux "
                                    f"or ${IMAGE_PATH_ENV}): printing raw addresses, without call-site checks "
                                    "or complete-mode proofs")
        return session

    @classmethod
    def _load_vmcore(cls, path: str, arch: str | None, vmlinux: str | Path | None,
                     system_map: str | Path | None) -> "Session":
        """A vmcore: its image is required (symbols, BTF); tasks are read from the kernel's own lists."""
        from unwind.formats.vmdump import VmcoreFile

        vmcore = VmcoreFile.open(path)
        try:
            return cls._read_vmcore(vmcore, arch, vmlinux, system_map)
        except (DumpError, ReplayError) as e:  # what the file's notes said is still worth saying
            e.warnings = (*vmcore.warnings, *e.warnings)
            vmcore.close()
            raise

    @classmethod
    def _read_vmcore(cls, vmcore: "VmcoreFile", arch: str | None, vmlinux: str | Path | None,
                     system_map: str | Path | None) -> "Session":
        """The kernel in an opened vmcore, read with its image."""
        from unwind.formats.vmdump import CpuNotesDump, KernelNotPlaced, VmcoreDump

        path = vmcore.path
        if arch is not None and registry.get(arch).name != vmcore.arch:
            raise ReplayError(f"--arch {arch} disagrees with the vmcore, which is {vmcore.arch}")
        try:
            image = find_image(vmcore.build_id, path, vmlinux)
        except ImageError as e:
            raise ReplayError(str(e)) from None
        found_by_memory = image is None and vmcore.build_id is None
        if found_by_memory:
            image = _image_by_memory(vmcore)
        if image is None and vmcore.build_id is None:
            why = (f"{path}: no VMCOREINFO note, so no build-id to find the image by, and no image near it whose "
                   "kernel's own VMCOREINFO is in its memory")
            if vmcore.phys.damage is None or vmcore.vmcoreinfo_text:  # the note, if any, was not lost to the damage
                raise ReplayError(f"{why}: give it with --vmlinux")
            return cls._unplaced(CpuNotesDump.open(vmcore, f"{why}, which may be beyond the end of the file"))
        if image is None:
            raise ReplayError(f"{path}: no image with build-id {vmcore.build_id} found (looked in "
                              f"{', '.join(image_search_places(path, None))}): a vmcore's tasks need the kernel's "
                              f"symbols and BTF (use --vmlinux or ${IMAGE_PATH_ENV})")
        if image.machine != vmcore.backend.elf_machine:
            raise ReplayError(f"{image.path} is {image.machine}, the vmcore is {vmcore.backend.elf_machine}")
        try:
            symbols = SymbolTable.from_system_map(system_map) if system_map is not None else image.symbols
        except (SymbolError, ImageError) as e:
            raise ReplayError(str(e)) from None
        try:
            dump = VmcoreDump.open(vmcore, image, symbols)
        except KernelNotPlaced as e:
            return cls._unplaced(CpuNotesDump.open(vmcore, str(e)))
        session = cls(dump, dump.image, dump.symbols)  # type: ignore[arg-type]
        if found_by_memory:
            session.warnings.append(f"{path}: no VMCOREINFO note: {image.path} is the image, as the kernel's own "
                                    "VMCOREINFO in memory names its build-id")
        session.warnings.extend(dump.warnings)
        return session

    @classmethod
    def _unplaced(cls, dump: "CpuNotesDump") -> "Session":
        """A damaged vmcore whose kernel is not placed (:class:`unwind.formats.vmdump.CpuNotesDump`): its CPUs'
        notes, no image (nothing of it is known to be where it was linked)."""
        session = cls(dump, None, None)  # type: ignore[arg-type]
        session.warnings.extend(dump.warnings)
        return session

    def select(self, pid: int | None = None, cpu: int | None = None, every: bool = False,
               filters: "TaskFilter | None" = None, options: Options | None = None) -> list[Task]:
        """The tasks to replay (:meth:`selection`'s)."""
        return self.selection(pid, cpu, every, filters, options).tasks

    def selection(self, pid: int | None = None, cpu: int | None = None, every: bool = False,
                  filters: "TaskFilter | None" = None, options: Options | None = None) -> "Selection":
        """The tasks to replay: the task with ``pid``, the task running on ``cpu``, every task, or (default)
        those running on a CPU; with ``filters`` (:class:`~unwind.session.filters.TaskFilter`), those of every
        task (of the task running on ``cpu``, when given) it selects, walked with ``options`` when it needs
        the walk. :class:`ReplayError` when nothing is selected, or for arguments that do not go together."""
        from .filters import Selection, TaskFilter, select

        given = [name for name, v in (("pid", pid is not None), ("cpu", cpu is not None), ("every", every)) if v]
        if len(given) > 1:
            raise ReplayError(f"select(): {' and '.join(given)} do not go together: give one")
        if pid is not None and filters:
            raise ReplayError("select(): pid and filters do not go together: give the pid in the filter's pids")
        if filters is not None and not isinstance(filters, TaskFilter):
            raise ReplayError(f"select(): filters is a {type(filters).__name__}, not a TaskFilter")
        tasks = self.dump.tasks()
        if cpu is not None:
            tasks = [t for t in tasks if t.running and t.cpu == cpu]
            if not tasks:
                raise ReplayError(f"no task running on cpu{cpu} in the dump")
        if filters:
            chosen = select(self, tasks, filters, options)
            if not chosen.tasks:
                raise ReplayError("; ".join(chosen.notes(filters)) + (f" on cpu{cpu}" if cpu is not None else ""))
            return chosen
        if pid is not None:
            tasks = [t for t in tasks if t.pid == pid]
            if not tasks:
                raise ReplayError(f"no task with pid {pid} in the dump")
        elif cpu is None and not every:
            tasks = [t for t in tasks if t.running] or tasks
        return Selection(tasks)

    def tasks(self, state: str | Iterable[str] | None = None, comm: "str | re.Pattern[str] | None" = None,
              function: str | None = None, task: int | str | Iterable[int | str] | None = None,
              options: Options | None = None) -> list[Task]:
        """Every task with all the properties given (none: every task), in the dump's order: ``state`` a ``ps``
        letter or several (``"S,D"``), ``comm`` a regular expression searched in the command, ``function`` a
        function some frame of its replay (with ``options``) is in, ``task`` a pid or several (``"1,103"``).

        :class:`~unwind.session.filters.FilterError` for a value that is none of these; an empty list when no
        task matches (:func:`unwind.session.filters.select` also says which values matched nothing)."""
        from .filters import TaskFilter, select

        f = TaskFilter.of(state, comm, function, task)
        tasks = self.dump.tasks()
        return select(self, tasks, f, options).tasks if f else tasks

    def check_options(self, options: Options) -> None:
        """Refuse an option this dump's backend does not act on, or a ``--generation`` that is no version."""
        if options.generation is not None:
            version = kernel_version(options.generation)
            if version is None:
                raise ReplayError(f"--generation {options.generation!r}: expected a kernel version such as 6.1, "
                                  "6.12 or 7.2")
            if version < OLDEST_FOLLOWED:
                raise ReplayError(f"--generation {options.generation}: the walks follow the kernel's unwinders from "
                                  f"{'.'.join(map(str, OLDEST_FOLLOWED))} on, not older ones")
        for f in fields(Options):
            if f.name in COMMON_OPTIONS or getattr(options, f.name) == f.default:
                continue
            if f.name not in self.backend.options:
                which = sorted(b.name for b in registry.backends().values() if f.name in b.options)
                raise ReplayError(f"--{f.name.replace('_', '-')} does not apply to {self.backend.name} dumps "
                                  f"(only {', '.join(which) or 'none'})")

    def target(self, task: Task, options: Options) -> Target:
        """Everything a walk of ``task`` reads; a dump's ``kernel.generation`` applies unless overridden.

        Walks with equal options share one :attr:`Target.shared` (what the backend derives once per dump)."""
        key = self._options_key(options)
        walk = self._walks.get(key) or self._walk(options, key)
        return self._target(task, walk, self._task(task))

    def _options_key(self, options: Options) -> tuple[object, ...]:
        """What keys ``options`` in :attr:`_walks`, :attr:`_shared` and :attr:`_checked`: the fields a walk
        reads, and this session's image and symbols (kept with each entry, so their ids stay theirs)."""
        return (options.complete, options.record, options.user, options.generation, options.orc_version,
                id(self.image), id(self.symbols))

    def _walk(self, options: Options, key: tuple[object, ...]) -> _Walk:
        """The :attr:`_walks` entry of ``options`` (``key``): the options a walk reads (a copy: the caller's
        may change), with the image and symbols, the shared dict and the dump's release."""
        dump = self.dump
        pinned = dump.info.generation
        walk = replace(options, generation=pinned) if options.generation is None and pinned else replace(options)
        hit = self._walks[key] = _Walk(self.image, self.symbols, walk, self._shared_for(walk), dump.release,
                                       dump.vmcoreinfo, dump.info, self.backend.name)
        return hit

    def _target(self, task: Task, walk: _Walk, per_task: _PerTask) -> Target:
        """The :class:`Target` of ``task`` from its :meth:`_walk` entry and :meth:`_task` entry."""
        return Target(walk.arch, per_task.memory, task, walk.release, walk.vmcoreinfo, walk.symbols, walk.image,
                      walk.info, walk.options, walk.shared)

    def _shared_for(self, options: Options) -> dict[Hashable, Any]:
        """The :attr:`Target.shared` of walks with ``options`` over this session's image and symbols."""
        key = self._options_key(options)
        hit = self._shared.get(key)
        if hit is None:  # the image and symbols are kept with it, so their ids stay theirs
            hit = self._shared[key] = _Shared(self.image, self.symbols, {})
        return hit.shared

    def _task(self, task: Task) -> _PerTask:
        """What every walk of ``task`` reads alike, worked out once per task (the copies :meth:`Dump.tasks`
        hands out share their ``stacks`` list). A vmcore's task memory is a snapshot of its stacks
        (:meth:`Dump.task_memory`), read once, not per walk."""
        dump = self.dump
        stacks, memory = task.stacks, dump.memory
        made_by = dump.__dict__.get("task_memory")  # a task_memory the caller set on the dump, or None
        hit = self._per_task.get(id(stacks))
        # made again when a caller gave the dump new memory or a task_memory of its own
        if hit is None or hit.stacks is not stacks or hit.dump_memory is not memory or hit.made_by is not made_by:
            if len(self._per_task) >= _MAX_TASKS:  # tasks made by the caller, each with a list of its own
                self._per_task.clear()
            hit = self._per_task[id(stacks)] = _PerTask(stacks, dump.task_memory(task), memory, made_by,
                                                        task_stack_null(stacks))
        return hit

    def task_memory(self, task: Task) -> Memory:
        """The memory a walk of ``task`` reads (:meth:`Dump.task_memory`), made once per task and kept: the
        memory :meth:`replay` reads (a vmcore's snapshot of the task's stacks is not read again)."""
        return self._task(task).memory

    def saved_regs(self, task: Task) -> SavedRegs | None:
        """The blocked ``task``'s saved context, as its kernel's context switch left it (``None`` for a task
        running on a CPU: its registers are :attr:`Task.regs`)."""
        return self.backend.saved_regs(self.target(task, Options()))

    def unwinder(self, task: Task, options: Options | None = None) -> Unwinder:
        """An unwinder for ``task``, to drive with :func:`~unwind.core.walk.kunwind_stack_walk` and the kernel's
        adapters; its frames carry the symbol the kernel prints."""
        options = options or Options()
        self.check_options(options)
        target = self.target(task, options)
        return SymbolizingUnwinder(self.backend.unwinder(target), self.backend, target)

    def source_lines(self, modules: str | os.PathLike[str] | None = None) -> FrameLines:
        """Where the source lines of this session's frames come from (``replay(..., lines=True)``): the
        image's DWARF, or that of an image of the same build-id; with ``modules``, a folder searched for the
        modules' ``.ko`` files by name. Made once and kept: a later call without ``modules`` returns the
        same, so ``replay(..., lines=True)`` reads the modules given here. Its ``note`` says why there are
        no lines (a slim image), its ``modules.problems`` why a module has none."""
        from .lines import FrameLines  # here: the DWARF reader is not imported by a replay without lines

        kept = self._lines
        folder = None if modules is None else os.fspath(modules)
        if kept is not None and kept[0] is self.image and (folder is None or folder == kept[1]):
            return kept[2]
        made = FrameLines.of_session(self, folder)
        self._lines = (self.image, folder, made)
        return made

    def replay(self, task: Task, options: Options | None = None, *, reliable: bool = False,
               max_frames: int | None = None, symbolize: bool = True, lines: bool = False) -> Replay:
        """Walk ``task``: all frames and the stop; with ``reliable``, the reliable verdict too; with
        ``lines``, each frame's :attr:`~unwind.core.frame.Frame.line` and
        :attr:`~unwind.core.frame.Frame.inlined` from :meth:`source_lines` (left ``None`` and empty where
        the image has no DWARF).

        ``max_frames`` defaults to :func:`unwind.core.walk.frame_limit`: what the task's captured
        stack bytes allow (one frame per ``backend.min_frame_bytes``).
        """
        options = options or Options()
        key = self._options_key(options)
        walk = self._checked.get(key)
        if walk is None:  # options not replayed with this image and symbols yet: checked once
            self.check_options(options)
            walk = self._checked[key] = self._walks.get(key) or self._walk(options, key)
        per_task = self._task(task)
        target = self._target(task, walk, per_task)
        if task.lacks is not None:  # the dump lacks what the walk would start from: no frame is better than a wrong one
            stop = Stop(StopReason.MISSING_REGISTER if task.lacks.registers else StopReason.MEMORY_FAULT,
                        task.lacks.what)
            return Replay(target, [], stop, ReliableResult(False, stop, task.lacks.what) if reliable else None)
        if task_stack_freed(task, per_task.stack_null):
            stop = Stop(StopReason.TASK_EXITED, f"task->stack is NULL (state {task.state or '?'}): "
                                                "try_get_task_stack() fails and the kernel prints nothing")
            verdict = ReliableResult(False, stop, "try_get_task_stack() fails (-EINVAL)") if reliable else None
            return Replay(target, [], stop, verdict)
        if max_frames is None:
            max_frames = per_task.max_frames
            if max_frames is None:
                max_frames = per_task.max_frames = frame_limit(task.stacks, per_task.memory,
                                                               self.backend.min_frame_bytes)
        unwinder = self.backend.unwinder(target)
        frames: list[Frame] = []
        stop = kunwind_stack_walk(unwinder, None, max_frames, frames)  # collect(), one call fewer per task
        verdict = None
        if reliable:
            verdict = stack_walk_reliable(self.backend.unwinder(target), lambda pc: True, max_frames)
        if symbolize:
            self.symbolize(frames, target)
        self._callsites.annotate_frames(frames)
        if lines:
            self.source_lines().fill(frames)
        return Replay(target, frames, stop, verdict, unwinder.basis_maker())  # the basis made when read

    def symbolize(self, frames: Sequence[Frame], target: Target) -> None:
        """Set each frame's ``symbol`` to what the kernel prints (:meth:`ArchBackend.symbolize`). That text
        depends on the frame's pc and source and the target's symbols only, so it is made once per
        (pc, source) over one symbol table: the walks of a dump return to the same few hundred pcs."""
        held, names = self._names
        if held is not target.symbols:
            held, names = self._names = (target.symbols, {})
        name = self.backend.symbolize
        source, by_pc = None, {}
        for f in frames:
            if f.source is not source:  # a walk's frames mostly share one source: its texts stay at hand
                source = f.source
                by_pc = names.get(source._value_)
                if by_pc is None:
                    by_pc = names[source._value_] = {}
            text = by_pc.get(f.pc)
            if text is None:
                if len(by_pc) >= _MAX_NAMES:
                    by_pc.clear()
                text = by_pc[f.pc] = name(f, target)
            f.symbol = text

    def replay_all(self, options: Options | None = None, tasks: Sequence[Task] | None = None, *,
                   reliable: bool = False, max_frames: int | None = None, symbolize: bool = True,
                   lockstep: bool | None = None, lines: bool = False) -> "BatchReplay":
        """Replay ``tasks`` (default: every task of the dump) in one batch (:mod:`unwind.session.batch`).

        Returns a sequence of :class:`Replay`, one per task in order, each equal to
        ``self.replay(task, options, reliable=..., max_frames=..., symbolize=..., lines=...)``: the arch's
        batch walk takes the plain steps of all tasks in numpy lockstep and leaves every other
        task, and every mode it does not take, to :meth:`replay`. Each replay is built when read.
        Fewer tasks than :data:`unwind.session.batch.MIN_TASKS` (too few to gain) are walked task by task,
        unless ``lockstep`` (``False``: never in lockstep). :func:`unwind.session.batch.replay_all` walks the
        tasks of several sessions together.
        """
        from .batch import replay_all  # here: the batch walk imports numpy, which a replay task by task does not need

        return replay_all([self], options, tasks=None if tasks is None else [tasks], reliable=reliable,
                          max_frames=max_frames, symbolize=symbolize, lockstep=lockstep, lines=lines)[0]


def _vmcore_format(path: str | Path) -> bool:
    """Is ``path`` a vmcore? kdump-compressed and flattened files are, by magic; an ELF core is unless it
    carries the ``UNWIND`` note of the project's own dumps (a dump as the project writes it is told at once,
    without the vmcore readers)."""
    if written_by_unwind(path):
        return False
    from unwind.formats.vmcore import VmcoreError, detect_format, is_vmcore
    from unwind.formats.vmcore.diskdump import KDUMP_SIGNATURE
    from unwind.formats.vmcore.flattened import is_flattened
    from unwind.formats.vmcore.source import XZ_MAGIC

    head = b""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(XZ_MAGIC):  # decided on the magic inside; an ELF goes to Dump.open first (NotADump)
        inner = b""
        with contextlib.suppress(OSError):
            inner = file_start(str(path), 16)
        return is_flattened(inner) or inner.startswith(KDUMP_SIGNATURE)
    try:
        fmt = detect_format(path)
    except VmcoreError:  # a damaged file whose header says vmcore: its reader says what is wrong
        return is_flattened(head) or head.startswith(KDUMP_SIGNATURE)
    return fmt != "elf" or is_vmcore(path)


class SymbolizingUnwinder(Unwinder):
    """An arch unwinder whose frames come with ``symbol`` set, as :meth:`Session.replay` sets it."""

    def __init__(self, inner: Unwinder, backend: registry.ArchBackend, target: Target) -> None:
        self.inner = inner
        self.backend = backend
        self.target = target
        self.reliable_refuses_boundary = inner.reliable_refuses_boundary

    def _named(self, frame: Frame) -> Frame:
        frame.symbol = self.backend.symbolize(frame, self.target)
        return frame

    def start(self) -> Frame:
        """The arch unwinder's first frame, symbolised."""
        return self._named(self.inner.start())

    def next(self) -> "Frame | Stop | UnwindStop":
        """The arch unwinder's next frame, symbolised (or the stop it returns)."""
        frame = self.inner.next()
        return self._named(frame) if frame.__class__ is Frame else frame

    def bpf_args(self, frame: Frame) -> tuple[int, int, int]:
        """The arch unwinder's ``(ip, sp, fp)``."""
        return self.inner.bpf_args(frame)

    def basis_maker(self) -> Callable[[], dict[str, str]]:
        """The arch unwinder's basis, made when called."""
        return self.inner.basis_maker()


# try_get_task_stack() (sched_show_task(), stack_trace_save_tsk()): an exited task's stack is freed
def task_stack_freed(task: Task, stack_null: bool) -> bool:
    """A blocked task whose task stack the dump records as NULL (``stack_null``: :func:`task_stack_null` of
    its stacks, kept per task): it has exited (its stack went at the last switch)."""
    return stack_null and task.regs is None  # a running task has its stack


def task_stack_null(stacks: Sequence[StackInfo]) -> bool:
    """Do ``stacks`` record the task stack as NULL (``task->stack``)?"""
    for s in stacks:
        if s.kind == "task" and not s.low:
            return True
    return False


def _image_by_memory(vmcore: "VmcoreFile") -> Image | None:
    """The image, of those near a vmcore with no VMCOREINFO note (:func:`images_near`), whose kernel's own
    VMCOREINFO is in the vmcore's memory and names the image's build-id; ``None`` if none does, or the arch
    cannot find VMCOREINFO in memory."""
    if not vmcore.backend.vmcoreinfo_in_memory:
        return None
    for cand in images_near(vmcore.path):
        if image_machine(cand) != vmcore.backend.elf_machine:
            continue  # another machine's: not unpacked
        try:
            image = open_image(cand.resolve())
            if not image.build_id:
                continue
            text, _how = vmcore.vmcoreinfo_from_memory(image)
        except (ImageError, DumpError):
            continue
        if f"BUILD-ID={image.build_id}\n" in text:
            return image
    return None


def load_session(dump_path: str | Path, **kw: object) -> Session:
    """:meth:`Session.load`, turning every input problem into :class:`ReplayError`."""
    try:
        return Session.load(dump_path, **kw)  # type: ignore[arg-type]
    except DumpError as e:
        error = ReplayError(str(e))
        error.warnings = e.warnings
        raise error from None
