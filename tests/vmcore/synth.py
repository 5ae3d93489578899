"""Synthetic vmcores whose every byte is known by construction.

ELF files are built with the project's construct declarations
(``unwind.formats.elfcore``), kdump-compressed and flattened files with the reader's
own declarations (``unwind.formats.vmcore.diskdump``/``flattened``), laid out as
makedumpfile and QEMU lay them out (docs/vmcore.md). Page contents are
derived from the pfn, so a test knows what every read must return.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from dataclasses import dataclass, field

from unwind.core.memory import MemoryFault
from unwind.formats import elfcore
from unwind.formats.vmcore import codecs, diskdump, flattened


#: ``e_phnum`` when the count is in section 0 (``include/uapi/linux/elf.h``)
PN_XNUM = 0xFFFF


def page_bytes(pfn: int, size: int = 4096) -> bytes:
    """A page that compresses somewhat and differs for every pfn."""
    seed = hashlib.sha256(pfn.to_bytes(8, "little")).digest()
    words = (seed * (size // 64 + 1))[:size // 2]
    return (words + bytes(size // 4) + pfn.to_bytes(8, "little") * (size // 32))[:size]


def vmcoreinfo(page_size: int = 4096, **extra: str) -> str:
    lines = ["OSRELEASE=6.12.0-synthetic", f"PAGESIZE={page_size}", "SYMBOL(swapper_pg_dir)=ffffffff82a0c000"]
    lines += [f"{k}={v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def prstatus(nregs: int, pid: int, first: int) -> bytes:
    """An ``elf_prstatus`` whose registers are ``first, first+1, ...``."""
    return elfcore.prstatus_bytes(nregs, [first + i for i in range(nregs)], pid)


def notes_blob(cpus: list[tuple[int, int]], nregs: int = 27, info: str | None = None,
               extra: list[tuple[str, int, bytes]] = ()) -> bytes:
    """NT_PRSTATUS for each (pid, first register) in order, extra notes, then VMCOREINFO."""
    out = b"".join(elfcore.note("CORE", elfcore.NT_PRSTATUS, prstatus(nregs, pid, first)) for pid, first in cpus)
    out += b"".join(elfcore.note(n, t, d) for n, t, d in extra)
    if info is not None:
        out += elfcore.note(elfcore.VMCOREINFO_NOTE_NAME, elfcore.VMCOREINFO_NOTE_TYPE, info.encode())
    return out


@dataclass
class Load:
    """One PT_LOAD: physical address, virtual address, bytes in the file, and memsz beyond them."""

    paddr: int
    data: bytes
    vaddr: int | None = None
    tail: int = 0


def elf_vmcore(loads: list[Load], notes: bytes, e_machine: int = 62, note_split: int | None = None,
               note_pad: int = 0, xnum: bool = False) -> bytes:
    """An ELF vmcore: ELF header, PT_NOTEs, PT_LOADs, then notes and memory (QEMU's order).

    ``note_split`` cuts the notes into two PT_NOTEs (kexec-tools writes one per
    CPU), each followed by ``note_pad`` zero bytes as in a ``crash_notes``
    buffer; ``xnum`` stores the program-header count in section 0's
    ``sh_info`` with ``e_phnum = PN_XNUM``, as QEMU does past 0xfffe segments.
    """
    note_parts = [notes] if note_split is None else [notes[:note_split], notes[note_split:]]
    note_parts = [part + bytes(note_pad) for part in note_parts]
    phnum = len(note_parts) + len(loads)
    shdr = elfcore.Elf64_Shdr.sizeof() if xnum else 0
    off = elfcore.Elf64_Ehdr.sizeof() + shdr + phnum * elfcore.Elf64_Phdr.sizeof()
    phdrs, body = [], []
    for part in note_parts:
        phdrs.append(dict(p_type=elfcore.PT_NOTE, p_flags=0, p_offset=off, p_vaddr=0, p_paddr=0,
                          p_filesz=len(part), p_memsz=len(part), p_align=0))
        body.append(part)
        off += len(part)
    for ld in loads:
        pad = -off % 4096
        body.append(bytes(pad))
        off += pad
        phdrs.append(dict(p_type=elfcore.PT_LOAD, p_flags=elfcore.PF_R | elfcore.PF_W, p_offset=off,
                          p_vaddr=ld.paddr if ld.vaddr is None else ld.vaddr, p_paddr=ld.paddr,
                          p_filesz=len(ld.data), p_memsz=len(ld.data) + ld.tail, p_align=0))
        body.append(ld.data)
        off += len(ld.data)
    ehdr = elfcore.Elf64_Ehdr.build(dict(
        e_type=elfcore.ET_CORE, e_machine=e_machine, e_version=1, e_entry=0,
        e_phoff=elfcore.Elf64_Ehdr.sizeof() + shdr, e_shoff=elfcore.Elf64_Ehdr.sizeof() if xnum else 0, e_flags=0,
        e_ehsize=elfcore.Elf64_Ehdr.sizeof(), e_phentsize=elfcore.Elf64_Phdr.sizeof(),
        e_phnum=PN_XNUM if xnum else phnum, e_shentsize=shdr, e_shnum=1 if xnum else 0, e_shstrndx=0))
    sections = elfcore.Elf64_Shdr.build(dict(
        sh_name=0, sh_type=0, sh_flags=0, sh_addr=0, sh_offset=0, sh_size=0, sh_link=0, sh_info=phnum,
        sh_addralign=0, sh_entsize=0)) if xnum else b""
    return ehdr + sections + b"".join(elfcore.Elf64_Phdr.build(p) for p in phdrs) + b"".join(body)


def _compress(codec: int, page: bytes) -> bytes:
    if codec == codecs.DUMP_DH_COMPRESSED_ZLIB:
        return zlib.compress(page, 1)
    if codec == codecs.DUMP_DH_COMPRESSED_LZO:
        import lzokay
        return bytes(lzokay.compress(page))
    if codec == codecs.DUMP_DH_COMPRESSED_SNAPPY:
        import cramjam
        return bytes(cramjam.snappy.compress_raw(page))
    if codec == codecs.DUMP_DH_COMPRESSED_ZSTD:
        import cramjam
        return bytes(cramjam.zstd.compress(page, 1))
    return page


@dataclass
class KdumpSpec:
    """What to put in a kdump-compressed file."""

    max_mapnr: int
    ram: set[int]
    dumped: dict[int, bytes]          # pfn -> page bytes (pages of all zeros share one record)
    codec: int = codecs.DUMP_DH_COMPRESSED_ZLIB
    block_size: int = 4096
    notes: bytes = b""
    vmcoreinfo: str | None = None
    machine: str = "x86_64"
    header_version: int = 6
    status_extra: int = 0
    dump_level: int = 31
    page_overrides: dict[int, dict] = field(default_factory=dict)  # pfn -> descriptor fields to force
    split: tuple[int, int] | None = None  # a --split file holding pfns [start, end)


def kdump_file(spec: KdumpSpec) -> bytes:
    """A kdump-compressed file laid out as makedumpfile writes it (header, sub-header + notes, bitmaps, descs, data)."""
    bs = spec.block_size
    info = (spec.vmcoreinfo or "").encode()
    sub_len = diskdump.Kdump_sub_header.sizeof() + len(spec.notes) + len(info)
    sub_hdr_size = -(-sub_len // bs)
    half = -(-(-(-spec.max_mapnr // 8)) // bs) * bs
    bitmap_blocks = 2 * half // bs
    ram, dumped = bytearray(half), bytearray(half)
    for pfn in spec.ram:
        ram[pfn >> 3] |= 1 << (pfn & 7)
    for pfn in spec.dumped:
        dumped[pfn >> 3] |= 1 << (pfn & 7)
    desc_start = (1 + sub_hdr_size + bitmap_blocks) * bs
    data_off = desc_start + len(spec.dumped) * diskdump.Page_desc.sizeof()
    descs, data = [], bytearray()

    def record(page: bytes) -> dict[str, int]:
        comp = _compress(spec.codec, page)
        if len(comp) < bs and spec.codec:
            data.extend(comp)
            return dict(offset=data_off + len(data) - len(comp), size=len(comp), flags=spec.codec, page_flags=0)
        data.extend(page)
        return dict(offset=data_off + len(data) - bs, size=bs, flags=0, page_flags=0)

    # the pages of zeros share one record, written before every other page's data (QEMU and makedumpfile alike)
    zero_desc = record(bytes(bs)) if bytes(bs) in spec.dumped.values() else None
    for pfn in sorted(spec.dumped):
        page = spec.dumped[pfn]
        assert len(page) == bs
        desc = dict(zero_desc) if zero_desc is not None and page == bytes(bs) else record(page)
        desc.update(spec.page_overrides.get(pfn, {}))
        descs.append(desc)
    uts = {k: b"" for k in ("sysname", "nodename", "release", "version", "machine", "domainname")}
    uts.update(sysname=b"Linux", release=b"6.12.0-synthetic", machine=spec.machine.encode())
    hdr = diskdump.Disk_dump_header.build(dict(
        signature=diskdump.KDUMP_SIGNATURE, header_version=spec.header_version,
        utsname={k: v.ljust(65, b"\0") for k, v in uts.items()}, timestamp=dict(tv_sec=0, tv_usec=0),
        status=spec.codec | spec.status_extra, block_size=bs, sub_hdr_size=sub_hdr_size, bitmap_blocks=bitmap_blocks,
        max_mapnr=min(spec.max_mapnr, 2**32 - 1), total_ram_blocks=0, device_blocks=0, written_blocks=0,
        current_cpu=0, nr_cpus=1))
    note_off = bs + diskdump.Kdump_sub_header.sizeof()
    sub = diskdump.Kdump_sub_header.build(dict(
        phys_base=0, dump_level=spec.dump_level, split=int(spec.split is not None),
        start_pfn=(spec.split or (0, 0))[0], end_pfn=(spec.split or (0, spec.max_mapnr))[1] & 0xFFFFFFFF,
        offset_vmcoreinfo=note_off + len(spec.notes) if info else 0, size_vmcoreinfo=len(info),
        offset_note=note_off if spec.notes else 0, size_note=len(spec.notes), offset_eraseinfo=0, size_eraseinfo=0,
        start_pfn_64=(spec.split or (0, 0))[0], end_pfn_64=(spec.split or (0, spec.max_mapnr))[1],
        max_mapnr_64=spec.max_mapnr))
    out = bytearray(hdr.ljust(bs, b"\0"))
    out += (sub + spec.notes + info).ljust(sub_hdr_size * bs, b"\0")
    out += diskdump.kdump_bitmaps(half).build(dict(ram=bytes(ram), dumped=bytes(dumped)))
    out += b"".join(diskdump.Page_desc.build(d) for d in descs)
    assert len(out) == data_off
    return bytes(out + data)


def flatten(data: bytes, record: int = 4096, seed: int | None = 0, overwrite_header: bool = False,
            sparse: bool = True) -> bytes:
    """The flattened form of ``data``: records of at most ``record`` bytes, shuffled when ``seed`` is set.

    With ``sparse``, all-zero records are left out (a gap reads as zeros after
    ``-R``); without, every block is written in order, as makedumpfile ``-F``
    writes a file. With ``overwrite_header`` the first record is garbage later
    overwritten by the real bytes, as when makedumpfile rewrites its header.
    """
    recs = [(o, data[o:o + record]) for o in range(0, len(data), record)]
    if sparse:
        recs = [r for r in recs if any(r[1])] + [recs[-1]]  # keep the last so the size is right
    if seed is not None:
        random.Random(seed).shuffle(recs)
    if overwrite_header:
        recs.insert(0, (0, b"\xee" * min(record, len(data))))
    out = bytearray(flattened.Makedumpfile_header.build(dict(
        signature=flattened.MDF_SIGNATURE.ljust(16, b"\0"), type=1, version=1)))
    for off, buf in recs:
        out += flattened.Makedumpfile_data_header.build(dict(offset=off, buf_size=len(buf))) + buf
    out += flattened.Makedumpfile_data_header.build(dict(offset=-1, buf_size=-1))
    return bytes(out)


def kdump_of(vm, codec: int = codecs.DUMP_DH_COMPRESSED_ZLIB, exclude: frozenset[int] = frozenset()) -> bytes:
    """A kdump-compressed file holding what the open vmcore ``vm`` holds: its notes, its VMCOREINFO and every
    page it has whole (pages of zeros share one record, as QEMU writes them); the pfns in ``exclude`` are RAM
    left out of the dump, as makedumpfile leaves out a page its filter drops."""
    machines = {v: k for k, v in diskdump.UTS_MACHINES.items() if k != "arm64"}
    pages: dict[int, bytes] = {}
    for r in vm.ranges:
        for pfn in range(r.start // 4096, -(-r.end // 4096)):
            try:
                pages[pfn] = vm.read_phys(pfn * 4096, 4096)
            except MemoryFault:
                pass
    notes = b"".join(elfcore.note(n.name, n.type, n.desc) for n in vm.notes)
    dumped = {pfn: page for pfn, page in pages.items() if pfn not in exclude}
    return kdump_file(KdumpSpec(max_mapnr=max(pages) + 1, ram=set(pages), dumped=dumped, codec=codec, notes=notes,
                                machine=machines[vm.machine], dump_level=1))
