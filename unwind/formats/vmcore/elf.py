"""ELF vmcores: kdump's ``/proc/vmcore``, QEMU ``dump-guest-memory`` (with and without ``-p``), ``makedumpfile -E``.

``PT_LOAD`` segments give physical ranges at ``p_paddr`` (kdump keeps the
kernel's ``p_paddr``; QEMU writes guest-physical addresses); ``PT_NOTE``
segments hold the notes. The headers are read with ``struct`` formats derived
from the construct declarations of :mod:`unwind.formats.elfcore` (the program-header
table in one read: QEMU ``-p`` dumps have tens of thousands); memory is read
on demand with ``pread``.

A ``PT_LOAD`` whose ``p_filesz`` is less than its ``p_memsz`` has a tail that
is not in the file. ``makedumpfile -E`` makes such tails out of excluded
pages, so a read there raises :class:`ExcludedPageFault` rather than
returning zeros. QEMU's ``-p`` dumps clamp ``p_filesz`` to a RAM block
instead; their tails (and any address outside every segment) are plain
holes.

A file cut short (a copy that stopped, a full disk) keeps what is in it: each
segment's part before the end of the file reads as usual, the rest raises
:class:`TruncatedFault`, a ``PT_NOTE`` gives its whole notes, and
:attr:`~.physmem.PhysicalMemory.damage` says what is missing. Only a file
with neither notes nor memory left is refused.
"""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass
from typing import Hashable

from unwind.formats import elfcore
from unwind.formats.packed import packed
from unwind.core.memory import MemoryFault
from .errors import ExcludedPageFault, TruncatedFault, VmcoreError
from .notes import Note, parse_notes, prstatus_notes, vmcoreinfo_text
from .physmem import DEFAULT_CACHE_BYTES, Damage, PhysicalMemory, PhysRange, VirtualLoad, merge_ranges
from .source import Source, SourceTruncated

#: bytes per cached chunk of an ELF segment
ELF_CHUNK = 4096
#: QEMU's per-vCPU CPU-state note (x86), which marks a QEMU dump
QEMU_NOTE_NAME = "QEMU"


@dataclass(frozen=True, slots=True)
class _Extent:
    """Physical ``[start, end)`` stored at file ``offset``; the file holds it up to ``present``."""

    start: int
    end: int
    offset: int
    present: int


