"""ELF core structures the dump writer builds, declared once with construct.

Layouts follow ``include/uapi/linux/elf.h`` and ``include/linux/elfcore.h``
(64-bit, little-endian). :func:`file_header` and :func:`program_headers` read an ELF
core's headers back (a dump's, a vmcore's) with ``struct`` formats derived from the same
declarations (the notes: :func:`unwind.formats.vmcore.notes.parse_notes`); :func:`section_data` reads a
section of any ELF file pyelftools opened, bounded by that file.
"""

from __future__ import annotations

import struct

from functools import lru_cache
from typing import TYPE_CHECKING

from construct import Array, Const, Int16ul, Int32sl, Int32ul, Int64ul, Padding, Struct

from .packed import packed

if TYPE_CHECKING:
    from elftools.elf.sections import Section

ET_EXEC = 2
ET_CORE = 4
SHT_NOBITS = 8
PT_LOAD = 1
PT_NOTE = 4
PF_R = 4
PF_W = 2
NT_PRSTATUS = 1
VMCOREINFO_NOTE_TYPE = 0
#: our JSON note: name "UNWIND", type "UWJS" read as a little-endian u32
NT_UNWIND_META = 0x534A5755
UNWIND_NOTE_NAME = "UNWIND"
VMCOREINFO_NOTE_NAME = "VMCOREINFO"
#: deflate's greatest expansion: no zlib stream inflates more than 1032 times its own size
ZLIB_MAX_RATIO = 1032

Elf64_Ehdr = Struct(
    "e_ident" / Const(b"\x7fELF\x02\x01\x01" + bytes(9)),
    "e_type" / Int16ul,
    "e_machine" / Int16ul,
    "e_version" / Int32ul,
    "e_entry" / Int64ul,
    "e_phoff" / Int64ul,
    "e_shoff" / Int64ul,
    "e_flags" / Int32ul,
    "e_ehsize" / Int16ul,
    "e_phentsize" / Int16ul,
    "e_phnum" / Int16ul,
    "e_shentsize" / Int16ul,
    "e_shnum" / Int16ul,
    "e_shstrndx" / Int16ul,
)

Elf64_Phdr = Struct(
    "p_type" / Int32ul,
    "p_flags" / Int32ul,
    "p_offset" / Int64ul,
    "p_vaddr" / Int64ul,
    "p_paddr" / Int64ul,
    "p_filesz" / Int64ul,
    "p_memsz" / Int64ul,
    "p_align" / Int64ul,
)

Elf64_Shdr = Struct(
    "sh_name" / Int32ul,
    "sh_type" / Int32ul,
    "sh_flags" / Int64ul,
    "sh_addr" / Int64ul,
    "sh_offset" / Int64ul,
    "sh_size" / Int64ul,
    "sh_link" / Int32ul,
    "sh_info" / Int32ul,
    "sh_addralign" / Int64ul,
    "sh_entsize" / Int64ul,
)

Elf64_Nhdr = Struct(
    "n_namesz" / Int32ul,
    "n_descsz" / Int32ul,
    "n_type" / Int32ul,
)

#: the headers as ``struct`` formats, and their field names, for reading an ELF core
_EHDR, PHDR, _SHDR = packed(Elf64_Ehdr), packed(Elf64_Phdr), packed(Elf64_Shdr)
_EHDR_FIELDS = tuple(sub.name for sub in Elf64_Ehdr.subcons)
_PHDR_FIELDS = tuple(sub.name for sub in Elf64_Phdr.subcons)
_SHDR_FIELDS = tuple(sub.name for sub in Elf64_Shdr.subcons)


def file_header(data: bytes) -> dict[str, int]:
    """The ``Elf64_Ehdr`` fields of a little-endian ELF64 file's first 64 bytes (``e_ident``, as bytes,
    unchecked: the caller tells the class and byte order from it)."""
    return dict(zip(_EHDR_FIELDS, _EHDR.unpack_from(data)))


def program_headers(data: bytes, phoff: int, phnum: int) -> list[dict[str, int]]:
    """The ``Elf64_Phdr`` fields of the ``phnum`` program headers at ``data[phoff:]`` (which must hold them)."""
    return [dict(zip(_PHDR_FIELDS, PHDR.unpack_from(data, phoff + i * PHDR.size))) for i in range(phnum)]


