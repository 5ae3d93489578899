"""The dump format: an ELF64 core file that readelf, gdb and drgn can open.

See ``docs/dump-format.md``. A dump holds one ``PT_LOAD`` per captured range
at its kernel virtual address, an ``NT_PRSTATUS`` per CPU (the i-th note is
CPU i), the kernel's ``VMCOREINFO`` note, and one note of ours holding JSON
(stack ranges, tasks, symbols hints, capture details, oracle traces).
Files ending ``.xz`` or ``.gz`` are (de)compressed transparently.
"""

from __future__ import annotations

import copy
import gzip
import lzma
import os
import stat
import zlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from construct import ConstructError

from . import elfcore
from unwind.core import registry
from unwind.core.errors import DumpError
from unwind.core.dumpinfo import DumpInfo
from unwind.core.memory import ARENA, ExcludedPage, LeftOut, Memory, MemoryFault, NotMapped
from .note import U64_MAX, Note, NoteError, note_bytes, read_note
from .note_info import dump_info
from .vmcore.notes import NoteError as ElfNoteError
from .vmcore.errors import TruncatedFault
from .vmcore.notes import parse_notes
from .vmcore.vmcoreinfo import VmcoreInfo
from unwind.core.stackinfo import StackInfo
from unwind.core.target import FgraphEntry, KretprobeInstance, Lack, Task

FORMAT_VERSION = 1


class NotADump(DumpError):
    """The file is a vmcore (compressed, or too large for a dump), not one of the project's dumps."""


#: the most a compressed dump may decompress to: the project's dumps are a few MB (a vmcore is not one)
MAX_DUMP_BYTES = 256 << 20


@dataclass(slots=True)
class CpuState:
    """One CPU at the stop: its registers and what the capture knew of it."""

    cpu: int
    regs: dict[str, int]
    pid: int | None = None
    mode: str = "kernel"
    sysregs: dict[str, int] | None = None
    normalised: str | None = None


#: the faults the note's ``holes[]`` name: why the source (a vmcore ``unwind convert`` read) lacked a range
HOLE_FAULTS: dict[str, type[MemoryFault]] = {"missing": MemoryFault, "excluded": ExcludedPage,
                                             "not_mapped": NotMapped, "truncated": TruncatedFault,
                                             "left_out": LeftOut}


def hole_fault_name(fault: type[MemoryFault]) -> str:
    """The ``holes[].fault`` name of ``fault``: its own, else its nearest base's."""
    return next(name for cls in fault.__mro__ for name, f in HOLE_FAULTS.items() if f is cls)


def _backend(arch: "str | registry.ArchBackend") -> registry.ArchBackend:
    return registry.get(arch) if isinstance(arch, str) else arch


