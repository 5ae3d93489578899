"""A vmcore opened for replay: the same surface as :class:`unwind.formats.dump.Dump`, read from the kernel itself.

Where a dump written by ``unwind capture`` lists its tasks and stacks in a
JSON note, a vmcore (kdump ``/proc/vmcore``, makedumpfile, QEMU
``dump-guest-memory``) holds the whole kernel: the tasks, their saved
contexts, stacks, function-graph return stacks and kretprobe instances are
found through BTF (:mod:`unwind.kernel.model`), the running CPUs' registers come
from the ``NT_PRSTATUS`` notes. The result is the same :class:`Task` list,
and the same :class:`~unwind.core.dumpinfo.DumpInfo` a dump's note gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import elfcore
from unwind.core import registry
from unwind.core.dumpinfo import DumpInfo, FtraceTrampoline, ModuleInfo
from .dump import CpuState, DumpError, mark_switches
from unwind.kernel.kaslr import RelocatedImage, relocate_symbols, runtime_symbols
from unwind.kernel.model import (MAX_CPUS, PID_MAX_LIMIT, Kernel, KernelError, KernelTask, ListRead, LostTask,
                                 PerCpuUnread, ftrace_trampolines)
from unwind.kernel.btf import Btf, BtfError
from unwind.kernel.ram import crash_kernel_ranges, for_each_mem_range, subtract_ranges, walk_system_ram_res
from unwind.core.memory import Memory, MemoryFault
from unwind.core.stackinfo import StackInfo
from unwind.kernel.symbols import SymbolTable
from unwind.core.target import Lack, Task
from .note_info import note_keys
from .vmcore.vmcoreinfo import VmcoreInfo

if TYPE_CHECKING:
    from .image import Image

#: the note format a conversion writes (docs/dump-format.md)
FORMAT_VERSION = 1


def _prstatus_pid(raw: bytes) -> int:
    return int.from_bytes(raw[32:36], "little", signed=True)  # elf_prstatus.pr_pid


class KernelNotPlaced(DumpError):
    """A damaged vmcore with no VMCOREINFO note whose kernel's own note may be beyond the end of the file: the
    kernel cannot be placed (:class:`CpuNotesDump` lists what its notes say)."""


class NamedByVmcoreinfo:
    """The kernel a vmcore is of, as its VMCOREINFO names it, and the file it is read from (``phys``)."""

    vmcoreinfo: VmcoreInfo
    phys: Any

    def close(self) -> None:
        """Release the vmcore file (an ``.xz`` one's decompressed spool with it); reads fail afterwards."""
        self.phys.close()

    @property
    def build_id(self) -> str | None:
        """VMCOREINFO ``BUILD-ID``: the vmlinux the vmcore was taken from."""
        return self.vmcoreinfo.get("BUILD-ID") or None

    @property
    def release(self) -> str | None:
        """VMCOREINFO ``OSRELEASE``."""
        return self.vmcoreinfo.get("OSRELEASE")


class VmcoreFile(NamedByVmcoreinfo):
    """A vmcore file as opened before its kernel image is known: its machine's backend, the CPUs'
    ``NT_PRSTATUS`` notes and VMCOREINFO (which name the image: ``BUILD-ID``, ``OSRELEASE``).
    :meth:`VmcoreDump.open` reads the kernel in it with the image."""

    def __init__(self, path: str, phys: Any, backend: "registry.ArchBackend") -> None:
        self.path = path
        self.phys = phys
        self.backend = backend
        self.arch = backend.name
        self.warnings: list[str] = []
        self.vmcoreinfo_text: str = phys.vmcoreinfo or ""
        self.vmcoreinfo = VmcoreInfo.parse(self.vmcoreinfo_text).checked(
            lambda msg: self.warnings.append(f"{path}: {msg}"))
        #: the image :meth:`vmcoreinfo_from_memory` last read VMCOREINFO through, and what it found
        self._from_memory: tuple[Image, tuple[str, str]] | None = None

    @classmethod
    def open(cls, path: str) -> "VmcoreFile":
        """Open a vmcore file of any format :func:`unwind.formats.vmcore.open_vmcore` reads (memory is read lazily)."""
        from .vmcore import VmcoreError, open_vmcore

        try:
            phys = open_vmcore(path)
        except VmcoreError as e:
            raise DumpError(str(e)) from None
        if phys.machine is None:
            raise DumpError(f"{path}: the vmcore does not say which machine it is from")
        try:
            backend = registry.for_machine(phys.machine)
        except registry.ArchError:
            raise DumpError(f"{path}: a vmcore of {phys.machine}, which unwind has no backend for") from None
        if not phys.vmcoreinfo and not backend.vmcoreinfo_in_memory and phys.damage is None:
            raise DumpError(f"{path}: no VMCOREINFO note (QEMU needs -device vmcoreinfo): cannot find the kernel")
        return cls(path, phys, backend)

    def vmcoreinfo_from_memory(self, image: Image) -> tuple[str, str]:
        """VMCOREINFO read from the kernel's memory (QEMU writes none for riscv), and the sentence saying how.

        The image's link-time symbols and BTF locate the kernel's own
        ``vmcoreinfo_note`` (``ArchBackend.vmcoreinfo_from_memory``); a
        ``BUILD-ID`` in it must be the image's. Read once per image: finding the image by it
        (``Session.load``) and reading the kernel through it ask the same.
        """
        if self._from_memory is not None and self._from_memory[0] is image:
            return self._from_memory[1]
        ranges = [(r.start, r.end) for r in self.phys.ranges]
        try:
            info, how = self.backend.vmcoreinfo_from_memory(self.phys, ranges, image.symbols.address, image.btf)
        except registry.ArchError as e:
            if self.phys.damage is None:
                raise DumpError(f"{self.path}: no VMCOREINFO note, and {e}") from None
            raise KernelNotPlaced(f"{self.path}: no VMCOREINFO note, which may be beyond the end of the file (the file "
                                  f"is {self.phys.damage.what}): cannot find the kernel") from None
        except DumpError as e:
            if self.phys.damage is None:
                raise
            raise KernelNotPlaced(f"{self.path}: {e}; the file is {self.phys.damage.what}: the kernel's note may be "
                                  "beyond the end of the file") from None
        build_id = info.get("BUILD-ID")
        if build_id and image.build_id and build_id != image.build_id:
            raise DumpError(f"{self.path}: the kernel's VMCOREINFO names build-id {build_id}, "
                            f"{image.path} is {image.build_id}")
        self._from_memory = (image, ("".join(f"{k}={v}\n" for k, v in info.items()), how))
        return self._from_memory[1]


class VmcoreDump(NamedByVmcoreinfo):
    """A vmcore as replay sees it: the kernel read through its image, complete once made.

    ``memory`` reads kernel virtual addresses (page tables or the direct map
    already applied), ``prstatus`` are the raw ``NT_PRSTATUS`` descriptors in
    file order, ``vmcoreinfo_text`` the VMCOREINFO note, ``symbol`` gives
    runtime addresses and ``btf`` the kernel's types: the CPUs, tasks,
    modules and ftrace trampolines are read when it is made.
    :meth:`open` makes one from a :class:`VmcoreFile` and its image.
    """

    def __init__(self, path: str, backend: "registry.ArchBackend", memory: Any, prstatus: list[bytes],
                 vmcoreinfo_text: str, symbol: Callable[[str], int | None], btf: Btf, *,
                 source: str = "vmcore", phys: Any = None, warnings: Sequence[str] = (),
                 image: "Image | RelocatedImage | None" = None, symbols: SymbolTable | None = None) -> None:
        self.path = path
        #: the image and its symbols at the addresses the kernel ran at (:meth:`open` gives them)
        self.image = image
        self.symbols = symbols
        self.phys = phys
        self.backend = backend
        self.arch = backend.name
        self.memory = memory
        self.vmcoreinfo_text = vmcoreinfo_text
        #: ``warnings`` given first, then what reading the kernel had to skip
        self.warnings: list[str] = list(warnings)
        self.vmcoreinfo = VmcoreInfo.parse(vmcoreinfo_text).checked(lambda msg: self.warnings.append(f"{path}: {msg}"))
        self._prstatus = prstatus
        self.source = source
        self._tasks: list[Task] | None = None
        #: CPU -> why the arch's rule could not give its ``current``
        self._current_unread: dict[int, str] = {}
        try:
            self.kernel = Kernel(memory, btf, symbol, backend.kernel.CONTEXT_MEMBERS)
            self._say_left_out_ram()
            self.cpus: list[CpuState] = self._read_cpus()
            currents = self._currents(self.kernel)
            #: CPU -> the ``task_struct`` of its ``current``, where the arch's rule read it
            self.currents: dict[int, int] = currents
            self._ktasks: list[KernelTask] = self.kernel.tasks(currents, [c.cpu for c in self.cpus],
                                                               self._note_pids(currents))
            self._lost: list[LostTask] = list(self.kernel.lost_tasks)
            self._say_missing_registers()
            modules = self.kernel.modules()
            trampolines: list[FtraceTrampoline] | None = None
            try:
                trampolines = ftrace_trampolines(self.kernel)
            except (MemoryFault, BtfError) as e:
                self.kernel.warnings.append(f"ftrace_ops_list unreadable: {e}")
        except (KernelError, BtfError) as e:
            raise DumpError(f"{path}: {e}") from None
        except MemoryFault as e:
            raise DumpError(f"{path}: kernel structures unreadable: {e}") from None
        #: the kernel's facts as every walk reads them
        self.info = DumpInfo(
            release=self.release, build_id=self.build_id,
            symbols={n: a for n in ("_stext", "_etext", "init_task") if (a := symbol(n)) is not None},
            modules=tuple(modules), bpf_symbols=tuple(self.kernel.bpf_symbols()),
            ftrace_trampolines=None if trampolines is None else tuple(trampolines))
        self.warnings.extend(self.kernel.warnings)

    def _say_left_out_ram(self) -> None:
        """Say once which RAM of the kernel the dump's headers leave out, and have reads there say so.

        The kernel's RAM is its ``System RAM`` (``iomem_resource``), else ``memblock.memory``
        (:mod:`unwind.kernel.ram`), less the crash kernel's reservation, which a kdump leaves out by design.
        Nothing is said when neither map is in the dump (a slice cut before either was read)."""
        if self.phys is None:
            return
        for source, ram_of in (("iomem_resource's System RAM", walk_system_ram_res),
                               ("memblock.memory", for_each_mem_range)):
            try:
                ram = subtract_ranges(ram_of(self.kernel), crash_kernel_ranges(self.kernel))
                break
            except (MemoryFault, KernelError, BtfError, ValueError):
                continue
        else:
            return
        left_out = subtract_ranges(ram, self.phys.described)
        if left_out:
            self.phys.left_out = tuple(left_out)
            total = sum(r.end - r.start for r in left_out)
            self.warnings.append(
                f"{self.path}: the dump's headers leave out {total >> 10} KiB of the kernel's RAM ({source}, the crash "
                "kernel's reservation aside): physical " + ", ".join(f"{r.start:#x}-{r.end:#x}" for r in left_out))

    @classmethod
    def open(cls, vmcore: VmcoreFile, image: Image, symbols: SymbolTable) -> "VmcoreDump":
        """The kernel in ``vmcore`` read through ``image`` and its link-time ``symbols``: VMCOREINFO (from
        memory when the file has none), the KASLR slide, BTF (:func:`kernel_btf`);
        :attr:`image` and :attr:`symbols` are then the image as the kernel ran it."""
        text = vmcore.vmcoreinfo_text
        damage = vmcore.phys.damage  # said once; the walks that reach what is missing stop on it
        warnings = [f"{vmcore.path}: {damage}"] if damage is not None else []
        if not text:
            text, how = vmcore.vmcoreinfo_from_memory(image)
            warnings.append(how)
        info = VmcoreInfo.parse(text).checked(lambda _msg: None)  # the dump made reports what it drops
        slide = kaslr_offset(info, symbols, vmcore.path)
        symbol = runtime_symbols(symbols, slide)
        memory = _virtual_memory(vmcore, info, symbol)
        btf, elsewhere = kernel_btf(vmcore.path, memory, symbol, image)
        if elsewhere is not None:
            warnings.append(elsewhere)
        return cls(vmcore.path, vmcore.backend, memory, [p.desc for p in vmcore.phys.prstatus], text, symbol, btf,
                   source=vmcore.phys.format, phys=vmcore.phys, warnings=warnings,
                   image=RelocatedImage(image, slide) if slide else image,
                   symbols=relocate_symbols(symbols, slide) if slide else symbols)

    @property
    def meta(self) -> dict[str, Any]:
        """The ``UNWIND`` note's keys this vmcore fills (``unwind convert`` writes them; docs/dump-format.md)."""
        return {"format": FORMAT_VERSION, "arch": self.arch, "kernel": {"release": self.release},
                "build_id": self.build_id, "capture": {"tool": self.source}, **note_keys(self.info)}

    @property
    def modules(self) -> tuple[ModuleInfo, ...]:
        """The loaded modules."""
        return self.info.modules

    def task_memory(self, task: Task) -> Any:
        """The memory one walk of ``task`` reads, snapshotted as plain segments: its stacks, and the modules'
        ORC tables (x86-64 ``orc_module_find()`` reads them from memory)."""
        snapshot = getattr(self.memory, "snapshot", None)
        if snapshot is None:
            return self.memory
        tables = [r for m in self.info.modules if m.orc is not None for r in m.orc.ranges()]
        ranges = [(s.low, s.high) for s in task.stacks if s.low] + tables
        snap = snapshot(ranges)
        return Memory(snap.segments, self._holes(snap, ranges))

    def _holes(self, snap: Memory, ranges: list[tuple[int, int]]) -> list[tuple[int, int, type[MemoryFault]]]:
        """The parts of ``ranges`` the snapshot lacks, each with the fault the vmcore gives there
        (a page makedumpfile excluded, a page the page tables do not map, a page past the end of a cut file),
        page by page: one hole may span pages that fault for different reasons."""
        out: list[tuple[int, int, type[MemoryFault]]] = []
        step = 1 << getattr(self.memory, "page_shift", 12)
        for lo, hi in ranges:
            pos = lo
            for start, end in snap.captured(lo, hi) + [(hi, hi)]:
                while pos < start:
                    stop = min(start, (pos // step + 1) * step)
                    try:  # the whole span: a page cut by the end of the file starts with readable bytes
                        self.memory.read(pos, stop - pos)
                        fault: type[MemoryFault] = MemoryFault
                    except MemoryFault as e:
                        fault = type(e)
                    if out and out[-1][1] == pos and out[-1][2] is fault:
                        out[-1] = (out[-1][0], stop, fault)
                    else:
                        out.append((pos, stop, fault))
                    pos = stop
                pos = max(pos, end)
        return out

    # -- CPUs ----------------------------------------------------------------
    def _read_cpus(self) -> list[CpuState]:
        """One :class:`CpuState` per CPU that saved registers, indexed as the kernel numbers CPUs.

        A real crash (VMCOREINFO ``CRASHTIME``) has each CPU's note in its
        ``crash_notes`` buffer, and the file's notes in CPU order when those
        buffers are not in the dump; QEMU numbers its notes ``pr_pid = cpu +
        1``; otherwise (pids that are not distinct CPU numbers + 1) the notes
        are taken in file order.
        """
        by_cpu: dict[int, bytes] = {}
        if self.crashed:
            by_cpu, unread = self._crash_notes(elfcore.elf_prstatus(len(self.backend.prstatus_regs)).sizeof())
            by_cpu = self._notes_of_unread_buffers(by_cpu, unread) if by_cpu else self._notes_in_cpu_order()
        return cpu_states(self.path, self.backend, by_cpu or notes_by_number(self._prstatus))

    @property
    def crashed(self) -> bool:
        """Was the dump written by a crash (``crash_save_vmcoreinfo()`` adds ``CRASHTIME``)? Its notes'
        ``pr_pid`` are then pids; QEMU's ``dump-guest-memory`` writes ``cpu + 1`` there."""
        return "CRASHTIME" in self.vmcoreinfo

    # crash_prepare_elf64_headers() (kernel/crash_core.c): one PT_NOTE per CPU, in CPU order, merged by
    # /proc/vmcore; a CPU that saved nothing adds no note
    def _notes_in_cpu_order(self) -> dict[int, bytes]:
        """The notes of a crash given to the online CPUs in order (to CPUs 0.. when their count differs)."""
        online = self.kernel.online_cpus()
        cpus = online if len(online) == len(self._prstatus) else range(len(self._prstatus))
        return dict(zip(cpus, self._prstatus))

    def _note_pids(self, currents: dict[int, int]) -> dict[int, int]:
        """CPU -> the pid of the task its crash note says ran there (``crash_save_cpu()``'s ``pr_pid``), when
        the notes' pids are pids: a crash's, agreeing with every CPU's ``current`` that can be read."""
        if not self.crashed:
            return {}
        pids = {c.cpu: c.pid for c in self.cpus if c.pid is not None}
        for cpu, addr in currents.items():
            try:
                pid = self.kernel.task(addr).pid
            except (MemoryFault, KernelError, BtfError):
                continue
            if cpu in pids and pids[cpu] != pid:
                self.warnings.append(f"cpu{cpu}: its note names pid {pids[cpu]}, its current is pid {pid}: "
                                     "the notes' pids are not used")
                return {}
        return pids

    def _say_missing_registers(self) -> None:
        """Warn once for each CPU running a task whose registers the dump lacks."""
        saved = {c.cpu for c in self.cpus}
        for t in self._ktasks:
            if t.running_on is not None and t.running_on not in saved:
                self.warnings.append(f"cpu{t.running_on}: no registers in the dump (no NT_PRSTATUS note for it): "
                                     f"pid {t.pid} ({t.comm}) is shown running there, and not walked")

    def _currents(self, k: Kernel) -> dict[int, int]:
        """``current`` of each CPU that saved registers, by the arch's rule (``rq->curr`` lags a switch)."""
        out = {}
        for c in self.cpus:
            try:
                out[c.cpu], _ = self.backend.kernel.current_task(k, c.cpu, c.regs)
            except (MemoryFault, BtfError, KernelError, IndexError) as e:
                self._current_unread[c.cpu] = str(e)
                if not isinstance(e, PerCpuUnread):  # said once, when the offsets were read
                    self.warnings.append(f"cpu{c.cpu}: current unreadable, rq->curr used: {e}")
        return out

    def _current_read(self, cpu: int) -> bool:
        """Was ``cpu``'s current read, by the arch's rule or from its runqueue?"""
        return cpu not in self._current_unread or cpu not in self.kernel.unread_runqueues

    def _cpu_task(self, cpu: CpuState) -> Task:
        """A CPU that saved registers but whose task is unknown (its ``current`` and runqueue unread): listed by its
        CPU and the pid its crash note names, with why it is not walked (its task's stacks are unknown)."""
        current, runqueue = self._current_unread[cpu.cpu], self.kernel.unread_runqueues[cpu.cpu]
        why = f"current: {current}; runqueue: {runqueue}" if current != runqueue else current
        why = f"cpu{cpu.cpu}'s task is unknown ({why}): its stacks are not known"
        return Task(pid=cpu.pid if self.crashed else None, comm="?", state="R", cpu=cpu.cpu, regs=dict(cpu.regs),
                    lacks=Lack(why))

    # crash_save_cpu() (kernel/crash_core.c) writes one note into per_cpu_ptr(crash_notes, cpu)
    def _crash_notes(self, size: int) -> tuple[dict[int, bytes], list[int]]:
        """Each CPU's note in its ``crash_notes`` buffer, and the CPUs whose buffer the dump lacks."""
        k = self.kernel
        ptr = k.symbol("crash_notes")
        if ptr is None:
            return {}, []
        out: dict[int, bytes] = {}
        unread: list[int] = []
        try:
            base = k.read_u64(ptr)
        except MemoryFault:
            return {}, []
        for cpu in range(k.nr_cpus):
            addr = (base + k.per_cpu_offset[cpu]) & (2**64 - 1)
            try:
                hdr = k.read(addr, 12)
                namesz, descsz, ntype = (int.from_bytes(hdr[i:i + 4], "little") for i in (0, 4, 8))
                if namesz == 0 or ntype != elfcore.NT_PRSTATUS or descsz < size or descsz > 4096:
                    continue
                out[cpu] = k.read(addr + 12 + (namesz + 3) // 4 * 4, descsz)
            except MemoryFault:
                unread.append(cpu)
        return out, unread

    # crash_prepare_elf64_headers() (kernel/crash_core.c): the file's notes are the buffers, in CPU order
    def _notes_of_unread_buffers(self, by_cpu: dict[int, bytes], unread: list[int]) -> dict[int, bytes]:
        """``by_cpu`` with the file's notes that are no buffer read given to the CPUs whose buffer the dump lacks,
        in CPU order, when they are as many; else those notes are said and not placed."""
        read = set(by_cpu.values())
        rest = [raw for raw in self._prstatus if raw not in read]
        if rest and len(rest) == len(unread):
            return by_cpu | dict(zip(unread, rest))
        if rest:
            self.warnings.append(f"{len(rest)} NT_PRSTATUS note(s) of the file match no CPU's crash_notes buffer, "
                                 f"and {len(unread)} CPU(s) have a buffer the dump lacks: not placed")
        return by_cpu

    # -- tasks ---------------------------------------------------------------
    def tasks(self) -> list[Task]:
        """Every task in the kernel, running ones first: the CPU that panicked, then the others in CPU
        order (crash's ``bt`` also starts from the panic task)."""
        if self._tasks is None:
            k = self.kernel
            regs = {c.cpu: c for c in self.cpus}
            stacks = {cpu: self._percpu_stacks(k, cpu) for cpu in regs}
            unknown = set(regs) - {t.running_on for t in self._ktasks}  # CPUs whose current was not read
            out = [self._task(k, t, regs, stacks, unknown) for t in self._ktasks]
            out += [self._cpu_task(regs[cpu]) for cpu in sorted(unknown) if not self._current_read(cpu)]
            on = {addr: cpu for cpu, addr in self.currents.items()}
            out += [_lost_task(t, regs.get(on[t.addr]) if t.addr in on else None) for t in self._lost]
            mark_switches(out, self.backend.sp_reg)
            first = self._panic_cpu(k)
            out.sort(key=lambda t: (t.running_cpu is None, t.running_cpu != first, t.running_cpu or 0))
            self._tasks = out
        return self._tasks

    # panic() (kernel/panic.c) claims panic_cpu with atomic_try_cmpxchg(&panic_cpu, PANIC_CPU_INVALID, this_cpu)
    def _panic_cpu(self, k: Kernel) -> int | None:
        """The CPU that called ``panic()``, when ``panic_cpu`` names one that saved registers."""
        addr = k.symbol("panic_cpu")
        if addr is None:
            return None
        try:
            cpu = int.from_bytes(k.read(addr, 4), "little", signed=True)
        except MemoryFault:
            return None
        return cpu if any(c.cpu == cpu for c in self.cpus) else None

    def _percpu_stacks(self, k: Kernel, cpu: int) -> list[StackInfo]:
        try:
            ranges = self.backend.kernel.percpu_stacks(k, cpu)
        except (MemoryFault, BtfError, KernelError) as e:
            self.warnings.append(f"cpu{cpu}: per-CPU stacks unreadable: {e}")
            return []
        out = []
        for kind, lo, hi in ranges:  # from per-CPU pointers: a corrupt one gives no address range
            if 0 <= lo < hi < 2**64:
                out.append(StackInfo(lo, hi, kind, cpu))
            else:
                self.warnings.append(f"cpu{cpu}: {kind} stack [{lo:#x}, {hi:#x}) is no address range: not read")
        return out

    def _task(self, k: Kernel, t: KernelTask, cpus: dict[int, CpuState], percpu: dict[int, list[StackInfo]],
              unknown: set[int]) -> Task:
        extra: dict[str, Any] = {"switches": t.switches}
        cpu = t.running_on if t.running_on in cpus else None
        lacks = None
        if t.running_on is not None and cpu is None:
            lacks = Lack(f"cpu{t.running_on}'s registers are not in the dump (no NT_PRSTATUS note for it)",
                         registers=True)
        elif (what := t.lacks(("stack",) + k.context_members + FGRAPH_MEMBERS)) is not None:
            lacks = Lack(f"task_struct.{what}")
        # task_struct.on_cpu: it may be that CPU's current, whose registers are not its saved context
        stale = cpu is None and t.on_cpu and (t.cpu in unknown or t.cpu not in cpus)
        if stale:
            why = "whose current could not be read" if t.cpu in unknown else "which has no registers in the dump"
            extra["note"] = f"on_cpu on cpu{t.cpu}, {why}: its saved context may be stale"
        if cpu is None and t.on_cpu:  # no CPU's current, yet on_cpu: a CPU is switching to or from it
            extra["on_cpu"] = True
        # a NULL task->stack (an exited task's, freed at its last switch) is kept as the capture keeps it: low 0
        stacks = [StackInfo(t.stack, t.stack + k.thread_size, "task", cpu)]
        if t.stack + k.thread_size >= 2**64:  # task_stack_page() + THREAD_SIZE: the end is an address too
            stacks = []
            why = f"task->stack {t.stack:#x} + THREAD_SIZE runs past the address space: no stack"
            extra["note"] = f"{extra['note']}; {why}" if "note" in extra else why
        context = None
        regs = None
        if cpu is not None:
            regs = dict(cpus[cpu].regs)
            stacks += percpu.get(cpu, [])
        elif not stale and lacks is None:
            try:
                context = self.backend.kernel.blocked_context(k, t.addr, t.data)
            except BtfError as e:
                extra["note"] = f"no saved context: {e}"
        fgraph = k.fgraph(t) if lacks is None else ListRead([], None)
        kretprobes = k.kretprobes(t) if lacks is None else ListRead([], None)
        on = t.running_on if t.running_on is not None else t.cpu
        return Task(pid=t.pid, comm=t.comm, state=t.state, cpu=on if cpu is None else cpu, regs=regs,
                    context=context, stacks=stacks, fgraph=fgraph.entries, kretprobes=kretprobes.entries, extra=extra,
                    lacks=lacks, task_struct=t.addr, ppid=t.ppid, tgid=t.tgid if t.tgid <= PID_MAX_LIMIT else None,
                    kthread=t.kthread, fgraph_lacks=fgraph.lacks, kretprobes_lacks=kretprobes.lacks)

    def kernel_tasks(self) -> list[KernelTask]:
        """The tasks as ``ps`` lists them (``task_struct`` fields)."""
        return list(self._ktasks)

    def oracles(self) -> list[dict[str, Any]]:
        """A vmcore carries no oracle traces."""
        return []


class CpuNotesDump(NamedByVmcoreinfo):
    """A damaged vmcore whose kernel cannot be placed (:class:`KernelNotPlaced`): what its notes say.

    Each CPU that saved registers is listed by its ``NT_PRSTATUS`` note, numbered as
    :func:`notes_by_number` numbers notes, and not walked: without the kernel placed no
    address translates, so no stack of it is known, and registers are not walked over
    stacks that would be guessed. It has the surface of :class:`VmcoreDump`.
    """

    def __init__(self, vmcore: VmcoreFile, why: str) -> None:
        self.path = vmcore.path
        self.phys = vmcore.phys
        self.backend = vmcore.backend
        self.arch = vmcore.arch
        self.source = vmcore.phys.format
        self.image: Image | None = None
        self.symbols: SymbolTable | None = None
        self.memory = Memory(())
        self.vmcoreinfo_text = ""
        self.vmcoreinfo = VmcoreInfo.parse("")
        self.info = DumpInfo()
        self.cpus: list[CpuState] = cpu_states(vmcore.path, vmcore.backend, notes_by_number(
            [p.desc for p in vmcore.phys.prstatus]))
        why = why.removeprefix(f"{vmcore.path}: ")
        damage = vmcore.phys.damage
        self.warnings: list[str] = [*vmcore.warnings, *([f"{vmcore.path}: {damage}"] if damage is not None else []),
                                    f"{vmcore.path}: the kernel is not placed ({why}): its CPUs are listed by their "
                                    "NT_PRSTATUS notes, and none is walked"]

    @classmethod
    def open(cls, vmcore: VmcoreFile, why: str) -> "CpuNotesDump":
        """What ``vmcore``'s notes say, its kernel not placed (``why``); :class:`DumpError` with ``why`` when it
        has no CPU note either: nothing is left to say."""
        if not vmcore.phys.prstatus:
            raise DumpError(why)
        return cls(vmcore, why)

    @property
    def meta(self) -> dict[str, Any]:
        """The ``UNWIND`` note's keys this vmcore fills (``unwind convert``)."""
        return {"format": FORMAT_VERSION, "arch": self.arch, "kernel": {"release": None}, "build_id": None,
                "capture": {"tool": self.source}, **note_keys(self.info)}

    @property
    def modules(self) -> tuple[ModuleInfo, ...]:
        """No module is known."""
        return ()

    def tasks(self) -> list[Task]:
        """Each CPU's unknown task, in CPU order, with its registers and why it is not walked."""
        return [Task(pid=None, comm="?", state="R", cpu=c.cpu, regs=dict(c.regs),
                     lacks=Lack(f"cpu{c.cpu}'s task is unknown (the kernel is not placed: no VMCOREINFO): its stacks "
                                "are not known")) for c in self.cpus]

    def task_memory(self, task: Task) -> Memory:
        """Nothing: no kernel address translates."""
        return self.memory

    def kernel_tasks(self) -> list[KernelTask]:
        """No task list is read."""
        return []

    def oracles(self) -> list[dict[str, Any]]:
        """A vmcore carries no oracle traces."""
        return []


def notes_by_number(prstatus: Sequence[bytes]) -> dict[int, bytes]:
    """The notes by CPU where no ``crash_notes`` buffer places them: QEMU numbers its notes ``pr_pid = cpu + 1``;
    otherwise (pids that are not distinct CPU numbers + 1) they are taken in file order."""
    pids = [_prstatus_pid(raw) for raw in prstatus]
    qemu = len(set(pids)) == len(pids) and all(1 <= p <= MAX_CPUS for p in pids)
    return {(pid - 1 if qemu else i): raw for i, (pid, raw) in enumerate(zip(pids, prstatus))}


def cpu_states(path: str, backend: "registry.ArchBackend", by_cpu: dict[int, bytes]) -> list[CpuState]:
    """One :class:`CpuState` per CPU of ``by_cpu`` (its raw ``NT_PRSTATUS``), in CPU order."""
    names = backend.prstatus_regs
    layout = elfcore.elf_prstatus(len(names))
    out = []
    for cpu in sorted(by_cpu):
        raw = by_cpu[cpu]
        if len(raw) < layout.sizeof():
            raise DumpError(f"{path}: NT_PRSTATUS of cpu{cpu} is {len(raw)} bytes, expected {layout.sizeof()}")
        regs = dict(zip(names, layout.parse(raw).pr_reg))
        pid = _prstatus_pid(raw)  # a pid_t: past PID_MAX_LIMIT (or below 0) it is none (a corrupt note)
        out.append(CpuState(cpu=cpu, regs=regs, pid=pid if 0 <= pid <= PID_MAX_LIMIT else None,
                            mode=backend.kernel.cpu_mode(regs)))
    return out


#: the task_struct members a walk reads besides the stack and the saved context: the return addresses
#: function graph tracing and kretprobes hid
FGRAPH_MEMBERS = ("ret_stack", "curr_ret_stack", "rethooks", "kretprobe_instances")


def _lost_task(t: LostTask, cpu: CpuState | None) -> Task:
    """A ``task_struct`` whose pid or comm the dump lacks: listed by its address, with what is missing; the
    ``current`` of ``cpu`` (its registers there) is listed running on it."""
    if cpu is not None:
        return Task(pid=None, comm="?", state="R", cpu=cpu.cpu, regs=dict(cpu.regs), lacks=Lack(t.why),
                    task_struct=t.addr)
    return Task(pid=None, comm="?", state="?", lacks=Lack(t.why), task_struct=t.addr)


def kaslr_offset(info: VmcoreInfo, symbols: SymbolTable, path: str) -> int:
    """The KASLR slide: ``KERNELOFFSET``, else ``SYMBOL(_stext)`` against the image's ``_stext``."""
    raw = info.get("KERNELOFFSET")
    if raw:
        try:
            return int(raw, 16)
        except ValueError:
            raise DumpError(f"{path}: VMCOREINFO KERNELOFFSET={raw!r} is not hex") from None
    stext = info.get("SYMBOL(_stext)")
    link = symbols.address("_stext")
    if stext and link is not None:
        try:
            return int(stext, 16) - link
        except ValueError:
            pass
    return 0


def _virtual_memory(vmcore: VmcoreFile, info: VmcoreInfo, symbol: Callable[[str], int | None]) -> Any:
    """Kernel virtual memory over the vmcore's physical memory (the arch's page tables)."""
    from .vmcore.virtual import TableWords, VirtualMemory

    return VirtualMemory(vmcore.phys, vmcore.backend.translator(info, TableWords(vmcore.phys), symbol))


def kernel_btf(path: str, memory: Any, symbol: Callable[[str], int | None], image: Image) -> tuple[Btf, str | None]:
    """The kernel's BTF: its own, in the dump, when it reads whole and parses; else the image's ``.BTF`` (a
    dump cut short before it, a page of it left out) with the warning that says where it came from."""
    try:
        return btf_from_memory(path, memory, symbol), None
    except DumpError as e:
        if image.btf is None:
            raise
        why = str(e).removeprefix(f"{path}: ")
        return image.btf, f"{path}: BTF from the image {image.path} ({why})"


def btf_from_memory(path: str, memory: Any, symbol: Callable[[str], int | None]) -> Btf:
    """The kernel's BTF from its own memory (``__start_BTF`` .. ``__stop_BTF``), for an image without ``.BTF``."""
    lo, hi = symbol("__start_BTF"), symbol("__stop_BTF")
    if lo is None or hi is None or not 0 < hi - lo < 1 << 28:
        raise DumpError(f"{path}: no BTF: the image has no .BTF and no __start_BTF/__stop_BTF symbols")
    try:
        return Btf.cached(memory.read(lo, hi - lo))
    except (MemoryFault, BtfError) as e:
        raise DumpError(f"{path}: the kernel's BTF in memory is unusable: {e}") from None
