"""kdump-compressed ("diskdump") files, as makedumpfile ``-c/-l/-p/-z`` and QEMU ``dump-guest-memory -z/-l/-s`` write them.

Layout (makedumpfile ``diskdump_mod.h``, ``makedumpfile.c``
write_kdump_header/write_kdump_pages; QEMU ``dump/dump.c``), in blocks of
``block_size`` bytes:

    block 0                      disk_dump_header
    block 1                      kdump_sub_header, then the ELF notes
    block 1 + sub_hdr_size       bitmap 1 (RAM pages), bitmap 2 (dumped pages)
    ... + bitmap_blocks          page_desc[number of dumped pages]
    after the descriptors        page data, in pfn order

A pfn set in bitmap 2 has descriptor number ``popcount(bitmap2[0..pfn))``.
A pfn in bitmap 1 but not in bitmap 2 is RAM that was filtered out
(``-d``): reading it raises :class:`ExcludedPageFault`.

A file cut short, or one makedumpfile marked ``INCOMPLETE`` (the disk filled),
keeps the pages whose descriptor and data are in it; the others raise
:class:`TruncatedFault`, and :attr:`~.physmem.PhysicalMemory.damage` lists
them. Page data follows the descriptors in pfn order, each page after the
one before, but for the pages of zeros that all point at the one zero page
written first: so the last descriptor that is not one of those gives the
file's size. Only a file without its headers, or without notes and bitmaps,
is refused.
"""

from __future__ import annotations

import struct
from functools import cached_property
from typing import Hashable, NoReturn

from construct import Bytes, ConstructError, Int32sl, Int32ul, Int64sl, Int64ul, Padding, Struct

from unwind.core.memory import MemoryFault
from . import codecs
from .elf import whole_notes
from .errors import CorruptPageFault, ExcludedPageFault, TruncatedFault, VmcoreError
from unwind.formats.packed import packed
from .notes import Note, parse_notes, prstatus_notes, vmcoreinfo_text
from .physmem import DEFAULT_CACHE_BYTES, Damage, PhysicalMemory, PhysRange
from .source import Source, SourceTruncated

KDUMP_SIGNATURE = b"KDUMP   "
DISKDUMP_SIGNATURE = b"DISKDUMP"
NEW_UTS_LEN = 64

#: ``struct new_utsname``: six NUL-padded strings
New_utsname = Struct(*(name / Bytes(NEW_UTS_LEN + 1) for name in
                       ("sysname", "nodename", "release", "version", "machine", "domainname")))

#: ``struct disk_dump_header`` (LP64; makedumpfile ``diskdump_mod.h``)
Disk_dump_header = Struct(
    "signature" / Bytes(8),
    "header_version" / Int32sl,
    "utsname" / New_utsname,
    Padding(6),
    "timestamp" / Struct("tv_sec" / Int64sl, "tv_usec" / Int64sl),
    "status" / Int32ul,
    "block_size" / Int32sl,
    "sub_hdr_size" / Int32sl,
    "bitmap_blocks" / Int32ul,
    "max_mapnr" / Int32ul,
    "total_ram_blocks" / Int32ul,
    "device_blocks" / Int32ul,
    "written_blocks" / Int32ul,
    "current_cpu" / Int32ul,
    "nr_cpus" / Int32sl,
)

#: ``struct kdump_sub_header`` (LP64, header_version 6)
Kdump_sub_header = Struct(
    "phys_base" / Int64ul,
    "dump_level" / Int32sl,
    "split" / Int32sl,
    "start_pfn" / Int64ul,
    "end_pfn" / Int64ul,
    "offset_vmcoreinfo" / Int64sl,
    "size_vmcoreinfo" / Int64ul,
    "offset_note" / Int64sl,
    "size_note" / Int64ul,
    "offset_eraseinfo" / Int64sl,
    "size_eraseinfo" / Int64ul,
    "start_pfn_64" / Int64ul,
    "end_pfn_64" / Int64ul,
    "max_mapnr_64" / Int64ul,
)

#: ``struct page_desc``: where one dumped page's bytes are and how they are stored
Page_desc = Struct(
    "offset" / Int64sl,
    "size" / Int32ul,
    "flags" / Int32ul,
    "page_flags" / Int64ul,
)


