"""Slim images: the few hundred KB to MB of a vmlinux that replay needs.

``unwind slim VMLINUX -o IMAGE [--with-text]`` keeps every section header
(so symbol section indices and addresses stay valid) but only the contents
of the symbol table, string tables, notes (the build-id), the ORC sections,
the type information (``.BTF``: struct layouts) and, with ``--with-text``, the executable sections. Everything else becomes
``SHT_NOBITS``. The build-id therefore matches the original image.
"""

from __future__ import annotations

import lzma
from pathlib import Path

from elftools.elf.constants import SH_FLAGS
from elftools.elf.enums import ENUM_E_MACHINE, ENUM_SH_TYPE_BASE

from . import elfcore
from .image import Image

#: sections whose contents replay reads
KEPT_SECTIONS = (".symtab", ".strtab", ".shstrtab", ".orc_unwind_ip", ".orc_unwind", ".orc_header", ".BTF")


def slim_bytes(image: Image, with_text: bool) -> bytes:
    """The slim ELF for ``image``."""
    elf = image.elf
    sections = list(elf.iter_sections())
    blobs: list[bytes] = []
    headers = []
    offset = elfcore.Elf64_Ehdr.sizeof()
    for sec in sections:
        h = dict(sec.header)
        keep = (sec.name in KEPT_SECTIONS or sec["sh_type"] == "SHT_NOTE"
                or (with_text and sec["sh_flags"] & SH_FLAGS.SHF_EXECINSTR))
        hdr = {k: h[k] for k in ("sh_name", "sh_flags", "sh_addr", "sh_size", "sh_link", "sh_info",
                                 "sh_addralign", "sh_entsize")}
        hdr["sh_type"] = _section_type(sec["sh_type"])
        if keep and sec["sh_type"] != "SHT_NOBITS" and sec["sh_type"] != "SHT_NULL":
            data = elfcore.section_data(sec)
            pad = -offset % max(1, min(sec["sh_addralign"], 4096))
            blobs.append(bytes(pad))
            offset += pad
            hdr["sh_offset"] = offset
            blobs.append(data)
            offset += len(data)
        else:
            if sec["sh_type"] != "SHT_NULL":
                hdr["sh_type"] = elfcore.SHT_NOBITS
            hdr["sh_offset"] = offset if sec["sh_type"] != "SHT_NULL" else 0
        headers.append(hdr)
    pad = -offset % 8
    blobs.append(bytes(pad))
    shoff = offset + pad
    ehdr = elfcore.Elf64_Ehdr.build(dict(
        e_type=elfcore.ET_EXEC, e_machine=_machine_number(image), e_version=1, e_entry=elf["e_entry"],
        e_phoff=0, e_shoff=shoff, e_flags=elf["e_flags"], e_ehsize=elfcore.Elf64_Ehdr.sizeof(),
        e_phentsize=elfcore.Elf64_Phdr.sizeof(), e_phnum=0, e_shentsize=elfcore.Elf64_Shdr.sizeof(),
        e_shnum=len(headers), e_shstrndx=elf["e_shstrndx"]))
    return ehdr + b"".join(blobs) + b"".join(elfcore.Elf64_Shdr.build(h) for h in headers)


def _machine_number(image: Image) -> int:
    return ENUM_E_MACHINE[image.machine]


def _section_type(name: str | int) -> int:
    """The number of a section type pyelftools has named."""
    return ENUM_SH_TYPE_BASE[name] if isinstance(name, str) else int(name)


def is_slim(image: Image) -> bool:
    """Is ``image`` already a slim image? Its ``.data`` has no contents (a vmlinux's always has)."""
    data = image.elf.get_section_by_name(".data")
    return data is not None and data["sh_type"] == "SHT_NOBITS"


def write_slim(vmlinux: str | Path, out: str | Path, with_text: bool = False) -> int:
    """Write the slim image of ``vmlinux`` to ``out`` (xz-compressed when it ends in ``.xz``).

    Slimming a slim image keeps the text it has: text dropped here could not be had back.
    """
    image = Image(vmlinux)
    try:
        data = slim_bytes(image, with_text or (is_slim(image) and image.has_text))
    finally:
        image.close()
    if str(out).endswith(".xz"):
        data = lzma.compress(data, preset=9)
    Path(out).write_bytes(data)
    return len(data)