def section_header(data: bytes) -> dict[str, int]:
    """The ``Elf64_Shdr`` fields of a section header's bytes."""
    return dict(zip(_SHDR_FIELDS, _SHDR.unpack_from(data)))


Timeval = Struct("tv_sec" / Int64ul, "tv_usec" / Int64ul)


@lru_cache(maxsize=None)
def elf_prstatus(nregs: int) -> Struct:
    """``struct elf_prstatus`` with an ``elf_gregset_t`` of ``nregs`` longs."""
    return Struct(
        "si_signo" / Int32sl,
        "si_code" / Int32sl,
        "si_errno" / Int32sl,
        "pr_cursig" / Int16ul,
        Padding(2),
        "pr_sigpend" / Int64ul,
        "pr_sighold" / Int64ul,
        "pr_pid" / Int32ul,
        "pr_ppid" / Int32ul,
        "pr_pgrp" / Int32ul,
        "pr_sid" / Int32ul,
        "pr_utime" / Timeval,
        "pr_stime" / Timeval,
        "pr_cutime" / Timeval,
        "pr_cstime" / Timeval,
        "pr_reg" / Array(nregs, Int64ul),
        "pr_fpvalid" / Int32ul,
        Padding(4),
    )


@lru_cache(maxsize=None)
def prstatus_regs_format(nregs: int) -> tuple[int, struct.Struct]:
    """Where ``pr_reg`` sits in :func:`elf_prstatus` (the size of the members before it) and its ``struct``
    format: a dump's CPUs are read from there without parsing the rest of each note."""
    offset = 0
    for sub in elf_prstatus(nregs).subcons:
        if sub.name == "pr_reg":
            return offset, struct.Struct(f"<{nregs}Q")
        offset += sub.sizeof()
    raise AssertionError("elf_prstatus has no pr_reg")


def note(name: str, ntype: int, desc: bytes) -> bytes:
    """One ELF note: header, name and descriptor, each padded to 4 bytes."""
    raw_name = name.encode() + b"\0"
    pad = lambda b: b + bytes(-len(b) % 4)  # noqa: E731
    hdr = Elf64_Nhdr.build(dict(n_namesz=len(raw_name), n_descsz=len(desc), n_type=ntype))
    return hdr + pad(raw_name) + pad(desc)


def prstatus_bytes(nregs: int, regs: list[int], pid: int) -> bytes:
    """An ``elf_prstatus`` for one thread."""
    zero_tv = dict(tv_sec=0, tv_usec=0)
    return elf_prstatus(nregs).build(dict(
        si_signo=0, si_code=0, si_errno=0, pr_cursig=0, pr_sigpend=0, pr_sighold=0,
        pr_pid=pid, pr_ppid=0, pr_pgrp=0, pr_sid=0,
        pr_utime=zero_tv, pr_stime=zero_tv, pr_cutime=zero_tv, pr_cstime=zero_tv,
        pr_reg=regs, pr_fpvalid=0))


def check_section_fits(name: str, offset: int, size: int, file_size: int) -> None:
    """A section's ``sh_offset`` and ``sh_size`` come from the file itself: :class:`ELFError` naming the
    section when they run past the file's ``file_size`` bytes."""
    if offset + size > file_size:
        from elftools.common.exceptions import ELFError

        raise ELFError(f"section {name} ({size:#x} bytes at {offset:#x}) runs past the end of the file "
                       f"({file_size:#x} bytes)")


def section_data(sec: "Section") -> bytes:
    """A section's bytes, read by pyelftools once its header is shown to fit the file.

    ``sh_offset``, ``sh_size`` and a compressed section's stated size come from the file itself:
    unchecked, a huge one has pyelftools ask for that many bytes (a ``MemoryError``). Raises
    :class:`ELFError` naming the section instead.
    """
    from elftools.common.exceptions import ELFError

    check_section_fits(sec.name, sec["sh_offset"], sec["sh_size"], sec.stream.seek(0, 2))
    if sec.compressed and sec.data_size > ZLIB_MAX_RATIO * sec["sh_size"]:
        raise ELFError(f"compressed section {sec.name} claims {sec.data_size:#x} bytes, more than "
                       f"{sec['sh_size']:#x} compressed bytes can hold")
    return sec.data()
