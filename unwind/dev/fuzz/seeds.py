"""Seeds of the fuzz families: small dumps cut from the corpus, BTF blobs cut small, small vmcore
files, committed vmcore slices with what a clean load of them read; and regression cases, a seed
with recorded edits."""

from __future__ import annotations

import bisect
import copy
import json
import lzma
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unwind.core.memory import Segment
from unwind.formats import elfcore
from unwind.formats.dump import Dump, DumpWriter
from unwind.formats.image import find_image
from unwind.kernel.btf import Btf, BtfError, Header as BtfHeader
from unwind.session.replay import Session


# --- dumps --------------------------------------------------------------------------------------

@dataclass
class Seed:
    """A small dump cut from a corpus dump, kept as parts the families mutate."""

    name: str
    arch: str
    segments: list[tuple[int, bytes]]
    cpus: list[tuple[int, dict[str, int]]]
    vmcoreinfo: str
    meta: dict[str, Any]
    image_path: Path | None
    #: captured stack words: (segment index, offset) of every 8-byte word inside a stack range
    stack_words: list[tuple[int, int]] = field(default_factory=list)

    def writer(self, meta: dict[str, Any] | None = None, note_json: bytes | None = None) -> DumpWriter:
        """A writer holding the seed (``meta`` or raw ``note_json`` in place of its note)."""
        w = DumpWriter(self.arch)
        w._ranges = {a: bytearray(d) for a, d in self.segments}
        w.cpus = [(c, dict(r), None) for c, r in self.cpus]
        w.vmcoreinfo = self.vmcoreinfo
        w.note_json = note_json if note_json is not None else \
            json.dumps(meta if meta is not None else self.meta, sort_keys=True, separators=(",", ":")).encode()
        return w


def cut_seed(dump: Dump, name: str, pids: list[int | None], image_path: Path | None) -> Seed:
    """The part of ``dump`` that the tasks ``pids`` use: their stacks, all CPUs, their oracles."""
    meta = copy.deepcopy(dump.meta)
    keep = set(pids)
    meta["tasks"] = [t for t in meta.get("tasks", []) if t.get("pid") in keep]
    cpus = {t.get("cpu") for t in meta["tasks"] if t.get("cpu") is not None}
    meta["stacks"] = [s for s in meta.get("stacks", []) if s.get("pid") in keep
                      or (s.get("pid") is None and s.get("cpu") in cpus)]
    meta["oracles"] = [o for o in meta.get("oracles", []) if o.get("pid") in keep
                       or (o.get("cpu") is not None and o.get("cpu") in cpus)]
    meta.pop("oracles_excluded", None)
    ranges = [(int(s["low"], 16), int(s["high"], 16)) for s in dump.meta.get("stacks", [])]
    kept = [(int(s["low"], 16), int(s["high"], 16)) for s in meta["stacks"]]

    def wanted(seg: Segment) -> bool:
        on = [r for r in ranges if r[0] < seg.end and seg.start < r[1]]
        return not on or any(r[0] < seg.end and seg.start < r[1] for r in kept)

    segments = [(s.start, s.data) for s in dump.memory.segments if wanted(s)]
    seed = Seed(name, dump.arch, segments, [(c.cpu, c.regs) for c in dump.cpus], dump.vmcoreinfo_text,
                meta, image_path)
    for i, (start, data) in enumerate(segments):
        for lo, hi in kept:
            a, b = max(lo, start), min(hi, start + len(data))
            seed.stack_words.extend((i, off) for off in range(a - start + (-(a - start)) % 8, b - start - 7, 8))
    return seed


