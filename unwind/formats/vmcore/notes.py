"""ELF notes of a vmcore: NT_PRSTATUS per CPU, VMCOREINFO, QEMU's CPU state.

ELF vmcores carry them in ``PT_NOTE`` segments; kdump-compressed files keep a
copy of the same note bytes after the sub-header. Both go through
:func:`parse_notes`. The ``Elf64_Nhdr`` layout is the project's
(``unwind.formats.elfcore``); names and descriptors are padded to 4 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from construct import Bytes, ConstructError, Int32ul, Padding, Struct, this

from unwind.formats import elfcore

#: one note: header, then name and descriptor each padded to 4 bytes
Elf64_Note = Struct(
    "n_namesz" / Int32ul,
    "n_descsz" / Int32ul,
    "n_type" / Int32ul,
    "name" / Bytes(this.n_namesz),
    Padding(-this.n_namesz % 4),
    "desc" / Bytes(this.n_descsz),
    Padding(-this.n_descsz % 4),
)

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
    pos = 0
    while len(data) - pos >= elfcore.Elf64_Nhdr.sizeof():
        head = elfcore.Elf64_Nhdr.parse(data[pos:pos + 12])
        if head.n_namesz == 0 and head.n_descsz == 0 and head.n_type == 0:
            break  # /proc/vmcore pads each CPU's buffer with an empty note
        try:
            n = Elf64_Note.parse(data[pos:])
        except ConstructError:
            raise NoteError(f"note {len(notes)} at offset {pos:#x} runs past its segment") from None
        name = n.name.split(b"\0", 1)[0].decode("ascii", "replace")
        notes.append(Note(name, n.n_type, bytes(n.desc)))
        pos += 12 + n.n_namesz + (-n.n_namesz % 4) + n.n_descsz + (-n.n_descsz % 4)
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