#: ``page_desc`` for the per-page lookups: offset, size, flags, page_flags
_PAGE_DESC = packed(Page_desc)
#: the same layout as a numpy dtype, for scanning the descriptor table of a damaged file
_DESC_DTYPE = [(sub.name, f"<{'i' if code.islower() else 'u'}{struct.calcsize('<' + code)}")
               for sub, code in zip(Page_desc.subcons, _PAGE_DESC.format[1:])]


def kdump_bitmaps(half: int) -> Struct:
    """The two bitmaps, ``half`` bytes each: RAM pages, then dumped pages (LSB first)."""
    return Struct("ram" / Bytes(half), "dumped" / Bytes(half))


#: ``uname -m`` of the dumped machine -> ELF machine (libkdumpfile takes the arch from it too)
UTS_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "arm64": "EM_AARCH64", "riscv64": "EM_RISCV"}
#: sanity bounds on the block size: a power of two in this range
MIN_BLOCK, MAX_BLOCK = 1 << 10, 1 << 20

#: set bits of each byte value
_POPCOUNT = bytes(bin(i).count("1") for i in range(256))
#: bits of a bitmap unpacked at a time
RUN_CHUNK_BITS = 1 << 23
#: RAM ranges a machine may have: more in bitmap 1 is a corrupt file
MAX_RANGES = 1 << 16
#: page descriptors read, and bitmap bits unpacked, at a time when a damaged file is scanned for what it lacks
DESC_CHUNK = 1 << 16
LACKING_CHUNK_BITS = 1 << 20