class DumpWriter:
    """Build a dump: memory ranges, CPU registers, VMCOREINFO text and the JSON note."""

    def __init__(self, arch: "str | registry.ArchBackend") -> None:
        self.backend = _backend(arch)
        self._ranges: dict[int, bytearray] = {}
        self.cpus: list[tuple[int, dict[str, int], int | None]] = []
        self.vmcoreinfo: str = ""
        self.meta: dict[str, Any] = {"format": FORMAT_VERSION, "arch": self.backend.name}
        #: the note's bytes as given instead of ``meta`` validated and serialised (tests and the
        #: fuzzer write malformed notes with it)
        self.note_json: bytes | None = None

    def add_memory(self, addr: int, data: bytes) -> None:
        """Capture ``data`` at ``addr``; overlapping ranges must agree and are merged."""
        if not data:
            return
        new = bytearray(data)
        start, end = addr, addr + len(data)
        for s in sorted(self._ranges):
            old = self._ranges[s]
            e = s + len(old)
            if e < start or s > end:
                continue
            lo, hi = max(s, start), min(e, end)
            if old[lo - s:hi - s] != new[lo - start:hi - start]:
                raise ValueError(f"conflicting bytes captured at {lo:#x}")
            merged_start = min(s, start)
            merged = bytearray(max(e, end) - merged_start)
            merged[s - merged_start:e - merged_start] = old
            merged[start - merged_start:end - merged_start] = new
            del self._ranges[s]
            new, start, end = merged, merged_start, merged_start + len(merged)
        self._ranges[start] = new

    def add_cpu(self, cpu: int, regs: dict[str, int], pid: int | None = None) -> None:
        """Registers of CPU ``cpu`` by name (names missing from the layout are ignored)."""
        self.cpus.append((cpu, dict(regs), pid))

    def to_bytes(self) -> bytes:
        """The ELF core as bytes."""
        names = self.backend.prstatus_regs
        notes = b""
        for cpu, regs, _pid in sorted(self.cpus, key=lambda c: c[0]):
            pr = elfcore.prstatus_bytes(len(names), [regs.get(n, 0) & (2**64 - 1) for n in names], cpu + 1)
            notes += elfcore.note("CORE", elfcore.NT_PRSTATUS, pr)
        if self.vmcoreinfo:
            notes += elfcore.note(elfcore.VMCOREINFO_NOTE_NAME, elfcore.VMCOREINFO_NOTE_TYPE,
                                  self.vmcoreinfo.encode())
        notes += elfcore.note(elfcore.UNWIND_NOTE_NAME, elfcore.NT_UNWIND_META,
                              note_bytes(self.meta) if self.note_json is None else self.note_json)

        loads = sorted(self._ranges.items())
        phnum = 1 + len(loads)
        offset = elfcore.Elf64_Ehdr.sizeof() + phnum * elfcore.Elf64_Phdr.sizeof()
        phdrs = [dict(p_type=elfcore.PT_NOTE, p_flags=0, p_offset=offset, p_vaddr=0, p_paddr=0,
                      p_filesz=len(notes), p_memsz=0, p_align=4)]
        body = [notes]
        offset += len(notes)
        for addr, data in loads:
            pad = -offset % 8
            body.append(bytes(pad))
            offset += pad
            phdrs.append(dict(p_type=elfcore.PT_LOAD, p_flags=elfcore.PF_R | elfcore.PF_W, p_offset=offset,
                              p_vaddr=addr, p_paddr=0, p_filesz=len(data), p_memsz=len(data), p_align=8))
            body.append(bytes(data))
            offset += len(data)
        ehdr = elfcore.Elf64_Ehdr.build(dict(
            e_type=elfcore.ET_CORE, e_machine=self.backend.e_machine, e_version=1, e_entry=0,
            e_phoff=elfcore.Elf64_Ehdr.sizeof(), e_shoff=0, e_flags=self.backend.e_flags,
            e_ehsize=elfcore.Elf64_Ehdr.sizeof(), e_phentsize=elfcore.Elf64_Phdr.sizeof(), e_phnum=phnum,
            e_shentsize=0, e_shnum=0, e_shstrndx=0))
        return ehdr + b"".join(elfcore.Elf64_Phdr.build(p) for p in phdrs) + b"".join(body)

    def write(self, path: str | Path) -> None:
        """Write the dump, compressed when ``path`` ends in ``.xz`` or ``.gz``."""
        data = self.to_bytes()
        p = str(path)
        if p.endswith(".xz"):
            data = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
        elif p.endswith(".gz"):
            data = gzip.compress(data, 9, mtime=0)
        Path(path).write_bytes(data)


def written_by_unwind(path: str | Path) -> bool:
    """Does ``path`` start as :class:`DumpWriter` writes a dump: an uncompressed ELF file whose first program
    header is a ``PT_NOTE`` holding the ``UNWIND`` note? Reads that header and its notes only; ``False``
    settles nothing (another file, or a dump written otherwise)."""
    try:
        with open(path, "rb") as f:
            head = f.read(elfcore.Elf64_Ehdr.sizeof())
            if head[:4] != b"\x7fELF" or len(head) < elfcore.Elf64_Ehdr.sizeof() or head[4:6] != b"\x02\x01":
                return False
            elf = elfcore.file_header(head)
            if elf["e_phnum"] == 0 or elf["e_phentsize"] != elfcore.Elf64_Phdr.sizeof():
                return False
            f.seek(elf["e_phoff"])
            first = elfcore.program_headers(f.read(elfcore.Elf64_Phdr.sizeof()), 0, 1)[0]
            if first["p_type"] != elfcore.PT_NOTE or first["p_offset"] + first["p_filesz"] > os.fstat(f.fileno()).st_size:
                return False
            f.seek(first["p_offset"])
            return any(note.name == elfcore.UNWIND_NOTE_NAME for note in parse_notes(f.read(first["p_filesz"])))
    except Exception:  # noqa: BLE001 - any trouble reading it: not settled here, the full checks decide
        return False


