"""Inside gdb: the kernel's own unwinders as gdb frame unwinders, and ``unwind-bt``/``unwind-ps``.

gdb (on QEMU's gdbstub, a vmcore or one of the project's dumps) gives the
memory (``Inferior.read_memory``) and each CPU's registers (one gdb thread per
CPU; ``PendingFrame.read_register`` while it unwinds). This module presents
them as the project's own inputs, so the walk is the arch backend's, as in
``unwind replay``:

- :class:`GdbMemory` reads kernel virtual memory through gdb and snapshots a
  task's stacks as a :class:`~unwind.core.memory.Memory` (what
  :meth:`VmcoreDump.task_memory` reads);
- :func:`open_session` makes a :class:`~unwind.session.replay.Session`: the
  tasks the note of the project's dump lists when gdb has one open as its
  core, else the tasks read through BTF from the kernel in gdb's memory
  (:mod:`unwind.kernel.model`, as for a vmcore), the CPUs' registers from gdb's threads;
- :class:`FrameUnwinder` walks a CPU with :meth:`Session.replay` from the
  registers of gdb's frame 0 and hands each caller back as gdb's ``UnwindInfo``
  with the registers the walk establishes for it (the backend's ``frame_registers``: pc, sp and the
  frame pointer, the return-address register, every register of a ``pt_regs`` crossed).

Nothing here imports gdb: :func:`install` is given the ``gdb`` module (the
script ``unwind gdb --script`` names calls it), so a stand-in tests the glue.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from unwind.core import registry
from unwind.core.errors import DumpError
from unwind.core.frame import Frame
from unwind.core.memory import Memory, MemoryFault, Segment
from unwind.core.target import Options, Target, Task
from unwind.formats import elfcore
from unwind.formats.dump import Dump, written_by_unwind
from unwind.formats.image import Image, ImageError, open_image
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from unwind.formats.vmdump import VmcoreDump, btf_from_memory, kaslr_offset
from unwind.kernel.btf import BtfError
from unwind.kernel.kaslr import RelocatedImage, relocate_symbols, runtime_symbols
from unwind.kernel.symbols import SymbolTable
from unwind.session.output import replay_text
from unwind.session.replay import ReplayError, Session

#: bytes gdb is asked for at once when a stack is snapshotted, then the pieces tried where that fails
_PAGE = 4096
_PIECES = (512, 64, 8)
#: ``kernel/vmcore_info.c`` (``crash_core.c`` before 6.9): the kernel's own VMCOREINFO text is at most a page
_VMCOREINFO_MAX = 4096
#: the windows around a CPU's pc whose bytes must be the image's at a KASLR slide (offset, size)
_SLIDE_WINDOWS = (-48, -16, 16)
_SLIDE_WINDOW = 16
#: the name gdb lists the unwinder by (``info unwinder``)
UNWINDER_NAME = "unwind-kernel"
#: the gdb parameter naming the kernel image when gdb loaded none (``set unwind-vmlinux IMAGE``)
VMLINUX_PARAMETER = "unwind-vmlinux"
_U64 = (1 << 64) - 1


class GdbError(Exception):
    """What a gdb command reports as one line (raised as ``gdb.GdbError`` by :func:`install`'s commands)."""


class UsageError(GdbError):
    """A command's arguments are wrong: its usage line."""


class GdbMemory:
    """Kernel virtual memory as gdb reads it; a read gdb refuses is a :class:`MemoryFault`."""

    def __init__(self, gdb: Any) -> None:
        self.gdb = gdb

    def read(self, addr: int, size: int) -> bytes:
        """``size`` bytes at ``addr``."""
        if size < 0 or addr < 0 or addr + size > 1 << 64:
            raise MemoryFault(addr, size)
        try:
            return bytes(self.gdb.selected_inferior().read_memory(addr, size))
        except (self.gdb.error, OverflowError, ValueError):
            raise MemoryFault(addr, size) from None

    def read_u64(self, addr: int) -> int:
        """The little-endian 64-bit word at ``addr``."""
        return int.from_bytes(self.read(addr, 8), "little")

    def read_u32(self, addr: int) -> int:
        """The little-endian 32-bit word at ``addr``."""
        return int.from_bytes(self.read(addr, 4), "little")

    def snapshot(self, ranges: Iterable[tuple[int, int]]) -> Memory:
        """The readable bytes of ``ranges`` as plain segments: a page at a time, and where gdb refuses a
        page (a core holds only part of it), its pieces down to single words."""
        found: list[tuple[int, bytes]] = []
        for lo, hi in sorted(set(ranges)):
            pos = lo
            while pos < hi:
                end = min((pos // _PAGE + 1) * _PAGE, hi)
                self._read_piece(pos, end, 0, found)
                pos = end
        return Memory(_merged(found))

    def _read_piece(self, lo: int, hi: int, depth: int, found: list[tuple[int, bytes]]) -> None:
        try:
            found.append((lo, self.read(lo, hi - lo)))
            return
        except MemoryFault:
            if depth == len(_PIECES):
                return
        step = _PIECES[depth]
        pos = lo
        while pos < hi:
            end = min((pos // step + 1) * step, hi)
            self._read_piece(pos, end, depth + 1, found)
            pos = end


def _merged(pieces: list[tuple[int, bytes]]) -> list[Segment]:
    """Adjacent pieces joined into segments (a stack read in pages is one segment)."""
    out: list[Segment] = []
    start, chunks, end = None, [], None
    for addr, data in sorted(pieces, key=lambda p: p[0]):
        if start is not None and addr == end:
            chunks.append(data)
            end += len(data)
            continue
        if start is not None:
            out.append(Segment(start, b"".join(chunks)))
        start, chunks, end = addr, [data], addr + len(data)
    if start is not None:
        out.append(Segment(start, b"".join(chunks)))
    return out


class GdbNoteDump(Dump):
    """One of the project's dumps gdb has open as its core: the tasks its note lists, and the memory it
    captured as gdb reads it (set :attr:`gdb_memory` after :meth:`Dump.open`)."""

    gdb_memory: GdbMemory | None = None
    _through_gdb: Memory | None = None

    def task_memory(self, task: Task) -> Memory:
        """All the dump's captured ranges, read through gdb once (a walk may read past its own stacks, as
        the replay of the file does)."""
        if self.gdb_memory is None:
            return self.memory
        if self._through_gdb is None:
            self._through_gdb = self.gdb_memory.snapshot((s.start, s.end) for s in self.memory.segments)
        return self._through_gdb


# -- what gdb has open ---------------------------------------------------------

_CORE_FILE = re.compile(r"Local core dump file:\s*`(.+?)',")


def core_file(gdb: Any) -> str | None:
    """The core file gdb has open (``info target``), or ``None`` (a live target)."""
    name = getattr(gdb.current_progspace(), "core_filename", None)
    if name:
        return str(name)
    try:
        m = _CORE_FILE.search(gdb.execute("info target", to_string=True))
    except gdb.error:
        return None
    return m.group(1) if m else None


def kernel_image(gdb: Any) -> Image:
    """The kernel image: ``set unwind-vmlinux IMAGE``, else the first file gdb loaded that is one."""
    named = gdb.parameter(VMLINUX_PARAMETER)
    candidates = [named] if named else [o.filename for o in gdb.objfiles() if o.filename]
    problems = []
    for path in candidates:
        try:
            return open_image(Path(path).resolve())
        except ImageError as e:
            problems.append(str(e))
    if named:
        raise GdbError(problems[0])
    raise GdbError("no kernel image: load the vmlinux (or slim image) in gdb (`file IMAGE`) or "
                   f"`set {VMLINUX_PARAMETER} IMAGE`" + (f" ({problems[0]})" if problems else ""))


def thread_cpu(thread: Any) -> int:
    """The CPU a gdb thread is: QEMU's gdbstub and a core's ``NT_PRSTATUS`` (``pr_pid``) number
    them from 1; gdb's own number where the thread has none."""
    lwp = thread.ptid[1] or thread.ptid[2]
    return (lwp or thread.num) - 1


def register_value(value: Any) -> int:
    """A register's ``gdb.Value`` as an unsigned 64-bit number."""
    return int(value) & _U64


def kernel_address(addr: int) -> bool:
    """An address in the kernel's half of the address space: bit 63 set (x86-64's upper canonical half,
    arm64's TTBR1 range, riscv's Sv39/48/57 upper half); a CPU whose pc is not one runs in user mode."""
    return bool(addr >> 63 & 1)


def register_bytes(gdb: Any, value: int, kind: Any) -> Any:
    """``value`` as a ``gdb.Value`` of the register type ``kind``, made from its bytes (a flags or
    segment type accepts no cast from a number); every arch here is little-endian."""
    size = kind.sizeof
    return gdb.Value((value & ((1 << 8 * size) - 1)).to_bytes(size, "little"), kind)


def frame_registers(backend: registry.ArchBackend, read: Callable[[str], Any],
                    error: type[Exception]) -> dict[str, int]:
    """The ``NT_PRSTATUS`` registers of a frame by the backend's names (``read`` takes gdb's name);
    a register gdb does not know is left out."""
    regs = {}
    for name in backend.prstatus_regs:
        try:
            regs[name] = register_value(read(backend.gdb_registers.get(name, name)))
        except (error, ValueError):
            continue
    return regs


def _threads_prstatus(gdb: Any, backend: registry.ArchBackend, switch: bool) -> tuple[list[bytes], list[int]]:
    """One ``NT_PRSTATUS`` per gdb thread (CPU), as QEMU writes them (``pr_pid`` = CPU + 1), and the
    CPUs' pcs; with ``switch``, each thread's registers (gdb's threads are switched to), else zeros and
    no pcs: a frame unwinder must not switch threads, and its own CPU's registers come from its frame."""
    names = backend.prstatus_regs
    out, pcs = [], []
    selected = gdb.selected_thread()
    try:
        for thread in sorted(gdb.selected_inferior().threads(), key=thread_cpu):
            regs: dict[str, int] = {}
            if switch:
                thread.switch()
                regs = frame_registers(backend, gdb.newest_frame().read_register, gdb.error)
                if backend.pc_reg in regs:
                    pcs.append(regs[backend.pc_reg])
            out.append(elfcore.prstatus_bytes(len(names), [regs.get(n, 0) for n in names], thread_cpu(thread) + 1))
    finally:
        if switch and selected is not None:
            selected.switch()
    return out, pcs


# kernel/vmcore_info.c: vmcoreinfo_data holds the text VMCOREINFO notes carry (crash_core.c before 6.9)
def kernel_vmcoreinfo(mem: GdbMemory, symbols: SymbolTable, slide: int = 0) -> str:
    """The kernel's own VMCOREINFO text (``vmcoreinfo_data``, ``vmcoreinfo_size``, at their link address
    plus ``slide``), or ``""``."""
    data, size = symbols.address("vmcoreinfo_data"), symbols.address("vmcoreinfo_size")
    if data is None or size is None:
        return ""
    try:
        n = mem.read_u64(size + slide)
        if not 0 < n <= _VMCOREINFO_MAX:
            return ""
        return mem.read(mem.read_u64(data + slide), n).split(b"\0", 1)[0].decode("ascii", "replace")
    except MemoryFault:
        return ""


def text_slides(mem: GdbMemory, image: Image, pcs: Iterable[int]) -> Iterable[int]:
    """Page-aligned slides that put a CPU's pc in the image's text where the bytes around it are the
    image's (most of the windows: the kernel patches some of its own text), nearest first."""
    lo, hi = image.symbols.address("_stext"), image.symbols.address("_etext")
    if lo is None or hi is None:
        return
    for pc in pcs:
        windows = [pc + d for d in _SLIDE_WINDOWS]
        try:
            here = [mem.read(w, _SLIDE_WINDOW) for w in windows]
        except MemoryFault:
            continue
        link = hi - 1 - ((hi - 1 - pc) % _PAGE)  # the highest link address with the pc's page offset
        while link >= lo:
            slide = pc - link
            if slide >= 0:
                same = sum(image.text(w - slide, _SLIDE_WINDOW) == b for w, b in zip(windows, here))
                if 2 * same > len(windows):
                    yield slide
            link -= _PAGE


# kaslr_offset(), as VMCOREINFO's KERNELOFFSET says it: found through the text at the CPUs' pcs
def kernel_vmcoreinfo_kaslr(mem: GdbMemory, image: Image, pcs: Iterable[int]) -> tuple[str, int]:
    """The kernel's VMCOREINFO text and the KASLR slide, for a kernel not at its link address: the first
    slide of :func:`text_slides` whose ``vmcoreinfo_data`` says ``KERNELOFFSET`` is that slide; ``("", 0)``
    when none does."""
    for slide in text_slides(mem, image, pcs):
        text = kernel_vmcoreinfo(mem, image.symbols, slide)
        raw = VmcoreInfo.parse(text).get("KERNELOFFSET") if text else None
        if raw is not None and raw.strip().lower().removeprefix("0x") == f"{slide:x}":
            return text, slide
    return "", 0


def _kernel_dump(gdb: Any, mem: GdbMemory, image: Image, switch: bool,
                 pc: int | None) -> tuple[VmcoreDump, Image, SymbolTable]:
    """The kernel in gdb's memory as a vmcore is read (tasks through BTF), the CPUs from gdb's threads
    (their registers read with ``switch``; else ``pc`` is the current CPU's)."""
    try:
        backend = registry.for_machine(image.machine)
        symbols = image.symbols
    except (registry.ArchError, ImageError) as e:
        raise GdbError(str(e)) from None
    prstatus, pcs = _threads_prstatus(gdb, backend, switch)
    text = kernel_vmcoreinfo(mem, symbols)
    if not text:  # a KASLR kernel: found where a CPU's pc is in its text
        text, _ = kernel_vmcoreinfo_kaslr(mem, image, [*pcs, *([pc] if pc is not None else [])])
    warnings = [] if text else ["the kernel's VMCOREINFO (vmcoreinfo_data) is unreadable at its link address "
                                "and at any KASLR slide the CPUs' pcs allow: no release, no KASLR offset"]
    path = "the kernel in gdb's memory"
    try:
        slide = kaslr_offset(VmcoreInfo.parse(text).checked(lambda _msg: None), symbols, path)
        symbol = runtime_symbols(symbols, slide)
        btf = image.btf if image.btf is not None else btf_from_memory(path, mem, symbol)
        dump = VmcoreDump(path, backend, mem, prstatus, text, symbol, btf,
                          source="gdb", warnings=warnings,
                          image=RelocatedImage(image, slide) if slide else image,
                          symbols=relocate_symbols(symbols, slide) if slide else symbols)
    except (DumpError, BtfError) as e:
        raise GdbError(str(e)) from None
    return dump, dump.image, dump.symbols  # type: ignore[return-value]


def open_session(gdb: Any, switch: bool = True, pc: int | None = None) -> Session:
    """A :class:`Session` over what gdb has open: the project's dump (its note's tasks, gdb's memory) or
    the kernel itself (live, or a vmcore gdb reads; ``switch``: each CPU's registers read from its thread,
    which a frame unwinder must not do; ``pc``: the current CPU's, which finds a KASLR slide then)."""
    mem = GdbMemory(gdb)
    image = kernel_image(gdb)
    core = core_file(gdb)
    if core is not None and written_by_unwind(core):
        try:
            dump = GdbNoteDump.open(core)
        except DumpError as e:
            raise GdbError(str(e)) from None
        if image.build_id and dump.build_id and image.build_id != dump.build_id:
            raise GdbError(f"{image.path}: build-id {image.build_id} does not match the dump's {dump.build_id}")
        dump.gdb_memory = mem
        session = Session(dump, image, image.symbols)
    else:
        kdump, image, symbols = _kernel_dump(gdb, mem, image, switch, pc)
        session = Session(kdump, image, symbols)  # type: ignore[arg-type]
    session.warnings.extend(session.dump.warnings)
    return session


# -- the frame unwinder ----------------------------------------------------------

@dataclass(slots=True)
class FrameId:
    """gdb's frame id: the attributes ``PendingFrame.create_unwind_info`` reads (``gdb.Value`` each)."""

    sp: Any
    pc: Any


@dataclass(slots=True)
class Walk:
    """One CPU's walk from gdb's frame 0 (by ``backend``, of ``target``), and the stack address gdb
    identifies each frame by."""

    #: frame 0's registers, in ``backend.prstatus_regs`` order (``None``: one gdb could not read)
    key: tuple[int | None, ...]
    backend: registry.ArchBackend
    target: Target
    frames: list[Frame]
    ids: list[int]
    _registers: dict[int, dict[str, int]] = field(default_factory=dict)

    def index(self, regs: dict[str, int]) -> int | None:
        """Which frame has the registers ``regs`` (gdb's, of a pending frame): frame 0's are the walk's
        start; a caller's pc and the sp and frame pointer it was handed are its own."""
        if tuple(regs.get(n) for n in self.backend.prstatus_regs) == self.key:
            return 0 if self.frames and regs.get(self.backend.pc_reg) == self.frames[0].pc else None
        pc = regs.get(self.backend.pc_reg)
        ident = (self.backend.sp_reg, self.backend.fp_reg)
        for i in range(1, len(self.frames)):
            if self.frames[i].pc == pc and all(regs.get(r) == v for r, v in self.registers(i).items() if r in ident):
                return i
        return None

    def registers(self, index: int) -> dict[str, int]:
        """The registers the walk establishes for ``frames[index]`` (:meth:`ArchBackend.frame_registers`)."""
        regs = self._registers.get(index)
        if regs is None:
            regs = self._registers[index] = self.backend.frame_registers(self.frames, index, self.target)
        return regs


def frame_ids(frames: list[Frame]) -> list[int]:
    """Each frame's stack address for gdb's frame id: its sp, made to grow outwards where the walk moves
    to a stack below the last (gdb stops at a caller whose id is inner to its callee's)."""
    out: list[int] = []
    for f in frames:
        here = f.sp if f.sp is not None else f.fp
        last = out[-1] if out else -1
        out.append(here if here is not None and here > last else last + 1)
    return out


class GdbState:
    """What the unwinder and the commands share: the session over gdb's target, made when first needed
    and dropped when the target changes (it runs, a file is loaded, memory or a register is written)."""

    def __init__(self, gdb: Any) -> None:
        self.gdb = gdb
        self._session: Session | None = None
        self._key: tuple[Any, ...] | None = None
        #: the session was made by the unwinder: without the other CPUs' registers
        self._made_unwinding = False
        #: the walk of each thread (by gdb's number) from its frame 0
        self.walks: dict[int, Walk] = {}
        #: set while the session is made: gdb asks the unwinder for frame 0 as its threads are read
        self.busy = False
        #: what :meth:`tell` said last
        self._told: str | None = None
        #: the thread the user had selected when a command started (:func:`through_kernel_cpu` may select
        #: another to read through)
        self.asked_thread: Any = None

    def reset(self, *_: Any) -> None:
        """Forget the session and the walks (a gdb event handler)."""
        self._session = None
        self._key = None
        self._told = None
        self.walks.clear()

    def tell(self, text: str) -> None:
        """Say ``text`` on gdb's stderr once (the unwinder is asked again for every frame gdb shows)."""
        if text != self._told:
            self._told = text
            self.gdb.write(f"{text}\n", self.gdb.STDERR)

    def _target_key(self) -> tuple[Any, ...]:
        gdb = self.gdb
        inferior = gdb.selected_inferior()
        return (inferior.num, inferior.pid, core_file(gdb), tuple(o.filename for o in gdb.objfiles()),
                gdb.parameter(VMLINUX_PARAMETER))

    def session(self, unwinding: bool = False, pc: int | None = None) -> Session:
        """The session over gdb's current target (``unwinding``: asked by the frame unwinder, which must
        leave gdb's threads and frames as they are; ``pc``: its frame's)."""
        key = self._target_key()
        if self._session is None or key != self._key or (self._made_unwinding and not unwinding):
            self.walks.clear()
            self.busy = True
            try:
                self._session = open_session(self.gdb, switch=not unwinding, pc=pc)
            finally:
                self.busy = False
            self._key = key
            self._made_unwinding = unwinding
            if not unwinding:  # frames gdb made while the threads were read
                self.gdb.invalidate_cached_frames()
        return self._session

    def reading_thread(self) -> Any:
        """The thread to read kernel memory through: the selected one when its CPU runs kernel code (its pc
        is a :func:`kernel_address`), else the first such; ``None`` when no CPU does. QEMU's gdbstub reads
        memory through the selected CPU's page tables, which for a CPU in user mode need not map the
        kernel (x86-64 with page table isolation)."""
        gdb = self.gdb
        selected = gdb.selected_thread()
        if selected is None:
            return None
        try:
            backend = registry.for_machine(kernel_image(gdb).machine)
        except (GdbError, ImageError, registry.ArchError):
            return selected  # no kernel to read: the command says why
        pc_name = _gdb_name(backend, backend.pc_reg)
        others = sorted((t for t in gdb.selected_inferior().threads() if t is not selected), key=thread_cpu)
        self.busy = True  # frame 0 of each thread is gdb's own while its pc is read
        try:
            for thread in [selected, *others]:
                thread.switch()
                try:
                    pc = register_value(gdb.newest_frame().read_register(pc_name))
                except (gdb.error, ValueError):
                    continue
                if kernel_address(pc):
                    return thread
            return None
        finally:
            self.busy = False
            selected.switch()
            gdb.invalidate_cached_frames()

    def cpu_task(self, session: Session, cpu: int) -> Task:
        """The task running on ``cpu``."""
        try:
            return session.select(cpu=cpu)[0]
        except ReplayError as e:
            raise GdbError(str(e)) from None


class FrameUnwinder:
    """gdb's frame unwinder for a kernel: every frame the arch's walk of the CPU finds, in order."""

    def __init__(self, state: GdbState) -> None:
        self.name = UNWINDER_NAME
        self.enabled = True
        self.state = state

    def __call__(self, pending: Any) -> Any:
        """The ``UnwindInfo`` of ``pending``, or ``None`` to leave it to gdb's own unwinders (not a frame of
        the walk, or no kernel to walk). gdb's level counts inline frames, the walk does not: a pending
        frame is the walk's frame of its pc and the registers the walk gave it."""
        state = self.state
        if state.busy:
            return None
        gdb = state.gdb
        thread = gdb.selected_thread()
        if thread is None:
            return None
        try:
            walk, regs = self._walk(pending, thread)
        except (GdbError, ReplayError, DumpError, ImageError, registry.ArchError, MemoryFault) as e:
            user = user_mode(pending, thread, gdb)
            state.tell(f"unwind: {e}{f' ({user})' if user else ''}: gdb's own unwinders go on")
            return None
        backend = walk.backend
        pc = regs.get(backend.pc_reg)
        if not walk.frames:  # the kernel walks nothing here (a CPU in user mode): gdb's frame 0 alone
            if tuple(regs.get(n) for n in backend.prstatus_regs) != walk.key or pc is None:
                return None
            sp = regs.get(backend.sp_reg, 0)
            return outermost(gdb, pending, pending.create_unwind_info(FrameId(gdb.Value(sp), gdb.Value(pc))),
                             backend, regs)
        index = walk.index(regs)
        if index is None:
            return None
        frame = walk.frames[index]
        info = pending.create_unwind_info(FrameId(gdb.Value(walk.ids[index]), gdb.Value(frame.pc)))
        if index + 1 == len(walk.frames):
            return outermost(gdb, pending, info, backend, regs)
        save_registers(gdb, pending, info, backend, walk.registers(index + 1))
        return info

    def _walk(self, pending: Any, thread: Any) -> tuple[Walk, dict[str, int]]:
        """The walk of the thread's CPU (from the registers of the first frame gdb asks about after the
        target stopped: its frame 0), and ``pending``'s registers."""
        state = self.state
        try:
            pc: int | None = register_value(pending.read_register("pc"))  # gdb's $pc on every arch
        except (state.gdb.error, ValueError):
            pc = None
        session = state.session(unwinding=True, pc=pc)
        backend = session.backend
        regs = frame_registers(backend, pending.read_register, state.gdb.error)
        walk = state.walks.get(thread.num)
        if walk is not None:
            return walk, regs
        task = state.cpu_task(session, thread_cpu(thread)).replace(regs=regs)
        replay = session.replay(task, Options(), symbolize=False)
        frames = replay.frames
        key = tuple(regs.get(n) for n in backend.prstatus_regs)
        walk = state.walks[thread.num] = Walk(key, backend, replay.target, frames, frame_ids(frames))
        return walk, regs


def user_mode(pending: Any, thread: Any, gdb: Any) -> str | None:
    """What to say when ``pending`` (a frame gdb could not have walked) is a CPU running user code: the
    kernel is not walked there, and QEMU's gdbstub may not read kernel memory through that CPU."""
    try:
        pc = register_value(pending.read_register("pc"))
    except (gdb.error, ValueError):
        return None
    return None if kernel_address(pc) else f"cpu{thread_cpu(thread)} runs user code (pc {pc:#x})"


def _gdb_name(backend: registry.ArchBackend, reg: str) -> str:
    return backend.gdb_registers.get(reg, reg)


def save_registers(gdb: Any, pending: Any, info: Any, backend: registry.ArchBackend, regs: dict[str, int]) -> None:
    """Hand the caller ``regs`` (by the backend's names) in ``info``, each as gdb's type of that register."""
    for reg, value in regs.items():
        name = _gdb_name(backend, reg)
        try:
            kind = pending.read_register(name).type
        except (gdb.error, ValueError):
            continue  # a register gdb does not have for this target (orig_rax on QEMU's stub)
        info.add_saved_register(name, register_bytes(gdb, value, kind))


def outermost(gdb: Any, pending: Any, info: Any, backend: registry.ArchBackend, regs: dict[str, int]) -> Any:
    """``info`` of the walk's last frame, made to end gdb's backtrace there. gdb's Python API has no way to
    say "outermost" (``create_unwind_info`` makes only a valid frame id; ``UNWIND_OUTERMOST`` needs gdb's
    ``outer_frame_id``), and a caller without a saved pc is an error to gdb (``frame_unwind_pc``: "PC not
    saved", which aborts ``thread apply all bt``). So the caller is handed the frame's own registers: the
    unwinder gives it the same frame id, and gdb's cycle check ends the walk (``UNWIND_SAME_ID``)."""
    save_registers(gdb, pending, info, backend, regs)
    return info


# -- the commands ------------------------------------------------------------------

BT_USAGE = "usage: unwind-bt [PID|all] [--complete] [--explain]"


def unwind_bt(state: GdbState, argument: str) -> list[str]:
    """``unwind-bt [PID|all] [--complete] [--explain]``: the trace the kernel prints for the task running
    on the selected thread's CPU, the task ``PID`` (a blocked one too) or every task."""
    try:
        words = shlex.split(argument)
    except ValueError as e:
        raise UsageError(f"{e}; {BT_USAGE}") from None
    flags = {w for w in words if w.startswith("--")}
    which = [w for w in words if not w.startswith("--")]
    if flags - {"--complete", "--explain"} or len(which) > 1 or (which and which[0] != "all"
                                                                 and not which[0].isdigit()):
        raise UsageError(BT_USAGE)
    session = state.session()
    options = Options(complete="--complete" in flags, record="--explain" in flags)
    try:
        if not which:
            thread = state.asked_thread or state.gdb.selected_thread()
            if thread is None:
                raise GdbError("no thread selected: give a PID")
            tasks = [state.cpu_task(session, thread_cpu(thread))]
        else:
            tasks = session.select(every=True) if which[0] == "all" else session.select(pid=int(which[0]))
        out: list[str] = [f"unwind: warning: {w}" for w in session.warnings]
        for task in tasks:
            out.extend(replay_text(session, session.replay(task, options), "--explain" in flags))
    except ReplayError as e:
        raise GdbError(str(e)) from None
    return out


def unwind_ps(state: GdbState, argument: str) -> list[str]:
    """``unwind-ps``: the task list, as ``unwind ps`` prints it."""
    from .tasks import ps_lines

    if argument.strip():
        raise UsageError("usage: unwind-ps")
    return ps_lines(state.session())


#: why a read through gdb fails when no CPU runs kernel code
USER_MODE_REASON = ("no CPU is in kernel mode, and QEMU's gdbstub reads memory through the selected CPU's page "
                    "tables, which in user mode need not map the kernel: stop the guest while a CPU runs kernel "
                    "code (e.g. `hbreak` on a kernel function, or interrupt it again)")


def through_kernel_cpu(state: GdbState, run: Callable[[GdbState, str], list[str]], argument: str) -> list[str]:
    """``run(state, argument)`` reading through a CPU in kernel mode (:meth:`GdbState.reading_thread`,
    selected for the command, the user's thread selected again after). When no CPU runs kernel code on a
    live target, one line says why reads may fail: an error's own line, or a warning before the output
    (what could not be read is shown as unknown)."""
    gdb = state.gdb
    asked = gdb.selected_thread()
    reader = state.reading_thread()
    state.asked_thread = asked
    if reader is not None and reader is not asked:
        reader.switch()
    try:
        lines = run(state, argument)
        if reader is None and asked is not None and core_file(gdb) is None:  # live: what was unread, and why
            lines = [f"unwind: warning: {USER_MODE_REASON}", *lines]
        return lines
    except (MemoryFault, DumpError, BtfError) as e:
        raise GdbError(f"{e}" + ("" if reader is not None else f" ({USER_MODE_REASON})")) from None
    except UsageError:
        raise
    except GdbError as e:
        if reader is None and asked is not None:
            raise GdbError(f"{e} ({USER_MODE_REASON})") from None
        raise
    finally:
        state.asked_thread = None
        if asked is not None and gdb.selected_thread() is not asked:
            asked.switch()


def install(gdb: Any) -> GdbState:
    """Register the unwinder, the ``unwind-bt`` and ``unwind-ps`` commands and the ``unwind-vmlinux``
    parameter in ``gdb``; the state they share."""
    state = GdbState(gdb)

    class Vmlinux(gdb.Parameter):  # type: ignore[name-defined,misc]
        """The kernel image (vmlinux or slim) unwind reads symbols, ORC and BTF from, when it is not
        the file gdb loaded."""

        set_doc = "Set the kernel image unwind reads."
        show_doc = "Show the kernel image unwind reads."

        def __init__(self) -> None:
            super().__init__(VMLINUX_PARAMETER, gdb.COMMAND_FILES, gdb.PARAM_OPTIONAL_FILENAME)

        def get_set_string(self) -> str:
            state.reset()
            return ""

    def command(name: str, run: Callable[[GdbState, str], list[str]], doc: str) -> None:
        class Command(gdb.Command):  # type: ignore[name-defined,misc]
            __doc__ = doc

            def __init__(self) -> None:
                super().__init__(name, gdb.COMMAND_STACK)

            def invoke(self, argument: str, from_tty: bool) -> None:
                try:
                    lines = through_kernel_cpu(state, run, argument)
                except GdbError as e:
                    raise gdb.GdbError(str(e)) from None
                gdb.write("".join(f"{line}\n" for line in lines))

        Command()

    Vmlinux()
    command("unwind-bt", unwind_bt, f"The kernel's trace of a task.\n{BT_USAGE}\nWithout PID: the task "
            "running on the selected thread's CPU; all: every task, blocked ones too.")
    command("unwind-ps", unwind_ps, "The kernel's tasks: pid, CPU, task_struct, state, comm (> running).")
    for event in ("cont", "new_objfile", "clear_objfiles", "memory_changed", "register_changed", "exited"):
        registry_of = getattr(gdb.events, event, None)
        if registry_of is not None:
            registry_of.connect(state.reset)
    unwinder = type("KernelUnwinder", (FrameUnwinder, gdb.unwinder.Unwinder), {})(state)
    gdb.unwinder.register_unwinder(None, unwinder, replace=True)
    return state