def _bit_runs(bitmap: bytes, nbits: int, path: str) -> list[tuple[int, int]]:
    import numpy as np  # here: a replay of the project's own dumps never opens a kdump file
    """``[start, end)`` of every run of set bits among the first ``nbits`` (LSB first), a chunk at a time."""
    runs: list[tuple[int, int]] = []
    start, prev = 0, 0
    for base in range(0, nbits, RUN_CHUNK_BITS):
        n = min(RUN_CHUNK_BITS, nbits - base)
        chunk = np.frombuffer(bitmap, dtype=np.uint8, count=(n + 7) // 8, offset=base // 8)
        bits = np.unpackbits(chunk, bitorder="little")[:n]
        for flip in np.flatnonzero(np.diff(bits, prepend=np.uint8(prev))).tolist():
            if bits[flip]:
                start = base + flip
            else:
                runs.append((start, base + flip))
                if len(runs) > MAX_RANGES:
                    raise VmcoreError(f"{path}: bad bitmap: more than {MAX_RANGES} RAM ranges")
        prev = int(bits[-1])
    if prev:
        runs.append((start, nbits))
    return runs


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


class DiskDump(PhysicalMemory):
    """Physical memory and notes of a kdump-compressed file (plain or reassembled from flattened records)."""

    def __init__(self, path: str, source: Source, fmt: str = "kdump",
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.format = fmt
        self.path = path
        try:
            hdr = Disk_dump_header.parse(source.pread(0, Disk_dump_header.sizeof()))
        except ConstructError as e:
            raise VmcoreError(f"{path}: bad disk_dump_header: {e}") from None
        if hdr.signature != KDUMP_SIGNATURE:
            raise VmcoreError(f"{path}: signature {hdr.signature!r} is not a kdump-compressed file's")
        bs = hdr.block_size
        if not (MIN_BLOCK <= bs <= MAX_BLOCK and bs & (bs - 1) == 0):
            raise VmcoreError(f"{path}: bad header: block_size {bs}")
        if hdr.header_version < 1 or hdr.sub_hdr_size < 1:
            raise VmcoreError(f"{path}: bad header: header_version {hdr.header_version}, "
                              f"sub_hdr_size {hdr.sub_hdr_size} (no kdump_sub_header)")
        unknown = hdr.status & ~(codecs.CODEC_MASK | codecs.DUMP_DH_COMPRESSED_INCOMPLETE
                                 | codecs.DUMP_DH_EXCLUDED_VMEMMAP)
        if unknown:
            raise VmcoreError(f"{path}: unknown compression or status flags {unknown:#x} in the header")
        self.header = hdr
        self.block_size = bs
        self.status = hdr.status
        self.incomplete = bool(hdr.status & codecs.DUMP_DH_COMPRESSED_INCOMPLETE)
        self.compression = [n for f, n in codecs.CODEC_NAMES.items() if hdr.status & f]
        self.utsname = {k: _cstr(v) for k, v in hdr.utsname.items() if not k.startswith("_")}
        sub = Kdump_sub_header.parse(source.pread(bs, Kdump_sub_header.sizeof()))
        self.sub_header = sub
        self.phys_base = sub.phys_base
        self.dump_level = sub.dump_level
        self.max_mapnr = (sub.max_mapnr_64 or hdr.max_mapnr) if hdr.header_version >= 6 else hdr.max_mapnr
        self._pfn_lo, self._pfn_hi = 0, self.max_mapnr
        if hdr.header_version >= 2 and sub.split:
            self._pfn_lo, self._pfn_hi = ((sub.start_pfn_64, sub.end_pfn_64) if hdr.header_version >= 6
                                          else (sub.start_pfn, sub.end_pfn))

        self._cut_notes = False
        notes = self._notes(source, hdr.header_version, sub)
        vmcoreinfo = self._vmcoreinfo(source, hdr.header_version, sub) or vmcoreinfo_text(notes)
        super().__init__(path, source, notes, prstatus_notes(notes), vmcoreinfo, cache_bytes)
        self.virtual_loads = []
        self.machine, self.machine_source = self._machine()
        self._read_bitmaps(source, hdr)

    def _notes(self, source: Source, version: int, sub) -> list[Note]:  # type: ignore[no-untyped-def]
        """The ELF notes copied after the sub-header (header_version >= 4); of a file cut among them, the
        whole ones."""
        if version < 4 or sub.size_note == 0:
            return []
        if sub.offset_note >= 0 and sub.offset_note < source.size < sub.offset_note + sub.size_note:
            self._cut_notes = True
            return parse_notes(whole_notes(self._region(source, sub.offset_note, source.size - sub.offset_note,
                                                        "notes")))
        return parse_notes(self._region(source, sub.offset_note, sub.size_note, "notes"))

    def _vmcoreinfo(self, source: Source, version: int, sub) -> str | None:  # type: ignore[no-untyped-def]
        """The VMCOREINFO text the sub-header points at (header_version >= 3); ``None`` past a cut."""
        if version < 3 or sub.size_vmcoreinfo == 0:
            return None
        if 0 <= sub.offset_vmcoreinfo < source.size < sub.offset_vmcoreinfo + sub.size_vmcoreinfo:
            return None  # cut inside it: the whole VMCOREINFO note, if any, is in the notes
        raw = self._region(source, sub.offset_vmcoreinfo, sub.size_vmcoreinfo, "vmcoreinfo")
        return raw.split(b"\0", 1)[0].decode("ascii", "replace")

    def _region(self, source: Source, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size > source.stored or offset + size > source.size:
            raise VmcoreError(f"{self.path}: truncated or bad sub-header: {what} at {offset:#x} (+{size:#x}) "
                              f"is outside the file ({source.size:#x} bytes)")
        return source.pread(offset, size)

    def _machine(self) -> tuple[str | None, str]:
        """The ELF machine: from ``utsname.machine``, else from the NT_PRSTATUS size (QEMU writes "Unknown")."""
        m = UTS_MACHINES.get(self.utsname.get("machine", ""))
        if m:
            return m, "utsname.machine"
        from unwind.formats import elfcore
        from unwind.core import registry

        sizes = {len(p.desc) for p in self.prstatus}
        hits = {b.elf_machine for b in registry.backends().values()
                if {elfcore.elf_prstatus(len(b.prstatus_regs)).sizeof()} == sizes}
        if len(hits) == 1:
            return hits.pop(), "NT_PRSTATUS size"
        return None, "unknown"

    def _read_bitmaps(self, source: Source, hdr) -> None:  # type: ignore[no-untyped-def]
        bs = self.block_size
        if hdr.bitmap_blocks == 0 or hdr.bitmap_blocks % 2:
            raise VmcoreError(f"{self.path}: bad header: bitmap_blocks {hdr.bitmap_blocks}")
        half = hdr.bitmap_blocks * bs // 2
        if self.max_mapnr > half * 8:
            raise VmcoreError(f"{self.path}: bad header: max_mapnr {self.max_mapnr} exceeds the bitmap "
                              f"({half * 8} pages)")
        start = (1 + hdr.sub_hdr_size) * bs
        self._desc_start = start + 2 * half
        self._bitmaps_cut = self._desc_start > source.size
        if self._bitmaps_cut:  # no page can be found: the notes are all that is left
            if not self.notes:
                raise VmcoreError(f"{self.path}: truncated: the file ends at {source.size:#x}, before its bitmaps "
                                  "end, and holds no notes: nothing is left to read")
            self._ram = self._dumped = bytes(half)
            self._rank = None
            self.num_dumped = self._descs_there = 0
            every = [PhysRange(self._pfn_lo * bs, self._pfn_hi * bs)]
            self.damage = Damage("incomplete" if self.incomplete else "truncated", source.size, None, every,
                                 self._detail(source, "the file ends in the bitmaps: no page is left"))
            return
        raw = self._region(source, start, 2 * half, "bitmaps")
        maps = kdump_bitmaps(half).parse(raw)
        self._ram = maps.ram
        self._dumped = maps.dumped
        import numpy as np

        dumped = np.frombuffer(maps.dumped + bytes(-half % 8), dtype=np.uint8)
        per_word = np.frombuffer(_POPCOUNT, dtype=np.uint8)[dumped].reshape(-1, 8).sum(axis=1, dtype=np.int64)
        self._rank = np.cumsum(per_word) - per_word  # dumped pages before each 64-pfn word
        self.num_dumped = int(per_word.sum())
        #: the descriptors the file holds (all of them unless it is cut among them)
        self._descs_there = max(0, min(self.num_dumped, (source.size - self._desc_start) // _PAGE_DESC.size))
        expected = self._file_end(source)
        if self.incomplete or source.cut or expected is None or expected > source.size:
            self.damage = self._lacking(source, expected)

    def _file_end(self, source: Source) -> int | None:
        """The size the file should have: the end of the last page's data that is not the shared zero page
        (the eraseinfo after it included); ``None`` when the descriptors saying so are not in the file."""
        if self._descs_there < self.num_dumped:
            return None
        data_start = self._desc_start + self.num_dumped * _PAGE_DESC.size
        end = data_start
        hi = self.num_dumped
        try:
            while hi > 0:
                lo = max(0, hi - DESC_CHUNK)
                descs = self._descs(source, lo, hi)
                real = descs[descs["offset"] != data_start]
                if len(real):
                    end = int(real["offset"][-1]) + int(real["size"][-1])
                    break
                end = max(end, data_start + (int(descs["size"][-1]) if len(descs) else 0))
                hi = lo
        except SourceTruncated:  # a flattened file's descriptors fall in a lost record
            return None
        sub = self.sub_header
        if self.header.header_version >= 5 and sub.size_eraseinfo and sub.offset_eraseinfo > 0:
            end = max(end, sub.offset_eraseinfo + sub.size_eraseinfo)
        return end

    def _descs(self, source: Source, lo: int, hi: int):  # type: ignore[no-untyped-def]
        """Page descriptors ``lo`` to ``hi`` as a numpy record array."""
        import numpy as np

        raw = source.pread(self._desc_start + lo * _PAGE_DESC.size, (hi - lo) * _PAGE_DESC.size)
        return np.frombuffer(raw, dtype=_DESC_DTYPE)

    def _lacking(self, source: Source, expected: int | None) -> Damage:
        """What a cut or incomplete file lacks: every dumped page whose descriptor or data is not in it."""
        import numpy as np

        absent: list[tuple[int, int]] = []
        index = lost_pages = 0
        for base in range(0, self.max_mapnr, LACKING_CHUNK_BITS):
            n = min(LACKING_CHUNK_BITS, self.max_mapnr - base)
            bits = np.unpackbits(np.frombuffer(self._dumped, dtype=np.uint8, count=(n + 7) // 8, offset=base // 8),
                                 bitorder="little")[:n]
            pfns = base + np.flatnonzero(bits)
            lost = np.ones(len(pfns), dtype=bool)
            there = max(0, min(len(pfns), self._descs_there - index))
            for lo in range(0, there, DESC_CHUNK):
                hi = min(there, lo + DESC_CHUNK)
                try:
                    d = self._descs(source, index + lo, index + hi)
                except SourceTruncated:
                    continue
                lost[lo:hi] = (d["offset"] <= 0) | (d["size"] == 0) | (d["offset"] + d["size"] > source.size)
            index += len(pfns)
            gone = pfns[lost]
            lost_pages += len(gone)
            if len(gone):
                breaks = np.flatnonzero(np.diff(gone) != 1)
                starts = np.concatenate(([gone[0]], gone[breaks + 1]))
                ends = np.concatenate((gone[breaks], [gone[-1]])) + 1
                absent.extend(zip((starts * self.block_size).tolist(), (ends * self.block_size).tolist()))
        if not self.notes and lost_pages == self.num_dumped:
            raise VmcoreError(f"{self.path}: truncated: the file ends at {source.size:#x}, no page and no note is "
                              "left to read")
        where = ("the file ends in the page descriptors" if self._descs_there < self.num_dumped
                 else "page data cut" if expected is not None and expected > source.size else "")
        return Damage("incomplete" if self.incomplete else "truncated", source.size, expected,
                      [PhysRange(a, b) for a, b in absent], self._detail(source, where))

    def _detail(self, source: Source, where: str) -> str:
        parts = [p for p in (source.cut, "makedumpfile marked it DUMP_DH_COMPRESSED_INCOMPLETE" if self.incomplete
                             else "", "notes cut" if self._cut_notes else "", where) if p]
        return "; ".join(parts)

    def _dumped_bit(self, pfn: int) -> bool:
        return bool(self._dumped[pfn >> 3] >> (pfn & 7) & 1)

    def _ram_bit(self, pfn: int) -> bool:
        return bool(self._ram[pfn >> 3] >> (pfn & 7) & 1)

    def _desc_index(self, pfn: int) -> int:
        """pfn_to_pdpos: the number of dumped pages below ``pfn``."""
        word = pfn >> 6
        bits = int.from_bytes(self._dumped[word * 8:word * 8 + 8], "little") & ((1 << (pfn & 63)) - 1)
        return int(self._rank[word]) + bits.bit_count()

    @cached_property
    def ranges(self) -> list[PhysRange]:
        """RAM ranges from bitmap 1 (pages filtered out of the dump included)."""
        bs = self.block_size
        return [PhysRange(a * bs, b * bs) for a, b in _bit_runs(self._ram, self.max_mapnr, self.path)]

    def is_excluded(self, paddr: int) -> bool:
        """True when ``paddr`` is RAM whose page was filtered out of the dump."""
        pfn = paddr // self.block_size
        return 0 <= pfn < self.max_mapnr and self._ram_bit(pfn) and not self._dumped_bit(pfn)

    def _locate(self, paddr: int, addr: int, size: int) -> tuple[Hashable, int]:
        pfn = paddr // self.block_size
        if not self._pfn_lo <= pfn < self._pfn_hi:
            raise MemoryFault(addr, size)
        if self._bitmaps_cut:
            raise TruncatedFault(addr, size)
        if not self._dumped_bit(pfn):
            if self._ram_bit(pfn):
                raise ExcludedPageFault(addr, size, pfn * self.block_size)
            raise MemoryFault(addr, size)
        return pfn, pfn * self.block_size

    def _load(self, key: Hashable, start: int, addr: int, size: int) -> bytes:
        pfn = int(key)  # type: ignore[call-overload]
        bs = self.block_size
        index = self._desc_index(pfn)
        at = self._desc_start + index * _PAGE_DESC.size
        src = self._src
        if index >= self._descs_there:
            raise TruncatedFault(addr, size)
        offset, stored, flags, _page_flags = _PAGE_DESC.unpack(src.pread(at, _PAGE_DESC.size))
        codec = flags & codecs.CODEC_MASK
        if codec == 0 and stored not in (0, bs):
            raise CorruptPageFault(addr, size, start, f"uncompressed page of {stored} bytes")
        if stored > bs:
            raise CorruptPageFault(addr, size, start, f"compressed page of {stored} bytes")
        if self.damage is not None and offset > 0 and stored and offset + stored > src.size:
            raise TruncatedFault(addr, size)
        if stored == 0 or offset <= 0 or offset + stored > src.size:
            self._missing(addr, size, start, f"descriptor says {stored} bytes at {offset:#x}")
        if codec == 0:
            return src.pread(offset, bs)
        try:
            return codecs.decompress_page(codec, src.pread(offset, stored), bs)
        except codecs.CodecError as e:
            raise CorruptPageFault(addr, size, start, str(e)) from None

    def _missing(self, addr: int, size: int, start: int, why: str) -> NoReturn:
        if self.incomplete:
            raise CorruptPageFault(addr, size, start, f"not written (the dump is incomplete): {why}")
        raise CorruptPageFault(addr, size, start, why)