def load_seeds(corpus: Path, tasks_per_seed: int = 2, dumps_per_build: int = 4) -> list[Seed]:
    """Seeds from the corpus: per build, a few dumps; per dump, its running tasks and a blocked one."""
    seeds: list[Seed] = []
    for build in sorted(p for p in corpus.glob("*/*") if p.is_dir()):
        dumps = sorted(build.glob("stop-*.bin*"))
        step = max(1, len(dumps) // dumps_per_build)
        for path in dumps[::step][:dumps_per_build]:
            dump = Dump.open(path)
            image = find_image(dump.build_id, path, None)
            tasks = dump.meta.get("tasks", [])
            running = [t.get("pid") for t in tasks if t.get("cpu") is not None]
            blocked = [t.get("pid") for t in tasks if t.get("cpu") is None and t.get("fgraph")] + \
                      [t.get("pid") for t in tasks if t.get("cpu") is None]
            for k in range(0, max(len(running), 1), tasks_per_seed):
                pids = running[k:k + tasks_per_seed] + blocked[k // tasks_per_seed:k // tasks_per_seed + 1]
                seeds.append(cut_seed(dump, f"{build.name}/{path.name.split('.')[0]}#{k}", pids,
                                      image.path if image is not None else None))
    return seeds


# --- BTF: a real blob cut small ---------------------------------------------------------------

#: types and string bytes a BTF seed keeps of the image's blob (the cut references past them:
#: exactly what a hostile blob holds)
BTF_SEED_TYPES = 3000
BTF_SEED_STRINGS = 128 * 1024


@dataclass
class BtfSeed:
    """A prefix of an image's ``.BTF`` and the struct and enum names it holds."""

    blob: bytes
    structs: list[str]
    enums: list[str]


def btf_seed(blob: bytes) -> BtfSeed | None:
    """The first :data:`BTF_SEED_TYPES` types and :data:`BTF_SEED_STRINGS` string bytes of ``blob``."""
    try:
        full = Btf(blob)
        hdr = BtfHeader.parse(blob)
    except BtfError:
        return None
    base = hdr.hdr_len
    ntypes = min(BTF_SEED_TYPES, len(full._offsets) - 1)
    type_len = full._offsets[ntypes + 1] if ntypes + 1 < len(full._offsets) else hdr.type_len
    str_len = min(hdr.str_len, BTF_SEED_STRINGS)
    types = blob[base + hdr.type_off:base + hdr.type_off + type_len]
    strs = blob[base + hdr.str_off:base + hdr.str_off + str_len]
    out = BtfHeader.build(dict(magic=0xEB9F, version=hdr.version, flags=hdr.flags, hdr_len=BtfHeader.sizeof(),
                               type_off=0, type_len=len(types), str_off=len(types), str_len=len(strs)))
    cut = Btf(out + types + strs)
    names: dict[str, list[str]] = {"struct": [], "enum": []}
    for tid in range(1, ntypes + 1):
        try:
            t = cut.type(tid)
        except BtfError:
            continue
        if t.kind in names and t.name:
            names[t.kind].append(t.name)
    return BtfSeed(out + types + strs, names["struct"][:200], names["enum"][:50])


# --- vmcores: small files of every format ------------------------------------------------------

def load_vmcore_seeds(folder: Path) -> list[tuple[str, bytes]]:
    """The small vmcore files in ``folder`` (``tests/fuzz/vmcore_seeds.py`` writes them)."""
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()]


# --- images: the unpacked slim image -----------------------------------------------------------

def unpacked(path: Path) -> bytes:
    """The image at ``path`` as ``--vmlinux`` gets it (xz-compressed slim images unpacked)."""
    raw = path.read_bytes()
    return lzma.decompress(raw) if raw[:6] == b"\xfd7zXZ\x00" else raw


# --- vmcore memory: a real vmcore's words, where the reader read them ------------------------------

@dataclass(frozen=True, slots=True)
class ReadWord:
    """A word a clean load of a vmcore seed read: its file ``offset``, ``width`` in bytes, physical
    address, and the kernel virtual address it was read at (``None``: a page-table entry, or read
    by physical address)."""

    offset: int
    width: int
    paddr: int
    vaddr: int | None


@dataclass
class VmmemSeed:
    """A committed vmcore slice (``corpora/<arch>/<release>/vmcore/*.elf.xz``) and its slim image.

    What a clean load read is recorded once, on first use (:func:`record_reads`): ``words``, the
    words of reads of up to 64 bytes (task_struct members, list pointers, per-CPU data, page-table
    entries); ``bulk``, the larger reads (stacks, strings, ORC tables) as (offset, size, vaddr).
    """

    name: str
    path: Path
    image_path: Path
    _raw: bytes | None = field(default=None, repr=False)
    words: list[ReadWord] = field(default_factory=list, repr=False)
    bulk: list[tuple[int, int, int | None]] = field(default_factory=list, repr=False)
    #: (physical start, end, file offset) of each PT_LOAD's bytes
    extents: list[tuple[int, int, int]] = field(default_factory=list, repr=False)
    #: the commonest ``vaddr - paddr`` of the recorded reads (the direct map, the kernel image map)
    deltas: list[int] = field(default_factory=list, repr=False)

    @property
    def raw(self) -> bytes:
        """The decompressed ELF (read once)."""
        if self._raw is None:
            self._raw = lzma.decompress(self.path.read_bytes())
        return self._raw

    def recorded(self, scratch: Path) -> "VmmemSeed":
        """The seed with what a clean load read (recorded on the first call)."""
        if not self.extents:
            path = scratch / f"unwind-fuzz-{os.getpid()}-clean.elf"
            path.write_bytes(self.raw)
            try:
                record_reads(self, path)
            finally:
                path.unlink(missing_ok=True)
        return self


def load_vmmem_seeds(corpus: Path) -> list[VmmemSeed]:
    """The committed vmcore slices of ``corpus``, each with the slim image of its build."""
    out = []
    for path in sorted(corpus.glob("*/*/vmcore/*.elf.xz")):
        image = next(path.parents[1].glob("vmlinux-*.slim*"), None)
        if image is not None:
            out.append(VmmemSeed(f"{path.parts[-3]}/vmcore/{path.name.split('.')[0]}", path, image))
    return out


def record_reads(seed: VmmemSeed, path: Path) -> None:
    """Load ``path`` (the seed's clean ELF) as a user does, every task's memory snapshotted, and keep
    every physical read: the reader's own code is wrapped here, for this one load."""
    from unwind.formats.vmcore.physmem import PhysicalMemory
    from unwind.formats.vmcore.virtual import VirtualMemory

    reads: list[tuple[int, int, int | None]] = []
    read_phys, read_chunk = PhysicalMemory.read_phys, VirtualMemory._read_chunk

    def phys(self: Any, paddr: int, size: int) -> bytes:
        data = read_phys(self, paddr, size)
        reads.append((paddr, size, None))
        return data

    def chunk(self: Any, addr: int, size: int) -> bytes:
        data = read_chunk(self, addr, size)
        reads.append((self.page_phys(addr), size, addr))
        return data

    PhysicalMemory.read_phys, VirtualMemory._read_chunk = phys, chunk  # type: ignore[method-assign]
    try:
        session = Session.load(path, vmlinux=seed.image_path)
        for task in session.select(every=True):
            session.dump.task_memory(task)
        extents = [(e.start, e.end, e.offset) for e in session.dump.phys._extents]
        session.dump.phys.close()
    finally:
        PhysicalMemory.read_phys, VirtualMemory._read_chunk = read_phys, read_chunk  # type: ignore[method-assign]
    starts = [e[0] for e in extents]

    def offset(paddr: int) -> int | None:
        i = bisect.bisect_right(starts, paddr) - 1
        return extents[i][2] + paddr - extents[i][0] if i >= 0 and paddr < extents[i][1] else None

    words: dict[int, ReadWord] = {}
    bulk: dict[int, tuple[int, int, int | None]] = {}
    deltas: Counter[int] = Counter()
    for paddr, size, vaddr in sorted(reads, key=lambda r: r[2] is not None):  # a virtual read wins
        off = offset(paddr)
        if off is None or size <= 0:
            continue
        if vaddr is not None:
            deltas[vaddr - paddr] += 1
        if size > 64:
            bulk[off] = (off, size, vaddr)
            continue
        width = 8 if size >= 8 else size
        for k in range(0, max(size - width, 0) + 1, width):
            words[off + k] = ReadWord(off + k, width, paddr + k, None if vaddr is None else vaddr + k)
    seed.words, seed.bulk = list(words.values()), list(bulk.values())
    seed.extents, seed.deltas = extents, [d for d, _ in deltas.most_common(8)]


# --- regression cases ---------------------------------------------------------------------------

def _set_path(meta: Any, path: list[Any], value: Any, delete: bool = False) -> None:
    parent = meta
    for p in path[:-1]:
        parent = parent[p]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def edited_dump(seed: Seed, spec: dict[str, Any]) -> bytes:
    """The seed with a regression case's edits applied (``tests/fuzz/regressions/edits.json``).

    ``note``: ``[path, value]`` pairs set in the note (``value`` ``{"$delete": true}`` deletes);
    ``note_json``: the note's text instead (``note_json_repeat``: ``[text, n]``, the text n times);
    ``vmcoreinfo``: lines put first (the first line of a
    key wins); ``elf``: ``[where, field, value]`` with ``where`` ``ehdr``, a program header index,
    or a note name, patched into the container's bytes.
    """
    meta = copy.deepcopy(seed.meta)
    for path, value in spec.get("note", []):
        _set_path(meta, path, value, delete=isinstance(value, dict) and value.get("$delete") is True)
    raw_note = spec["note_json"].encode() if "note_json" in spec else None
    if "note_json_repeat" in spec:  # [text, n]: text n times (a deeply nested note)
        raw_note = (spec["note_json_repeat"][0] * spec["note_json_repeat"][1]).encode()
    w = seed.writer(meta=meta, note_json=raw_note)
    if "vmcoreinfo" in spec:
        w.vmcoreinfo = "".join(f"{line}\n" for line in spec["vmcoreinfo"]) + w.vmcoreinfo
    data = bytearray(w.to_bytes())
    for where, name, value in spec.get("elf", []):
        value = int(value, 0) if isinstance(value, str) else value
        if where == "ehdr":
            st, base = elfcore.Elf64_Ehdr, 0
        elif isinstance(where, int):
            st, base = elfcore.Elf64_Phdr, 64 + 56 * where
        else:
            st, base = elfcore.Elf64_Nhdr, _note_header(data, where)
        off = base + _field_offset(st, name)
        width = next(sc.sizeof() for sc in st.subcons if sc.name == name)
        data[off:off + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    return bytes(data)


def _field_offset(st: Any, name: str) -> int:
    off = 0
    for sc in st.subcons:
        if sc.name == name:
            return off
        off += sc.sizeof()
    raise KeyError(name)


def _note_header(data: bytes | bytearray, name: str) -> int:
    note_off, note_size = struct.unpack_from("<Q", data, 64 + 8)[0], struct.unpack_from("<Q", data, 64 + 32)[0]
    pos = note_off
    while pos + 12 <= note_off + note_size:
        namesz, descsz = struct.unpack_from("<II", data, pos)
        if bytes(data[pos + 12:pos + 12 + namesz]).rstrip(b"\0").decode() == name:
            return pos
        pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    raise KeyError(name)