class ElfVmcore(PhysicalMemory):
    """Physical memory and notes of an ELF vmcore."""

    block_size = ELF_CHUNK

    def __init__(self, path: str, source: Source, fmt: str = "elf",
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.format = fmt
        if source.size < elfcore.Elf64_Ehdr.sizeof():
            raise VmcoreError(f"{path}: truncated: {source.size} bytes, shorter than an ELF header")
        head = source.pread(0, elfcore.Elf64_Ehdr.sizeof())
        elfclass, data = _ELF_CLASS.get(head[4]), _ELF_DATA.get(head[5])
        if elfclass is None or data is None:
            raise VmcoreError(f"{path}: malformed vmcore: ELF class {head[4]}, data encoding {head[5]}")
        if elfclass != 64 or data != "LE":
            raise VmcoreError(f"{path}: only 64-bit little-endian ELF vmcores are read "
                              f"(this one is {elfclass}-bit {data})")
        elf = elfcore.file_header(head)
        if elf["e_type"] != elfcore.ET_CORE:
            raise VmcoreError(f"{path}: not an ELF core file (e_type {elf['e_type']})")
        self.machine = _machine_name(elf["e_machine"])
        self.machine_source = "ELF e_machine"

        notes: list[Note] = []
        loads: list[tuple[int, int, int, int, int]] = []  # paddr, vaddr, filesz, memsz, offset
        headers, expected = _program_headers(elf, source, path)
        cut_notes = 0
        for p_type, offset, vaddr, paddr, filesz, memsz in headers:
            if filesz:
                expected = max(expected, offset + filesz)
            if p_type == elfcore.PT_NOTE and filesz:
                there = max(0, min(filesz, source.size - offset))
                cut_notes += there < filesz
                notes.extend(parse_notes(whole_notes(source.pread(offset, there))) if there < filesz
                             else parse_notes(source.pread(offset, filesz)))
            elif p_type == elfcore.PT_LOAD:
                loads.append((paddr, vaddr, filesz, memsz, offset))
        super().__init__(path, source, notes, prstatus_notes(notes), vmcoreinfo_text(notes), cache_bytes)

        self.virtual_loads = [VirtualLoad(v, p, m) for p, v, _f, m, _o in loads if m and v != p]
        self._extents = _file_extents(loads, source.size)
        self._described = merge_ranges([(p, p + m) for p, _v, _f, m, _o in loads])
        self._starts = [e.start for e in self._extents]
        if expected > source.size or source.cut:
            self.damage = self._truncation(source, expected, cut_notes, len(headers), elf)
        qemu = any(n.name == QEMU_NOTE_NAME for n in notes)
        self._tails = [] if qemu else sorted(
            (p + f, p + m) for p, _v, f, m, _o in loads if m > f)

    def _truncation(self, source: Source, expected: int, cut_notes: int, headers: int,
                    elf: dict[str, int]) -> Damage:
        """What the cut file lacks: the segments' bytes past its end; refused when nothing is left."""
        absent = merge_ranges([(e.present, e.end) for e in self._extents])
        held = any(e.present > e.start for e in self._extents)
        if not self.notes and not held:
            raise VmcoreError(f"{self.path}: truncated: {source.size} of {expected} bytes, and neither a note nor "
                              "a byte of memory is left")
        detail = [source.cut] if source.cut else []
        if headers < _phnum(elf, source, self.path):
            detail.append(f"{headers} of {_phnum(elf, source, self.path)} program headers")
        if cut_notes:
            detail.append("notes cut")
        return Damage("truncated", source.size, expected if expected > source.size else None, absent,
                      "; ".join(detail))

    @property
    def ranges(self) -> list[PhysRange]:
        """Physical ranges stored in the file, merged."""
        out: list[PhysRange] = []
        for e in self._extents:
            if out and out[-1].end == e.start:
                out[-1] = PhysRange(out[-1].start, e.end)
            else:
                out.append(PhysRange(e.start, e.end))
        return out

    @property
    def described(self) -> list[PhysRange]:
        """The ``PT_LOAD`` ranges to their ``p_memsz``, the tails the file does not hold included."""
        return self._described

    def read_phys(self, paddr: int, size: int) -> bytes:
        """``size`` bytes at physical ``paddr``: a read of more than a chunk that one file extent holds
        is one read of the file (the chunk cache is for the many small reads of a walk)."""
        if size > ELF_CHUNK and paddr >= 0:
            i = bisect.bisect_right(self._starts, paddr) - 1
            if i >= 0 and paddr + size <= self._extents[i].present:
                ext = self._extents[i]
                with contextlib.suppress(SourceTruncated, OSError):  # read again by chunks, which say what failed
                    return self._src.pread(ext.offset + (paddr - ext.start), size)
        return super().read_phys(paddr, size)

    def _locate(self, paddr: int, addr: int, size: int) -> tuple[Hashable, int]:
        i = bisect.bisect_right(self._starts, paddr) - 1
        if i >= 0 and paddr < self._extents[i].end:
            if paddr >= self._extents[i].present:
                raise TruncatedFault(addr, size)
            base = paddr - paddr % ELF_CHUNK
            return (i, base), max(base, self._extents[i].start)
        for lo, hi in self._tails:
            if lo <= paddr < hi:
                raise ExcludedPageFault(addr, size, paddr - paddr % self.page_size)
        raise MemoryFault(addr, size)

    def _load(self, key: Hashable, start: int, addr: int, size: int) -> bytes:
        i, base = key  # type: ignore[misc]
        ext = self._extents[i]
        end = min(base + ELF_CHUNK, ext.present)
        return self._src.pread(ext.offset + (start - ext.start), end - start)


#: the bytes of one ``Elf64_Shdr`` (section header 0 holds a ``PN_XNUM`` file's program-header count)
_SHDR_SIZE = elfcore.Elf64_Shdr.sizeof()
#: ``e_ident[EI_CLASS]`` and ``e_ident[EI_DATA]`` (``include/uapi/linux/elf.h``: ELFCLASS32/64, ELFDATA2LSB/MSB)
_ELF_CLASS = {1: 32, 2: 64}
_ELF_DATA = {1: "LE", 2: "BE"}
#: ``Elf64_Nhdr``: n_namesz, n_descsz, n_type
_NHDR = packed(elfcore.Elf64_Nhdr)
#: ``e_phnum`` of a file with more program headers: the count is section header 0's ``sh_info``
PN_XNUM = 0xFFFF


def _machine_name(number: int) -> str | None:
    """``e_machine`` as pyelftools names it (``"EM_X86_64"``): a backend's own name, else pyelftools' table (read
    only for a machine no backend is for); ``None`` for a number no ``EM_`` name has."""
    from unwind.core import registry

    try:
        return registry.for_e_machine(number).elf_machine
    except registry.ArchError:
        pass
    from elftools.elf.enums import ENUM_E_MACHINE

    return next((k for k, v in ENUM_E_MACHINE.items() if v == number and k.startswith("EM_")), None)


def _phnum(elf: dict[str, int], source: Source, path: str) -> int:
    """The program-header count: ``e_phnum``, or section header 0's ``sh_info`` past ``PN_XNUM``."""
    if elf["e_phnum"] != PN_XNUM:
        return elf["e_phnum"]
    if elf["e_shoff"] + _SHDR_SIZE > source.size:
        raise VmcoreError(f"{path}: truncated: e_phnum is PN_XNUM, and section header 0 at "
                          f"{elf['e_shoff']:#x} ends past the file")
    return elfcore.section_header(source.pread(elf["e_shoff"], _SHDR_SIZE))["sh_info"]


def _program_headers(elf: dict[str, int], source: Source,
                     path: str) -> tuple[list[tuple[int, int, int, int, int, int]], int]:
    """(p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz) of every program header in the file, in one
    read, and where the table ends.

    QEMU ``-p`` dumps have tens of thousands of ``PT_LOAD``s: past 0xfffe, ``e_phnum`` is
    ``PN_XNUM`` and section header 0 holds the count (``sh_info``); the table is unpacked
    in one pass. A table cut by the end of the file gives its whole entries.
    """
    count, entsize, phoff = _phnum(elf, source, path), elf["e_phentsize"], elf["e_phoff"]
    if count and entsize != elfcore.PHDR.size:  # load_elf_phdrs() (fs/binfmt_elf.c) takes sizeof(struct elf_phdr) only
        raise VmcoreError(f"{path}: bad ELF header: e_phentsize {entsize}, not {elfcore.PHDR.size}")
    there = max(0, min(count, (source.size - phoff) // entsize if entsize else count))
    table = source.pread(phoff, there * entsize)
    return [(t, off, va, pa, fs, ms) for t, _f, off, va, pa, fs, ms, _a in
            (elfcore.PHDR.unpack_from(table, i * entsize) for i in range(there))], phoff + count * entsize


def whole_notes(data: bytes) -> bytes:
    """The notes of a cut note segment that are whole (each note's header gives its size)."""
    pos = 0
    while len(data) - pos >= _NHDR.size:
        namesz, descsz, _type = _NHDR.unpack_from(data, pos)
        size = _NHDR.size + namesz + (-namesz % 4) + descsz + (-descsz % 4)
        if pos + size > len(data):
            break
        pos += size
    return data[:pos]


def _file_extents(loads: list[tuple[int, int, int, int, int]], file_size: int) -> list[_Extent]:
    """The file-backed parts of the ``PT_LOAD``s by physical address, overlaps given to the first, each
    with the part the file holds (all of it unless the file is cut).

    kdump repeats the kernel image inside a RAM range and QEMU ``-p`` maps one
    physical page at several virtual addresses: the bytes are the same.
    """
    out: list[_Extent] = []
    for p, _v, f, _m, off in sorted(((p, v, f, m, o) for p, v, f, m, o in loads if f),
                                    key=lambda l: (l[0], -l[2])):
        start, end = p, p + f
        if out and start < out[-1].end:
            start = out[-1].end
        if start < end:
            at = off + (start - p)
            out.append(_Extent(start, end, at, start + max(0, min(end - start, file_size - at))))
    return out