_XZ_MAGIC = b"\xfd7zXZ\x00"
_GZIP_MAGIC = b"\x1f\x8b"
#: the most of a file's start read to find its notes (QEMU ``-p`` vmcores have megabytes of program headers)
MAX_NOTES_END = 64 << 20


class _DumpFile:
    """A dump file read from its start: decompressed (xz, gzip) only as far as it is asked for, and on from
    there, so that its notes are read before it is read whole (:func:`_note_names`) and no byte is
    decompressed twice."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "rb")
        try:
            st = os.fstat(self._file.fileno())
            magic = self._file.read(len(_XZ_MAGIC))
            self._file.seek(0)
        except OSError:
            self._file.close()
            raise
        self._xz = lzma.LZMADecompressor(lzma.FORMAT_XZ) if magic == _XZ_MAGIC else None
        self._gzip = gzip.GzipFile(fileobj=self._file) if magic.startswith(_GZIP_MAGIC) else None
        #: the size of a regular file that is not compressed (``None``: not known unread, as a device's is not)
        self.size = st.st_size if stat.S_ISREG(st.st_mode) and not self.compressed else None
        self._out = bytearray()
        #: why decompressing stopped short (its error), once it has
        self._error: Exception | None = None

    @property
    def compressed(self) -> bool:
        """Is the file xz or gzip?"""
        return self._xz is not None or self._gzip is not None

    def close(self) -> None:
        """Close the file (and its gzip reader)."""
        if self._gzip is not None:
            self._gzip.close()
        self._file.close()

    def _read_to(self, size: int) -> None:
        """Decompress (or read) until ``size`` bytes are out, the data ends, or decompressing fails."""
        out, dec = self._out, self._xz
        try:
            if dec is not None:
                while len(out) < size and not dec.eof:
                    raw = b""
                    if dec.needs_input:
                        raw = self._file.read(1 << 16)
                        if not raw:
                            break  # cut short: decompressing ends here (:meth:`whole` says so)
                    out += dec.decompress(raw, max_length=size - len(out))
            else:
                stream = self._gzip if self._gzip is not None else self._file
                while len(out) < size:
                    chunk = stream.read(min(size - len(out), 1 << 20))
                    if not chunk:
                        break
                    out += chunk
        except (lzma.LZMAError, EOFError, OSError, zlib.error) as e:  # OSError: a read, or no gzip data
            self._error = e

    def head(self, size: int) -> bytes:
        """The first ``size`` bytes, decompressed (fewer where the data ends; none where decompressing failed)."""
        if self._error is None:
            self._read_to(size)
        return b"" if self._error is not None else bytes(self._out[:size])

    def whole(self) -> bytes:
        """Every byte, decompressed; a compressed file that is corrupt, cut short or larger than any dump is
        refused (:class:`~unwind.core.errors.DumpError`, :class:`NotADump`)."""
        if self.size is not None and self.size > MAX_DUMP_BYTES:
            raise NotADump(f"{self.path}: {self.size} bytes, more than {MAX_DUMP_BYTES >> 20} MiB: not a dump")
        if self.size is not None and self._error is None:  # not compressed: read whole at once (one copy)
            try:
                self._file.seek(0)
                return self._file.read()
            except OSError as e:
                self._error = e
        if self._error is None:
            self._read_to(MAX_DUMP_BYTES + 1)
        if isinstance(self._error, OSError) and not isinstance(self._error, gzip.BadGzipFile):
            raise DumpError(f"cannot read {self.path}: {self._error.strerror}")
        if self._error is not None:
            raise DumpError(f"{self.path}: corrupt compressed dump: {self._error}")
        if len(self._out) > MAX_DUMP_BYTES:
            raise NotADump(f"{self.path}: {'decompresses to ' if self.compressed else ''}more than "
                           f"{MAX_DUMP_BYTES >> 20} MiB: not a dump")
        if self._xz is not None and not self._xz.eof:
            raise DumpError(f"{self.path}: corrupt compressed dump: the xz stream is truncated")
        return bytes(self._out)


def file_start(path: str, size: int) -> bytes:
    """The first ``size`` bytes of the file at ``path``, decompressed when it is xz or gzip (fewer where it ends;
    none where decompressing fails); ``OSError`` where it cannot be opened."""
    file = _DumpFile(path)
    try:
        return file.head(size)
    finally:
        file.close()


def _note_names(file: _DumpFile) -> set[tuple[str, int]] | None:
    """The (name, type) of every note of the ELF core ``file``, from its headers and notes only (decompressed
    as far as they go); ``None`` when they do not settle it (not a 64-bit little-endian ELF, headers or notes
    past :data:`MAX_NOTES_END` or the file's end, a malformed note)."""
    ehdr = file.head(elfcore.Elf64_Ehdr.sizeof())
    if len(ehdr) < elfcore.Elf64_Ehdr.sizeof() or ehdr[:4] != b"\x7fELF" or ehdr[4:6] != b"\x02\x01":
        return None
    elf = elfcore.file_header(ehdr)
    phnum, phoff = elf["e_phnum"], elf["e_phoff"]
    if elf["e_phentsize"] != elfcore.Elf64_Phdr.sizeof() or phoff + phnum * elf["e_phentsize"] > MAX_NOTES_END:
        return None
    head = file.head(phoff + phnum * elf["e_phentsize"])
    if len(head) < phoff + phnum * elf["e_phentsize"]:
        return None
    notes = [(p["p_offset"], p["p_filesz"]) for p in elfcore.program_headers(head, phoff, phnum)
             if p["p_type"] == elfcore.PT_NOTE and p["p_filesz"]]
    end = max((o + n for o, n in notes), default=0)
    if end > MAX_NOTES_END:
        return None
    head = file.head(end)
    if len(head) < end:
        return None
    try:
        return {(n.name, n.type) for o, sz in notes for n in parse_notes(head[o:o + sz])}
    except ElfNoteError:
        return None


def _a_vmcore_by_its_notes(names: set[tuple[str, int]]) -> bool:
    """Are ``names`` a kernel's notes (``NT_PRSTATUS`` or ``VMCOREINFO``) without an ``UNWIND`` note?"""
    return (not any(name == elfcore.UNWIND_NOTE_NAME for name, _ in names)
            and any(name == elfcore.VMCOREINFO_NOTE_NAME or (name == "CORE" and t == elfcore.NT_PRSTATUS)
                    for name, t in names))


def _head_refusal(file: _DumpFile, names: set[tuple[str, int]] | None) -> DumpError | None:
    """Why a file is no dump, told from its start alone (its ELF header, program headers and notes), so that it
    is refused before it is read whole: a vmcore (:class:`NotADump`), an ELF core without the ``UNWIND`` note, an
    ELF header the dump reader refuses, an uncompressed file that does not start as ELF. ``None`` when the start
    does not settle it."""
    path = file.path
    if names is not None:
        if _a_vmcore_by_its_notes(names):
            return NotADump(f"{path}: a vmcore without the UNWIND note (give it to Session.load or the "
                            "commands, which read vmcores)")
        if not any(name == elfcore.UNWIND_NOTE_NAME for name, _ in names):
            return DumpError(f"{path}: missing the UNWIND note (not a dump written by unwind)")
        return None
    head = file.head(elfcore.Elf64_Ehdr.sizeof())
    if head[:4] != b"\x7fELF":
        if file.compressed:
            return None  # its start did not decompress: reading the whole says why
        return DumpError(f"{path}: not an ELF file")
    try:
        _checked_elf_header(head, path, file.size)
    except DumpError as e:
        return e
    return None


def _checked_elf_header(data: bytes, path: str, size: int | None) -> tuple[dict[str, int], registry.ArchBackend]:
    """The ELF header's fields and the arch of its machine, checked before the program headers are read
    (``size``: the file's, when known, for the program headers' end)."""
    if data[:4] != b"\x7fELF":
        raise DumpError(f"{path}: not an ELF file")
    if len(data) < elfcore.Elf64_Ehdr.sizeof():
        raise DumpError(f"{path}: truncated ELF header")
    if data[4] != 2:
        raise DumpError(f"{path}: not a 64-bit ELF (class {data[4]})")
    if data[5] != 1:
        raise DumpError(f"{path}: not little-endian")
    elf = elfcore.file_header(data)
    if elf["e_type"] != elfcore.ET_CORE:
        raise DumpError(f"{path}: not an ELF core file (e_type {elf['e_type']})")
    try:
        backend = registry.for_e_machine(elf["e_machine"])
    except registry.ArchError as e:
        raise DumpError(f"{path}: unknown machine {elf['e_machine']}"
                        + (f" ({e})" if registry.no_backend_found() else "")) from None
    if elf["e_phentsize"] != elfcore.Elf64_Phdr.sizeof():
        raise DumpError(f"{path}: e_phentsize is {elf['e_phentsize']}, not {elfcore.Elf64_Phdr.sizeof()}")
    if size is not None and elf["e_phoff"] + elf["e_phnum"] * elf["e_phentsize"] > size:
        raise DumpError(f"{path}: truncated: program headers past the end of the file")
    return elf, backend


class Dump:
    """A dump opened for replay: its container checked, its note validated (:mod:`unwind.formats.note`)."""

    def __init__(self, data: bytes, path: str = "<bytes>", note_cache: bool = False) -> None:
        """``note_cache``: read the note from the cache of validated notes when it was validated before
        (:func:`unwind.formats.note.read_note`; :meth:`open` uses it)."""
        self.path = path
        self._note_cache = note_cache
        #: malformed optional parts dropped at open (the walk goes on without them)
        self.warnings: list[str] = []
        try:
            self._parse(data)
        except NoteError as e:
            raise DumpError(f"{path}: malformed UNWIND note: {e}") from None
        except (ElfNoteError, ConstructError, UnicodeDecodeError) as e:
            raise DumpError(f"{path}: malformed ELF container: {_error_text(e)}") from None

    @classmethod
    def open(cls, path: str | Path) -> "Dump":
        """Open a dump file (``.xz``/``.gz`` accepted).

        A file is refused before it is read whole when its start settles it (:func:`_head_refusal`): a
        vmcore (:class:`NotADump`: an ELF core whose notes are a kernel's and hold no ``UNWIND`` note), an
        ELF core without the ``UNWIND`` note, a broken ELF header, an uncompressed file that does not start
        as ELF; and an uncompressed file larger than any dump. A file whose size is not known (a device) is
        read no further than the largest dump.
        """
        try:
            file = _DumpFile(str(path))
        except OSError as e:
            raise DumpError(f"cannot read {path}: {e.strerror}") from None
        try:
            refused = _head_refusal(file, _note_names(file))
            if refused is not None:
                raise refused
            data = file.whole()
        finally:
            file.close()
        return cls(data, str(path), note_cache=True)

    def _warn(self, msg: str) -> None:
        self.warnings.append(f"{self.path}: {msg}")

    def _parse(self, data: bytes) -> None:
        elf = self._elf_header(data)
        prstatus: list[bytes] = []
        self.vmcoreinfo_text = ""
        meta_raw: bytes | None = None
        loads: list[tuple[int, int, int]] = []  # each PT_LOAD's address and bytes in the file
        for seg in elfcore.program_headers(data, elf["e_phoff"], elf["e_phnum"]):
            end = seg["p_offset"] + seg["p_filesz"]
            if end > len(data):
                raise DumpError(f"{self.path}: truncated: segment at {seg['p_vaddr']:#x} ends past the file")
            if seg["p_type"] == elfcore.PT_LOAD:
                if seg["p_vaddr"] + seg["p_filesz"] > U64_MAX:  # every segment's end is a u64 address
                    raise DumpError(f"{self.path}: PT_LOAD at {seg['p_vaddr']:#x} runs to the end of the 64-bit "
                                    "address space")
                loads.append((seg["p_vaddr"], seg["p_offset"], end))
            elif seg["p_type"] == elfcore.PT_NOTE:
                for note in parse_notes(data[seg["p_offset"]:end]):
                    if note.type == elfcore.NT_PRSTATUS and note.name == "CORE":
                        prstatus.append(note.desc)
                    elif note.name == elfcore.VMCOREINFO_NOTE_NAME:
                        self.vmcoreinfo_text = note.desc.split(b"\0", 1)[0].decode("ascii", "replace")
                    elif note.name == elfcore.UNWIND_NOTE_NAME:
                        meta_raw = note.desc
        if meta_raw is None:
            if self.vmcoreinfo_text or prstatus:
                raise NotADump(f"{self.path}: a vmcore without the UNWIND note (give it to Session.load or the "
                               "commands, which read vmcores)")
            raise DumpError(f"{self.path}: missing the UNWIND note (not a dump written by unwind)")
        try:
            self.memory = Memory(ARENA.segments(memoryview(data), loads))
        except ValueError as e:
            raise DumpError(f"{self.path}: {e}") from None
        #: the note's JSON as the file holds it, less dropped keys (what a writer copies; walks read :attr:`info`)
        self.meta: dict[str, Any]
        self.note: Note
        self.meta, self.note, self._task_keys = read_note(meta_raw.rstrip(b"\0"), self.backend.context_keys,
                                                           self._warn, self._note_cache)
        if self.note["arch"] != self.arch:
            raise DumpError(f"{self.path}: note says arch {self.note['arch']} but the ELF machine is {self.arch}")
        self.vmcoreinfo: VmcoreInfo = VmcoreInfo.parse(self.vmcoreinfo_text).checked(self._warn)
        release = self.note["kernel"]["release"] or self.vmcoreinfo.get("OSRELEASE")
        #: the note's facts as typed values, what the walks read (``Target.info``)
        self.info: DumpInfo = dump_info(self.note, release)
        if self.note["holes"]:
            self.memory = Memory(self.memory.segments, [(h["low"], h["high"], HOLE_FAULTS[h["fault"]])
                                                        for h in self.note["holes"]])
        self.cpus: list[CpuState] = self._cpus(prstatus)
        self._tasks: list[Task] = [self._task(t) for t in self.note["tasks"]]
        self._tasks.sort(key=lambda t: (not t.running, t.running_cpu or 0))
        mark_switches(self._tasks, self.backend.sp_reg)  # a capture's on_cpu tasks (convert wrote the pairs too)

    def _elf_header(self, data: bytes) -> dict[str, int]:
        """The ELF header's fields, checked before the program headers are read."""
        elf, self.backend = _checked_elf_header(data, self.path, len(data))
        self.arch = self.backend.name
        return elf

    def _cpus(self, prstatus: list[bytes]) -> list[CpuState]:
        names = self.backend.prstatus_regs
        layout = elfcore.elf_prstatus(len(names))
        reg_offset, reg_format = elfcore.prstatus_regs_format(len(names))
        cpu_meta = {c["cpu"]: c for c in self.note["cpus"]}
        cpus = []
        for i, raw in enumerate(prstatus):
            if len(raw) < layout.sizeof():
                raise DumpError(f"{self.path}: NT_PRSTATUS {i} is {len(raw)} bytes, expected {layout.sizeof()}")
            cm = cpu_meta.get(i, {})
            normalised = cm.get("normalised")
            cpus.append(CpuState(
                cpu=i, regs=dict(zip(names, reg_format.unpack_from(raw, reg_offset))), pid=cm.get("pid"), mode=cm.get("mode", "kernel"),
                sysregs=dict(cm["sysregs"]) if cm.get("sysregs") else None,
                normalised=normalised if isinstance(normalised, str) else None))
        return cpus

    @property
    def build_id(self) -> str | None:
        """The build-id of the kernel image the dump was taken from."""
        return self.note["build_id"]

    @property
    def release(self) -> str | None:
        """The kernel release: the JSON note's, else VMCOREINFO ``OSRELEASE``."""
        return self.info.release

    def close(self) -> None:
        """Release what the dump reads from: nothing, as it was read whole at open."""

    def tasks(self) -> list[Task]:
        """Every task in the dump, running ones first in CPU order (built once, at open)."""
        return [copy.copy(t) for t in self._tasks]

    def _task(self, t: Note) -> Task:
        pid, cpu, task_struct = t["pid"], t["cpu"], t["task"]
        stacks = self.note["stacks"]
        by_task, by_pid, by_cpu = self._stack_owners
        candidates = sorted({*by_task.get(task_struct, ()), *by_pid.get(pid, ()), *by_cpu.get(cpu, ())})
        usable = [StackInfo(s["low"], s["high"], s["kind"], s["cpu"]) for s in (stacks[i] for i in candidates)
                  if _stack_of(s, pid, cpu, task_struct)]
        regs = None
        if cpu is not None:
            if not cpu < len(self.cpus):
                raise DumpError(f"{self.path}: task {pid} runs on cpu{cpu}, which has no NT_PRSTATUS")
            regs = dict(self.cpus[cpu].regs)
        return Task(
            pid=pid, comm=t["comm"], state=t["state"], cpu=t["last_cpu"] if cpu is None else cpu, regs=regs,
            context=dict(t["context"]) if t["context"] else None, stacks=usable,
            fgraph=[FgraphEntry(e["ret"], e["retp"], e["func"], e["fp"]) for e in t["fgraph"]],
            kretprobes=[KretprobeInstance(e["ret"], e["fp"]) for e in t["kretprobes"]],
            user_regs=dict(t["user_regs"]) if t["user_regs"] else None,
            extra={k: v for k, v in t.items() if k not in self._task_keys},
            task_struct=task_struct, ppid=t["ppid"], tgid=t["tgid"], kthread=t["kthread"],
            lacks=None if t["lacks"] is None else Lack(t["lacks"]["what"], t["lacks"]["registers"]),
            fgraph_lacks=t["fgraph_lacks"], kretprobes_lacks=t["kretprobes_lacks"],
        )

    @cached_property
    def _stack_owners(self) -> tuple[dict[int, list[int]], dict[int, list[int]], dict[int, list[int]]]:
        """Indices of the note's stacks by ``task``, by ``pid``, and by ``cpu`` of those with no pid: every
        stack :func:`_stack_of` may give a task is among those of its task_struct, pid and cpu."""
        by_task: dict[int, list[int]] = {}
        by_pid: dict[int, list[int]] = {}
        by_cpu: dict[int, list[int]] = {}
        for i, s in enumerate(self.note["stacks"]):
            if s["task"] is not None:
                by_task.setdefault(s["task"], []).append(i)
            if s["pid"] is not None:
                by_pid.setdefault(s["pid"], []).append(i)
            elif s["cpu"] is not None:
                by_cpu.setdefault(s["cpu"], []).append(i)
        return by_task, by_pid, by_cpu

    def task_memory(self, task: Task) -> Memory:
        """The memory a walk of ``task`` reads: all of the dump's."""
        return self.memory

    def oracles(self) -> list[dict[str, Any]]:
        """The oracle traces stored with the dump (each one validated at open)."""
        return list(self.meta.get("oracles", []))


def _stack_of(s: Note, pid: int | None, cpu: int | None, task_struct: int | None) -> bool:
    """Is the note's stack ``s`` one of the task's (its pid, cpu and task_struct)?"""
    if s["task"] is not None and task_struct is not None:  # by task_struct: idle tasks share pid 0
        return s["task"] == task_struct
    if s["pid"] is not None:
        return s["pid"] == pid and (s["cpu"] is None or s["cpu"] == cpu)
    return cpu is not None and s["cpu"] == cpu  # per-CPU stacks: only for the task running on that CPU


def _error_text(e: Exception) -> str:
    """One line for a construct or note error (their texts may span lines)."""
    text = str(e).splitlines()[0] if str(e) else ""
    return text[:200] or type(e).__name__


# context_switch() -> switch_to(): the next task's stack is loaded before it is made current (x86-64:
# __switch_to_asm(), then __switch_to())
def mark_switches(tasks: list[Task], sp_reg: str) -> None:
    """Where a running task's CPU has its sp on the task stack of a task that is ``on_cpu`` on that CPU, the
    CPU is switching to that task (its stack loaded, ``current`` not changed yet): the running task's
    ``extra["switching_to"]`` and the other's ``extra["switching_from"]`` name each other's pid."""
    waiting = [t for t in tasks if t.extra.get("on_cpu") and t.pid is not None]
    if not waiting:  # every load asks; almost no dump has a CPU mid-switch
        return
    for t in tasks:
        sp = (t.regs or {}).get(sp_reg)
        if sp is None or t.pid is None or any(s.low <= sp < s.high for s in t.stacks):
            continue
        for n in waiting:
            if n.cpu == t.cpu and any(s.kind == "task" and s.low <= sp < s.high for s in n.stacks):
                t.extra["switching_to"], n.extra["switching_from"] = n.pid, t.pid
                break
