"""ELF notes of a vmcore: NT_PRSTATUS per CPU, VMCOREINFO, QEMU's CPU state.

ELF vmcores carry them in ``PT_NOTE`` segments; kdump-compressed files keep a
copy of the same note bytes after the sub-header. Both go through
:func:`parse_notes`. The ``Elf64_Nhdr`` layout is the project's
(``unwind.formats.elfcore``); names and descriptors are padded to 4 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from unwind.formats import elfcore
from unwind.formats.packed import packed

#: the note header (``Elf64_Nhdr``) as a ``struct`` format; the name and the descriptor follow it, each padded
#: to 4 bytes
_NHDR = packed(elfcore.Elf64_Nhdr)

#: ``struct elf_prstatus`` up to ``pr_reg``: 112 bytes on LP64 (``include/linux/elfcore.h``)
PRSTATUS_REG_OFFSET = 112
#: ``pr_fpvalid`` and its padding after ``pr_reg``
PRSTATUS_TAIL = 8


class NoteError(ValueError):
    """The note bytes do not parse."""


@dataclass(frozen=True, slots=True)
class Note:
    """One note: its name (without the NUL), type and raw descriptor."""

    name: str
    type: int
    desc: bytes


@dataclass(frozen=True, slots=True)
class PrStatus:
    """One ``NT_PRSTATUS``: the ``index``-th in file order, ``pr_pid`` and the raw ``pr_reg`` words.

    Which CPU it belongs to is the caller's question: QEMU writes ``pr_pid =
    cpu + 1``; kdump writes the pid of the task running on that CPU and skips
    CPUs that saved nothing.
    """

    index: int
    pid: int
    regs: tuple[int, ...]
    desc: bytes


def parse_notes(data: bytes) -> list[Note]:
    """Every note in a note segment, in order, up to an all-zero header or the end."""
    notes: list[Note] = []
    pos, size = 0, len(data)
    while size - pos >= _NHDR.size:
        namesz, descsz, ntype = _NHDR.unpack_from(data, pos)
        if namesz == 0 and descsz == 0 and ntype == 0:
            break  # /proc/vmcore pads each CPU's buffer with an empty note
        name_at = pos + _NHDR.size
        desc_at = name_at + namesz + (-namesz % 4)
        end = desc_at + descsz + (-descsz % 4)
        if end > size:  # the name, the descriptor or their padding past the segment
            raise NoteError(f"note {len(notes)} at offset {pos:#x} runs past its segment")
        name = bytes(data[name_at:name_at + namesz]).split(b"\0", 1)[0].decode("ascii", "replace")
        notes.append(Note(name, ntype, bytes(data[desc_at:desc_at + descsz])))
        pos = end
    return notes


def prstatus_notes(notes: list[Note]) -> list[PrStatus]:
    """The ``CORE``/``NT_PRSTATUS`` notes decoded to pid and register words, in file order."""
    out: list[PrStatus] = []
    for note in notes:
        if note.name != "CORE" or note.type != elfcore.NT_PRSTATUS:
            continue
        nregs = (len(note.desc) - PRSTATUS_REG_OFFSET - PRSTATUS_TAIL) // 8
        if nregs <= 0:
            raise NoteError(f"NT_PRSTATUS {len(out)} is {len(note.desc)} bytes, too short for any register")
        pr = elfcore.elf_prstatus(nregs).parse(note.desc)
        out.append(PrStatus(len(out), pr.pr_pid, tuple(pr.pr_reg), note.desc))
    return out


def vmcoreinfo_text(notes: list[Note]) -> str | None:
    """The ``VMCOREINFO`` note's text, if the dump has one."""
    for note in notes:
        if note.name == elfcore.VMCOREINFO_NOTE_NAME:
            return note.desc.split(b"\0", 1)[0].decode("ascii", "replace")
    return None
