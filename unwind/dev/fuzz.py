"""``unwind fuzz``: mutate real dumps and check that replay stays within its promises.

Seeds are small dumps cut from the corpus (a few tasks each, with their stacks, the CPUs,
VMCOREINFO and the oracles of those tasks); the slim image of each build is opened once.
Each case applies one mutation family to one seed, in memory:

``stack``  words of a captured stack (self-loops, pointers into and out of the stacks, text
           addresses, PAC-like high bits, zero records)
``regs``   one CPU's ``NT_PRSTATUS`` registers
``json``   the ``UNWIND`` note's values and types (deleted keys, wrong types, out-of-range
           numbers, swapped ranges, deep nesting, huge text)
``vmcoreinfo`` the VMCOREINFO text (bad, huge and negative numbers, junk lines)
``elf``    the ELF header, program headers and note headers of the container
``orc``    what the arch reads from the image (``ArchBackend.fuzz_image``; x86-64: ORC entries
           the walk looks up, and the section parser on a window of the tables)
``btf``    the image's ``.BTF`` (a real blob cut to a small prefix of its types and strings):
           header fields, type records, strings; then the queries the kernel reader makes
``vmcore`` small vmcore files (``--vmcore-seeds``: ELF, kdump-compressed, flattened): headers,
           bitmaps, page descriptors, notes; then every page and note is read
``image``  the seed's image as ``--vmlinux`` gets it (the unpacked slim image): ELF and section
           headers, and bytes of .symtab, .strtab, .notes, .BTF and the ORC sections; then it
           is opened, its symbols, BTF and text read, and every task replayed with it
           (:data:`IMAGE_SHARE` of the cases)
``vmmem``  a committed vmcore slice's memory: 1..8 of the words a clean load read (task_structs,
           lists, runqueues, per-CPU data, page-table entries, stacks, module data); then it is
           loaded as ``Session.load(VMCORE, vmlinux=IMAGE)``, listed (``ps``), converted, and every
           task replayed (:data:`VMMEM_SHARE` of the cases, under :data:`VMMEM_CPU_LIMIT`)

and checks, for every task, in faithful, complete, explain (provenance) and reliable mode,
with the trace printed and the oracles compared: no exception but a one-line input error at
open; no case over the CPU bound; no read outside a captured segment (every segment's bytes are
instrumented); at most :func:`unwind.core.walk.frame_limit` frames; every frame value and provenance
read a u64; the batch replay (``Session.replay_all``, what ``replay --all`` walks) the same as
``Session.replay``. ``btf`` and ``vmcore`` cases may raise only ``BtfError``/``VmcoreError`` (one line)
or a ``MemoryFault`` for a page.
Cases are numbered and reproducible: case ``i`` of seed ``S`` is the same everywhere.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import json
import lzma
import multiprocessing
import os
import random
import re
import resource
import signal
import string
import struct
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from unwind.formats import elfcore
from unwind.core import registry
from unwind.kernel.btf import Btf, BtfError, Header as BtfHeader
from unwind.formats.dump import Dump, DumpError, DumpWriter
from unwind.core.frame import Frame
from unwind.formats.image import Image, ImageError, find_image, open_image
from unwind.core.memory import Memory, MemoryFault, Segment
from unwind.session.replay import ReplayError, Session
from unwind.core.target import Options
from unwind.core.walk import frame_limit

U64 = 2**64
FAMILIES = ("stack", "regs", "json", "vmcoreinfo", "elf", "orc", "btf", "vmcore", "image", "vmmem")
#: the share of cases in the ``image`` family (a case parses a whole image: ~100x a dump case)
IMAGE_SHARE = 0.003
#: the share of cases in the ``vmmem`` family (a case loads a whole vmcore slice: ~50 dump cases)
VMMEM_SHARE = 0.004
#: CPU seconds one case may take (every task, every mode); over it the case is a hang
CASE_CPU_LIMIT = 5.0
#: CPU seconds a ``vmmem`` case may take: a clean seed's load, listing and replays take 0.4-0.9 s
VMMEM_CPU_LIMIT = 4.0
MODES: dict[str, tuple[Options, bool]] = {
    "faithful": (Options(), False),
    "complete": (Options(complete=True), False),
    "explain": (Options(record=True), False),
    "reliable": (Options(), True),
}


class CaseTimeout(Exception):
    """The case used more than its CPU bound."""


class OutOfDump(Exception):
    """A read past a captured segment's bytes."""


# --- instrumented memory ------------------------------------------------------------------------

class CheckedBytes(bytes):
    """A segment's bytes that refuse (and report) any slice or index past their end."""

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        n = len(self)
        if isinstance(key, slice):
            start, stop, _ = key.start, key.stop, key.step
            if (start is not None and not 0 <= start <= n) or (stop is not None and not 0 <= stop <= n) \
                    or (start is not None and stop is not None and stop < start):
                raise OutOfDump(f"slice [{start}:{stop}] of a {n}-byte segment")
        elif not 0 <= key < n:
            raise OutOfDump(f"index {key} of a {n}-byte segment")
        return super().__getitem__(key)


def instrument(mem: Memory) -> Memory:
    """The same memory (and holes) with every segment's bytes :class:`CheckedBytes`."""
    return Memory([Segment(s.start, CheckedBytes(s.data)) for s in mem.segments], mem.holes)


# --- seeds --------------------------------------------------------------------------------------

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


# --- mutations ----------------------------------------------------------------------------------

def _interesting_u64(rng: random.Random, seed: Seed) -> int:
    """A value a broken dump plausibly holds: near a stack, a text address, a PAC'd pointer, edges."""
    kind = rng.randrange(9)
    if kind == 0 and seed.stack_words:
        i, off = rng.choice(seed.stack_words)
        return (seed.segments[i][0] + off + rng.randrange(-64, 64)) % U64
    if kind == 1:
        return rng.choice((0, 1, 8, 16, U64 - 1, U64 - 8, U64 - 16, 2**63, 2**63 - 1, 2**48, 2**56))
    if kind == 2 and seed.stack_words:  # a pointer to another captured word
        i, off = rng.choice(seed.stack_words)
        return seed.segments[i][0] + off
    if kind == 3 and seed.segments:  # the end of a segment (reads run off it)
        start, data = rng.choice(seed.segments)
        return (start + len(data) - rng.choice((0, 8, 16, 24))) % U64
    if kind == 4 and seed.stack_words:  # the same word with high (PAC-like) bits changed
        i, off = rng.choice(seed.stack_words)
        word = struct.unpack_from("<Q", seed.segments[i][1], off)[0]
        return word ^ (rng.getrandbits(16) << 48)
    if kind == 5 and seed.stack_words:  # a word read elsewhere from the stacks (likely a text address)
        i, off = rng.choice(seed.stack_words)
        return struct.unpack_from("<Q", seed.segments[i][1], off)[0]
    return rng.getrandbits(64)


def mutate_stack(rng: random.Random, seed: Seed) -> DumpWriter:
    """Overwrite 1..8 captured stack words."""
    w = seed.writer()
    for _ in range(rng.randint(1, 8)):
        if not seed.stack_words:
            break
        i, off = rng.choice(seed.stack_words)
        start = seed.segments[i][0]
        value = start + off if rng.random() < 0.1 else _interesting_u64(rng, seed)  # a self-loop
        w._ranges[start][off:off + 8] = struct.pack("<Q", value)
    return w


def mutate_regs(rng: random.Random, seed: Seed) -> DumpWriter:
    """Change 1..3 registers of one CPU."""
    w = seed.writer()
    if w.cpus:
        k = rng.randrange(len(w.cpus))
        regs = w.cpus[k][1]
        for _ in range(rng.randint(1, 3)):
            regs[rng.choice(list(regs))] = _interesting_u64(rng, seed)
    return w


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(16)
    if kind == 14:  # json.dumps writes these as NaN/Infinity tokens, which json.loads accepts
        return rng.choice((float("nan"), float("inf"), float("-inf"), -0.0, 1e-310))
    if kind == 15:  # a lone surrogate, NUL, a terminal escape, non-ASCII digits after 0x
        return rng.choice(("\ud800", "a\x00b", "\x1b[2J", "0x\u0661", "\u00e9" * 16, "0x1\n"))
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice((True, False))
    if kind == 2:
        return rng.choice((-1, 0, 1, 2**63, 2**64, 2**64 + 1, 10**20, -(2**63) - 1, 7))
    if kind == 3:
        return rng.choice((0.5, -1.0, 1e300, 3.0))
    if kind == 4:
        return rng.choice(("zz", "", "0x", "0x" + "f" * 17, "0x-1", "-0x10", "0x1_0", " 0x10", "0xffff0000",
                           "0" * 30, "\u00e9", "0xFFFFFFFFFFFFFFFF", "1e5"))
    if kind == 5:
        return hex(rng.getrandbits(64))
    if kind == 6 and depth < 3:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 7 and depth < 3:
        return {rng.choice(("ret", "retp", "low", "high", "kind", "addr", "size", "fp", "pc", "sp", "x")):
                _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == 8:
        return "x" * rng.choice((100, 5000))
    if kind == 9:
        return rng.randrange(-5, 70)
    return hex(rng.choice((0, 8, 0xFFFF800080000000, 0xFFFFFFFF81000000, U64 - 1)) + rng.randrange(0, 4096))


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            if k not in ("text",):
                yield from _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:64]):
            yield from _nodes(v, path + (i,))


def near_miss_hex(rng: random.Random, value: str) -> Any:
    """A value close to the hex string ``value`` (which an earlier mutation may have left as ``"0x"``
    or with non-hex digits): one digit more, no prefix, upper case, an int, or a 65-bit number."""
    digits = value[2:]
    as_int = int(digits, 16) if digits and all(c in string.hexdigits for c in digits) else -1
    return rng.choice((value + "0", digits, value.upper(), value.replace("0x", "0X"), as_int,
                       "0x1" + digits.rjust(16, "0")))


def mutate_json(rng: random.Random, seed: Seed) -> DumpWriter:
    """Change, delete or retype 1..3 values of the note; sometimes break the JSON text itself."""
    roll = rng.random()
    if roll < 0.03:
        return seed.writer(note_json=b"[" * rng.choice((1000, 100000)) + b"]" * rng.choice((0, 1000)))
    if roll < 0.06:
        raw = bytearray(seed.writer().note_json or b"")
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return seed.writer(note_json=bytes(raw))
    if roll < 0.10:
        return seed.writer(note_json=mutate_json_text(rng, (seed.writer().note_json or b"").decode()))
    meta = copy.deepcopy(seed.meta)
    if rng.random() < 0.3:
        _add_optional_keys(rng, seed, meta)
    for _ in range(rng.randint(1, 3)):
        nodes = [n for n in _nodes(meta) if n[0]]
        hot = [n for n in nodes if n[0][0] in ("tasks", "stacks", "cpus", "symbols", "kernel", "modules",
                                                "ftrace_trampolines", "offsets", "build_id", "arch", "format")]
        path, value = rng.choice(hot if hot and rng.random() < 0.8 else nodes)
        parent: Any = meta
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        op = rng.randrange(6)
        if op == 0:
            del parent[key]
        elif op == 1 and isinstance(value, str) and value.startswith("0x"):
            parent[key] = near_miss_hex(rng, value)
        elif op == 2 and isinstance(parent, dict) and {"low", "high"} <= parent.keys():
            parent["low"], parent["high"] = parent["high"], parent["low"]
            if rng.random() < 0.5:
                parent["low"], parent["high"] = hex(rng.getrandbits(64)), "0xffffffffffffffff"
        elif op == 3 and isinstance(parent, list):
            parent.append(copy.deepcopy(value))
        else:
            parent[key] = _random_json(rng)
    return seed.writer(meta=meta)


#: JSON text no ``json.dumps`` of a value writes: a number past Python's 4300-digit int limit, one
#: past float range, escapes of a lone surrogate and of NUL, a nesting deeper than any note's
_RAW_TOKENS = ("9" * 5000, "-" + "1" * 4400, "1e400", "-1e400", "1" + "0" * 400 + ".5", "-0", "0e0", "NaN",
               "-Infinity", '"\\ud800"', '"0x\\u0000"', '"\\u0030x10"', "[" * 3000 + "]" * 3000, '{"":{}}')
#: a scalar value after a key of the note's text
_SCALAR = re.compile(r'(?<=:)(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|"(?:[^"\\]|\\.)*"|true|false|null)')


def mutate_json_text(rng: random.Random, text: str) -> bytes:
    """The note's text edited where ``json.dumps`` cannot: 1..3 scalar values replaced by raw
    tokens (huge-digit ints, out-of-range floats, surrogate escapes, deep nesting), the root
    replaced, a byte-order mark, trailing bytes, or a cut."""
    op = rng.randrange(5)
    if op == 0:
        spots = list(_SCALAR.finditer(text))
        for m in sorted(rng.sample(spots, min(len(spots), rng.randint(1, 3))), key=lambda m: -m.start()):
            text = text[:m.start()] + rng.choice(_RAW_TOKENS) + text[m.end():]
    elif op == 1:
        text = rng.choice(("[]", "1", "null", '"x"', "", " ", "[" + text + "]", "NaN"))
    elif op == 2:
        text = "\ufeff" + text
    elif op == 3:
        text += rng.choice((" ", "x", "}", "\0", "\n" + text))
    else:
        text = text[:rng.randrange(len(text) + 1)]
    return text.encode("utf-8", "surrogatepass")


def _add_optional_keys(rng: random.Random, seed: Seed, meta: dict[str, Any]) -> None:
    """Give the note the optional keys newer captures and conversions write, so their readers are
    mutated too: ``offsets`` for the structs the arch's walk reads, a ``modules[]`` entry whose
    region holds a pc of the stacks and whose ORC table points into them, ``task`` on tasks and stacks."""
    layouts = registry.get(seed.arch).layouts
    meta["offsets"] = {name: {"size": rng.choice((0, 8, 168, 288, 320, 336, 2**20)),
                              "members": {m: 8 * rng.randrange(48) for m in members}}
                       for name, members in layouts.items()}
    pc = _interesting_u64(rng, seed)
    base = pc & ~0xFFF
    words = [seed.segments[i][0] + off for i, off in seed.stack_words[:64]] or [base]
    meta["modules"] = [{"name": "fuzz", "addr": hex(base), "state": 0,
                        "regions": [{"kind": "text", "base": hex(base), "size": rng.choice((0x1000, 0x100000))}],
                        "symbols": [[hex(base + 16 * k), f"fuzz_fn{k}"] for k in range(rng.randint(0, 4))],
                        "orc": {"orc_unwind_ip": hex(rng.choice(words)), "orc_unwind": hex(rng.choice(words)),
                                "num_orcs": rng.choice((0, 1, 16, 4096)), "entry_size": 6}}]
    for i, t in enumerate(meta.get("tasks", [])):
        if rng.random() < 0.5:
            t["task"] = hex(0xFFFF888000000000 + 0x1000 * i)
    for s in meta.get("stacks", []):
        if rng.random() < 0.3:
            s["task"] = hex(0xFFFF888000000000 + 0x1000 * rng.randrange(4))


_VMCOREINFO_KEYS = ("NUMBER(VA_BITS)", "NUMBER(MODULES_VADDR)", "NUMBER(MODULES_END)", "NUMBER(KERNELPACMASK)",
                    "NUMBER(TCR_EL1_T1SZ)", "PAGESIZE", "OSRELEASE", "KERNELOFFSET", "SYMBOL(init_uts_ns)",
                    "NUMBER(phys_ram_base)")


def mutate_vmcoreinfo(rng: random.Random, seed: Seed) -> DumpWriter:
    """Set known keys to bad values, drop lines, add junk."""
    lines = seed.vmcoreinfo.splitlines()
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(4)
        if op == 0 or not lines:
            value = rng.choice(("zz", "-1", "0", "64", "65", "100000", str(2**64), "-" + str(2**63 + 1),
                                "9" * 5000, "0x", "0xffffffffffffffffff", "", "39", "48", "57", "0x10000"))
            lines.append(f"{rng.choice(_VMCOREINFO_KEYS)}={value}")
            if rng.random() < 0.5:  # the first of two lines wins: put it first
                lines.insert(0, lines.pop())
        elif op == 1:
            del lines[rng.randrange(len(lines))]
        elif op == 2:
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(("=", "==x", "NUMBER(=1", "\0\0", "x" * 70000)))
        else:
            i = rng.randrange(len(lines))
            lines[i] = lines[i].replace("=", rng.choice(("", "==", "= ")), 1)
    w = seed.writer()
    w.vmcoreinfo = "\n".join(lines) + "\n"
    return w


def mutate_elf(rng: random.Random, seed: Seed) -> bytes:
    """Bytes of the ELF header, program headers or note headers set to edge or random values."""
    raw = bytearray(seed.writer().to_bytes())
    phnum = struct.unpack_from("<H", raw, 56)[0]
    note_off = struct.unpack_from("<Q", raw, 64 + 8)[0]
    note_size = struct.unpack_from("<Q", raw, 64 + 32)[0]
    heads = []
    pos = note_off
    while pos + 12 <= note_off + note_size:  # the note headers as written
        namesz, descsz = struct.unpack_from("<II", raw, pos)
        heads.append(pos)
        pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    for _ in range(rng.randint(1, 3)):
        where = rng.randrange(4)
        if where == 0:
            off, width = rng.choice(((16, 2), (18, 2), (20, 4), (24, 8), (32, 8), (40, 8), (48, 4), (52, 2),
                                     (54, 2), (56, 2), (58, 2), (60, 2), (62, 2), (4, 1), (5, 1), (6, 1), (7, 1)))
        elif where == 1:
            off, width = 64 + 56 * rng.randrange(phnum) + rng.choice((0, 8, 16, 32, 40)), rng.choice((4, 8))
        elif where == 2 and heads:
            off, width = rng.choice(heads) + rng.choice((0, 4, 8)), 4
        else:
            off, width = rng.randrange(len(raw)), 1
        value = rng.choice((0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), rng.getrandbits(8 * width),
                            int.from_bytes(raw[off:off + width], "little") + rng.choice((-8, -1, 1, 4, 8))))
        raw[off:off + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    if rng.random() < 0.1:
        raw = raw[:rng.randrange(len(raw))]
    return bytes(raw)


# BTF: a real blob cut small ------------------------------------------------------------------

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


def mutate_btf(rng: random.Random, seed: BtfSeed) -> bytes:
    """Header fields, type-record words or string bytes of the blob set to edge or random values."""
    raw = bytearray(seed.blob)
    hdr = BtfHeader.sizeof()
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(4)
        if where == 0:
            off, width = rng.choice(((0, 2), (2, 1), (3, 1), (4, 4), (8, 4), (12, 4), (16, 4), (20, 4)))
        elif where in (1, 2):  # a word of a type record: name_off, info (kind, vlen), size/type, members
            off, width = hdr + 4 * rng.randrange(max(1, (len(raw) - hdr) // 4 // 8)), 4
        else:
            off, width = rng.randrange(len(raw)), 1
        old = int.from_bytes(raw[off:off + width], "little")
        value = rng.choice((0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), rng.getrandbits(8 * width),
                            old + rng.choice((-1, 1, 12, 1 << 16, 1 << 24)), old ^ (1 << rng.randrange(8 * width))))
        raw[off:off + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    if rng.random() < 0.05:
        raw = raw[:rng.randrange(len(raw))]
    return bytes(raw)


def query_btf(rng: random.Random, btf: Btf, seed: BtfSeed) -> None:
    """The queries the kernel reader and the layouts make, on names the blob held before mutation."""
    for name in rng.sample(seed.structs, min(4, len(seed.structs))):
        try:
            btf.sizeof(name)
            members = btf.members(name)
            for mname, m in members[:6]:
                if mname:
                    btf.offsetof(name, mname)
                    btf.has_member(name, f"{mname}.x[1]")
                kind = btf.kind(m.type_id)
                if kind == "ptr":
                    btf.type_name(btf.pointee(m.type_id))
                elif kind == "array":
                    btf.array(m.type_id)
                btf.type_name(m.type_id)
        except BtfError:
            pass
    for name in rng.sample(seed.enums, min(2, len(seed.enums))):
        try:
            for k in list(btf.enumerators(name))[:3]:
                btf.enum_value(k)
        except BtfError:
            pass


# vmcores: small files of every format ---------------------------------------------------------

def load_vmcore_seeds(folder: Path) -> list[tuple[str, bytes]]:
    """The small vmcore files in ``folder`` (``tests/fuzz/vmcore_seeds.py`` writes them)."""
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()]


def mutate_vmcore(rng: random.Random, data: bytes) -> bytes:
    """Words of the headers, bitmaps, page descriptors and notes (mostly in the first pages of
    the file), or any byte, set to edge or random values; sometimes the file is cut short."""
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        width = rng.choice((1, 4, 8))
        span = min(len(raw), rng.choice((512, 4096, 16384, len(raw))))
        off = rng.randrange(max(1, span - width))
        off -= off % width if rng.random() < 0.7 else 0
        old = int.from_bytes(raw[off:off + width], "little")
        value = rng.choice((0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), rng.getrandbits(8 * width),
                            old + rng.choice((-4096, -8, -1, 1, 8, 4096)), old ^ (1 << rng.randrange(8 * width))))
        raw[off:off + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    if rng.random() < 0.05:
        raw = raw[:rng.randrange(len(raw))]
    return bytes(raw)


#: pages one vmcore case reads at most
VMCORE_PAGES = 64


def read_vmcore(path: Path) -> Exception | None:
    """Open ``path`` and read its notes and up to :data:`VMCORE_PAGES` pages of its ranges;
    the ``VmcoreError`` that refused the file, if one did."""
    from unwind.formats.vmcore import VmcoreError, open_vmcore

    try:
        vm = open_vmcore(path)
    except VmcoreError as e:
        return e
    with vm:
        vm.prstatus, vm.vmcoreinfo_dict, vm.page_size, vm.notes  # noqa: B018 -- read, not kept
        page = vm.page_size
        pages = 0
        for r in vm.ranges[:16]:
            for addr in range(r.start, min(r.end, r.start + VMCORE_PAGES * page), page):
                try:
                    vm.read_phys(addr, min(page, r.end - addr))
                except MemoryFault as e:
                    if "\n" in str(e):
                        raise AssertionError(f"fault is not one line: {str(e)[:200]!r}") from None
                pages += 1
                if pages >= VMCORE_PAGES:
                    return None
    return None


# images: the unpacked slim image ---------------------------------------------------------------

#: sections whose bytes the image family mutates
_IMAGE_SECTIONS = (".symtab", ".strtab", ".notes", ".BTF", ".orc_unwind", ".orc_unwind_ip", ".orc_header",
                   ".shstrtab", ".text")


def _unpacked(path: Path) -> bytes:
    raw = path.read_bytes()
    return lzma.decompress(raw) if raw[:6] == b"\xfd7zXZ\x00" else raw


def _sections(raw: bytes) -> list[tuple[str, int, int, int]]:
    """(name, header offset, file offset, size) of each section, read with the ELF64 layout."""
    shoff, = struct.unpack_from("<Q", raw, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", raw, 58)
    heads = [shoff + i * shentsize for i in range(shnum)]
    strs = struct.unpack_from("<QQ", raw, heads[shstrndx] + 24)
    out = []
    for h in heads:
        name_off, = struct.unpack_from("<I", raw, h)
        off, size = struct.unpack_from("<QQ", raw, h + 24)
        end = raw.find(b"\0", strs[0] + name_off)
        out.append((raw[strs[0] + name_off:end].decode("ascii", "replace"), h, off, size))
    return out


#: Elf64_Sym fields as (offset, width): st_name, st_info, st_other, st_shndx, st_value, st_size
_SYM_FIELDS = ((0, 4), (4, 1), (5, 1), (6, 2), (8, 8), (16, 8))


def mutate_image(rng: random.Random, raw: bytes) -> bytes:
    """ELF header fields, section header fields, bytes of the sections replay reads, or fields of
    ``.symtab`` entries (names past ``.strtab``, other symbols' values, sizes, section indices);
    sometimes the file is cut short."""
    data = bytearray(raw)
    secs = _sections(raw)
    symtab = next(((off, size) for name, _, off, size in secs if name == ".symtab" and off + size <= len(raw)), None)
    for _ in range(rng.randint(1, 3)):
        where = rng.randrange(4)
        if where == 3 and symtab is not None and symtab[1] >= 48:
            _mutate_symbol(rng, data, *symtab)
            continue
        if where == 0:
            off, width = rng.choice(((16, 2), (18, 2), (24, 8), (32, 8), (40, 8), (54, 2), (56, 2), (58, 2),
                                     (60, 2), (62, 2), (4, 1), (5, 1)))
        elif where == 1:
            _, head, _, _ = rng.choice(secs)
            off, width = head + rng.choice(((0, 4), (4, 4), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4),
                                            (44, 4), (56, 8)))[0], 8
            width = 4 if (off - head) in (0, 4, 40, 44) else 8
        else:
            wanted = [x for x in secs if x[0] in _IMAGE_SECTIONS and x[3] > 0 and x[2] + x[3] <= len(raw)]
            _, _, start, size = rng.choice(wanted or secs)
            width = rng.choice((1, 2, 4, 8))
            off = start + rng.randrange(max(1, size - width))
        old = int.from_bytes(data[off:off + width], "little")
        value = rng.choice((0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), rng.getrandbits(8 * width),
                            old + rng.choice((-8, -1, 1, 8, 4096)), old ^ (1 << rng.randrange(8 * width))))
        data[off:off + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    if rng.random() < 0.05:
        del data[rng.randrange(len(data)):]
    return bytes(data)


def _mutate_symbol(rng: random.Random, data: bytearray, start: int, size: int) -> None:
    """One field of one ``.symtab`` entry set to an edge value, another entry's, or one off."""
    entry = start + 24 * rng.randrange(1, size // 24)
    off, width = rng.choice(_SYM_FIELDS)
    other = start + 24 * rng.randrange(1, size // 24) + off
    old = int.from_bytes(data[entry + off:entry + off + width], "little")
    value = rng.choice((0, 2**(8 * width) - 1, 2**(8 * width - 1), int.from_bytes(data[other:other + width], "little"),
                        old + rng.choice((-1, 1, 16, 1 << 20)), rng.getrandbits(8 * width)))
    data[entry + off:entry + off + width] = (value % 2**(8 * width)).to_bytes(width, "little")


# vmcore memory: a real vmcore's words, where the reader read them ---------------------------------

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


def _vmmem_value(rng: random.Random, seed: VmmemSeed, word: ReadWord, old: int) -> int:
    """A value a broken kernel's word plausibly holds, for ``word`` (which held ``old``)."""
    kind = rng.randrange(12)
    delta = rng.choice(seed.deltas) if seed.deltas else 0
    if kind == 0:
        return 0
    if kind == 1:
        return U64 - 1
    if kind == 2:  # itself: a list head pointing to itself, a page-table entry naming its own table
        return word.vaddr if word.vaddr is not None else (word.paddr & ~0xFFF) | (old & 0xFFF)
    if kind == 3 and seed.words:  # another word the reader read
        other = rng.choice(seed.words)
        return other.vaddr if other.vaddr is not None else (other.paddr & ~0xFFF) | (old & 0xFFF)
    if kind == 4:
        return old + rng.choice((-8, 8, -0x1000, 0x1000))
    if kind == 5 and seed.extents:  # into another segment
        start, end, _ = rng.choice(seed.extents)
        return start + (rng.randrange(end - start) & ~7) + delta
    if kind == 6 and seed.extents:  # past every segment
        return max(e[1] for e in seed.extents) + rng.choice((0, 8, 0x1000, 1 << 30)) + delta
    if kind == 7:  # high (PAC-like, tag, sign) bits changed
        return old ^ (rng.getrandbits(16) << 48) if rng.random() < 0.5 else old | (0xFF80 << 48)
    if kind == 8:
        return rng.choice((1, 2, 3, 4, 7, 8, 16, 63, 64, 255, 4096, -1, -2))
    if kind == 9:  # sizes and counts
        return rng.choice((2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, U64 - 8, 1 << 20))
    if kind == 10:
        return old ^ (1 << rng.randrange(8 * word.width))
    return rng.getrandbits(64)


def mutate_vmmem(rng: random.Random, seed: VmmemSeed) -> list[tuple[int, int, int]]:
    """1..8 edits ``(file offset, width, value)`` of words the reader read: most in its small reads
    (structs, lists, page tables), some in its large ones (stacks), a few anywhere in a segment."""
    edits = []
    raw = seed.raw
    for _ in range(rng.randint(1, 8)):
        roll = rng.random()
        if roll < 0.75 and seed.words:
            word = rng.choice(seed.words)
        elif roll < 0.92 and seed.bulk:
            off, size, vaddr = rng.choice(seed.bulk)
            k = 8 * rng.randrange(max(1, size // 8))
            paddr = next((s + off + k - o for s, e, o in seed.extents if o <= off + k < o + e - s), None)
            if paddr is None:
                continue
            word = ReadWord(off + k, 8, paddr, None if vaddr is None else vaddr + k)
        else:
            start, end, off = rng.choice(seed.extents)
            k = 8 * rng.randrange(max(1, (end - start) // 8))
            word = ReadWord(off + k, 8, start + k, None)
        if word.offset + word.width > len(raw):
            continue
        old = int.from_bytes(raw[word.offset:word.offset + word.width], "little")
        value = _vmmem_value(rng, seed, word, old) % 2**(8 * word.width)
        edits.append((word.offset, word.width, value))
    return edits


def apply_edits(raw: bytes, edits: list[tuple[int, int, int]]) -> bytearray:
    """``raw`` with each ``(offset, width, value)`` written little-endian."""
    data = bytearray(raw)
    for off, width, value in edits:
        data[off:off + width] = value.to_bytes(width, "little")
    return data


# --- running a case -----------------------------------------------------------------------------

@dataclass
class Outcome:
    """What one case did: ``kind`` is ok, rejected (clean input error), traceback, hang, runaway,
    out-of-dump, bad-value or batch-differs; ``detail`` says where."""

    family: str
    kind: str
    detail: str = ""
    tasks: int = 0


class Fuzzer:
    """Seeds, their images opened once, and the checks of one case."""

    def __init__(self, seeds: list[Seed], cpu_limit: float = CASE_CPU_LIMIT,
                 vmcore_seeds: list[tuple[str, bytes]] | None = None, scratch: Path | None = None,
                 btf_blobs: list[bytes] | None = None, vmmem_seeds: list[VmmemSeed] | None = None) -> None:
        self.seeds = seeds
        self.cpu_limit = cpu_limit
        self.images: dict[Path, Image] = {}
        blobs = list(btf_blobs or [])
        for s in seeds:
            if s.image_path is not None and s.image_path not in self.images:
                sec = self.image(s.image_path).section(".BTF")  # type: ignore[union-attr]
                if sec is not None:
                    blobs.append(sec[1])
        #: BTF seeds: cut from the images' and the given blobs
        self.btf_seeds = [b for b in map(btf_seed, blobs) if b is not None]
        self.vmcore_seeds = vmcore_seeds or []
        #: where a vmcore case's file is written (a tmpfs is best)
        self.scratch = scratch or Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp")
        #: the bytes of the last case (to keep a failing case as a regression)
        self.last = b""
        #: where failing cases are written (:meth:`keep_case`), if anywhere
        self.keep: Path | None = None
        self._image_bytes: dict[Path, bytes] = {}
        #: the share of cases in the ``image`` family
        self.image_share = IMAGE_SHARE
        #: the vmcore slices the ``vmmem`` family mutates, the share of cases it gets (0: a campaign's
        #: cases as they ran before the family existed) and its CPU bound
        self.vmmem_seeds = vmmem_seeds or []
        self.vmmem_share = VMMEM_SHARE
        self.vmmem_cpu_limit = VMMEM_CPU_LIMIT

    def families(self, seed: Seed) -> tuple[str, ...]:
        """The families that apply to ``seed``: ``orc`` where its arch mutates its image, ``btf``
        and ``vmcore`` when there are such seeds."""
        backend = registry.get(seed.arch)
        out = list(FAMILIES[:5])  # "image" is chosen apart (IMAGE_SHARE)
        if seed.image_path is not None and type(backend).fuzz_image is not registry.ArchBackend.fuzz_image:
            out.append("orc")
        if self.btf_seeds:
            out.append("btf")
        if self.vmcore_seeds:
            out.append("vmcore")
        return tuple(out)

    def case(self, index: int, seed_value: int, family: str | None = None, seed_name: str | None = None) -> Outcome:
        """Run case ``index`` of the campaign seeded ``seed_value`` (on the seed named ``seed_name``
        if given: the case as it ran on a corpus whose seeds were numbered otherwise).

        A ``vmmem`` case is chosen by a draw of its own (``"{seed_value}:{index}:vmmem"``), so the
        other cases are drawn as they were before the family existed."""
        if family == "vmmem" or (family is None and self.vmmem_seeds and self.vmmem_share
                                 and random.Random(f"{seed_value}:{index}:vmmem").random() < self.vmmem_share):
            return self._vmmem(index, seed_value, seed_name)
        rng = random.Random(f"{seed_value}:{index}")
        seed = self.seeds[rng.randrange(len(self.seeds))]
        if seed_name is not None:
            seed = next(s for s in self.seeds if s.name == seed_name)
        if family is None and seed.image_path is not None and rng.random() < self.image_share:
            family = "image"
        fam = family or rng.choice(self.families(seed))
        out = self.guarded(fam, f"{seed.name} case {seed_value}:{index}", lambda: self._run(rng, seed, fam))
        if self.keep is not None and out.kind not in ("ok", "rejected"):
            self.keep_case(out, seed, f"{fam}-{seed_value}-{index}")
        return out

    def _vmmem(self, index: int, seed_value: int, seed_name: str | None) -> Outcome:
        """Case ``index`` as a ``vmmem`` case: a vmcore slice with 1..8 words it read changed."""
        rng = random.Random(f"{seed_value}:{index}:vmmem")
        rng.random()  # the draw that chose the family
        seed = self.vmmem_seeds[rng.randrange(len(self.vmmem_seeds))]
        if seed_name is not None:
            seed = next(s for s in self.vmmem_seeds if s.name == seed_name)
        seed.recorded(self.scratch)  # once per seed, outside the case's CPU bound
        label = f"{seed.name} case {seed_value}:{index}"
        out = self.guarded("vmmem", label, lambda: self._vmmem_case(rng, seed), self.vmmem_cpu_limit)
        if self.keep is not None and out.kind not in ("ok", "rejected"):
            self.keep_case(out, seed, f"vmmem-{seed_value}-{index}")
        return out

    def _vmmem_case(self, rng: random.Random, seed: VmmemSeed) -> Outcome:
        edits = mutate_vmmem(rng, seed)
        self.last = json.dumps({"seed": seed.name, "edits": edits}).encode()  # kept: the edits, not 10 MB
        return self.check_vmcore(apply_edits(seed.raw, edits), seed)

    def check_vmcore(self, data: bytes | bytearray, seed: VmmemSeed, fam: str = "vmmem") -> Outcome:
        """Load ``data`` as the vmcore ``Session.load(VMCORE, vmlinux=IMAGE)`` opens, list its tasks
        (``ps``), convert them, and replay every task in every mode, with every check."""
        from unwind.cli.tasks import convert, ps_lines

        path = self.scratch / f"unwind-fuzz-{id(self)}-{Path(seed.name).name}.elf"
        path.write_bytes(data)
        session: Session | None = None
        try:
            try:
                session = Session.load(path, vmlinux=seed.image_path)
                tasks = session.select(every=True)
            except (DumpError, ReplayError, ImageError) as e:
                return _one_line(fam, e)
            dump: Any = session.dump
            snapshot = dump.task_memory
            dump.task_memory = lambda task: instrument(snapshot(task))
            ps_lines(session)
            convert(session, tasks).to_bytes()
            bad = self._replay_all(session, tasks)
        finally:
            if session is not None and getattr(session.dump, "phys", None) is not None:
                session.dump.phys.close()  # type: ignore[attr-defined]
            path.unlink(missing_ok=True)
        if bad is not None:
            return Outcome(fam, bad[0], f"{seed.name}: {bad[1]}", len(tasks))
        return Outcome(fam, "ok", "", len(tasks))

    def keep_case(self, out: Outcome, seed: Seed | VmmemSeed, name: str) -> Path:
        """Write the case's input (``.bin.xz``) and what went wrong (``.txt``) into :attr:`keep`."""
        assert self.keep is not None
        self.keep.mkdir(parents=True, exist_ok=True)
        path = self.keep / f"{name}.bin.xz"
        path.write_bytes(lzma.compress(self.last))
        path.with_suffix("").with_suffix(".txt").write_text(
            f"family: {out.family}\nseed: {seed.name}\nimage: {seed.image_path.name if seed.image_path else ''}\n"
            f"outcome: {out.kind}\n{out.detail}\n")
        return path

    def guarded(self, fam: str, label: str, run: Callable[[], Outcome], limit: float | None = None) -> Outcome:
        """``run()`` under the CPU bound (``limit``, else :attr:`cpu_limit`), any exception turned into
        the outcome that names it."""
        limit = self.cpu_limit if limit is None else limit
        signal.signal(signal.SIGVTALRM, _on_timer)
        signal.setitimer(signal.ITIMER_VIRTUAL, limit)
        try:
            return run()
        except CaseTimeout:
            return Outcome(fam, "hang", f"{label}: over {limit} s CPU")
        except OutOfDump as e:
            return Outcome(fam, "out-of-dump", f"{label}: {e}\n{_where()}")
        except Exception as e:  # noqa: BLE001 -- the fuzzer's job is to catch exactly these
            return Outcome(fam, "traceback", f"{label}: {type(e).__name__}: {e}\n{_where()}")
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)

    def _run(self, rng: random.Random, seed: Seed, fam: str) -> Outcome:
        restore: Callable[[], None] | None = None
        self.last = b""
        if fam == "btf":
            return self._btf_case(rng)
        if fam == "vmcore":
            return self._vmcore_case(rng)
        if fam == "image":
            return self._image_case(rng, seed)
        if fam == "elf":
            data = mutate_elf(rng, seed)
        elif fam == "orc":
            restore = self._mutate_image(rng, seed)
            data = seed.writer().to_bytes()
        else:
            data = {"stack": mutate_stack, "regs": mutate_regs, "json": mutate_json,
                    "vmcoreinfo": mutate_vmcoreinfo}[fam](rng, seed).to_bytes()
        self.last = data
        try:
            return self.check(data, seed.name, seed.image_path, fam)
        finally:
            if restore is not None:
                restore()

    def check(self, data: bytes, name: str, image_path: Path | None, fam: str = "") -> Outcome:
        """Open ``data`` as a dump and replay every task in every mode, with every check.

        Exceptions other than a one-line input error propagate (:meth:`case` counts them).
        """
        try:
            dump = Dump(data, name)
        except DumpError as e:
            return _one_line(fam, e)
        dump.memory = instrument(dump.memory)
        image = self.image(image_path)
        if image is not None and dump.build_id != image.build_id:
            image = None
        session = Session(dump, image, image.symbols if image is not None else None)
        try:
            tasks = session.select(every=True)
        except (DumpError, ReplayError) as e:
            return _one_line(fam, e)
        bad = self._replay_all(session, tasks)
        if bad is not None:
            return Outcome(fam, bad[0], f"{name}: {bad[1]}", len(tasks))
        return Outcome(fam, "ok", "", len(tasks))

    def _btf_case(self, rng: random.Random) -> Outcome:
        bseed = rng.choice(self.btf_seeds)
        self.last = mutate_btf(rng, bseed)
        try:
            btf = Btf(self.last)
        except BtfError as e:
            return _one_line("btf", e)
        query_btf(rng, btf, bseed)
        return Outcome("btf", "ok")

    def _vmcore_case(self, rng: random.Random) -> Outcome:
        name, data = rng.choice(self.vmcore_seeds)
        self.last = mutate_vmcore(rng, data)
        path = self.scratch / f"unwind-fuzz-{id(self)}-{name}"
        path.write_bytes(self.last)
        try:
            error = read_vmcore(path)
        finally:
            path.unlink(missing_ok=True)
        return Outcome("vmcore", "ok") if error is None else _one_line("vmcore", error)

    def _image_case(self, rng: random.Random, seed: Seed) -> Outcome:
        assert seed.image_path is not None
        raw = self._image_bytes.get(seed.image_path)
        if raw is None:
            raw = self._image_bytes[seed.image_path] = _unpacked(seed.image_path)
        mutated = mutate_image(rng, raw)
        self.last = b""  # the image is too big to keep: the case is reproduced by its seed and index
        path = self.scratch / f"unwind-fuzz-{id(self)}-vmlinux"
        path.write_bytes(mutated)
        try:
            return self._check_image(path, seed)
        finally:
            path.unlink(missing_ok=True)

    def _check_image(self, path: Path, seed: Seed) -> Outcome:
        """Open the image as ``--vmlinux`` does (no symbol cache) and replay the seed with it."""
        from unwind.formats.image import CACHE_ENV
        from unwind.kernel.symbols import SymbolError

        saved = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = "/dev/null/no-cache"  # no cache entry is read or written
        image: Image | None = None
        try:
            dump = Dump(seed.writer().to_bytes(), seed.name)
            dump.memory = instrument(dump.memory)
            open_image.cache_clear()  # the scratch path holds another image each case
            try:
                image = find_image(dump.build_id, None, explicit=path)  # as --vmlinux: build-id checked
                assert image is not None
                symbols = image.symbols
                image.build_id, image.btf, image.release  # noqa: B018 -- read, not kept
                image.text(symbols.address("_stext") or 0, 64) if symbols.address("_stext") else None
            except (ImageError, SymbolError) as e:
                return _one_line("image", e)
            session = Session(dump, image, symbols)
            bad = self._replay_all(session, session.select(every=True))
        finally:
            if image is not None:
                image.close()
            open_image.cache_clear()
            if saved is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = saved
        if bad is not None:
            return Outcome("image", bad[0], f"{seed.name}: {bad[1]}")
        return Outcome("image", "ok")

    def _mutate_image(self, rng: random.Random, seed: Seed) -> Callable[[], None] | None:
        """The arch's image family (``ArchBackend.fuzz_image``) on the seed's image."""
        image = self.image(seed.image_path)
        if image is None:
            return None
        words = [struct.unpack_from("<Q", seed.segments[i][1], off)[0] for i, off in seed.stack_words[:4096]]
        return registry.get(seed.arch).fuzz_image(rng, image, seed.meta.get("kernel", {}).get("release"), words)

    def image(self, path: Path | None) -> Image | None:
        """The image at ``path``, opened (and its symbols decoded) once."""
        if path is None:
            return None
        if path not in self.images:
            self.images[path] = Image(path)
            self.images[path].symbols  # noqa: B018 -- decoded once, before any case
        return self.images[path]

    def _replay_all(self, session: Session, tasks: list[Any]) -> tuple[str, str] | None:
        """Every task in every mode, as ``unwind replay --all`` walks them (``Session.replay_all``)
        and one by one (``Session.replay``); then every oracle compared. The first broken promise."""
        from unwind.cli.corpus import compare_oracle

        limits = [frame_limit(t.stacks, session.dump.task_memory(t), session.backend.min_frame_bytes) for t in tasks]
        for mode, (options, reliable) in MODES.items():
            try:
                # in lockstep whatever its size (a corpus dump has fewer tasks than MIN_TASKS)
                batch = session.replay_all(options, tasks, reliable=reliable, lockstep=True)
                for i, task in enumerate(tasks):
                    bad = self._check_replay(session, task, mode, limits[i], batch[i])
                    if bad is not None:
                        return bad
            except ImageError as e:  # x86 without its image: one line, as the CLI prints it
                out = _one_line("", e)
                return None if out.kind == "rejected" else (out.kind, out.detail)
        for oracle in session.dump.oracles():
            compare_oracle(session, oracle)
        return None

    @staticmethod
    def _check_replay(session: Session, task: Any, mode: str, limit: int, batched: Any) -> tuple[str, str] | None:
        """One task's replay in one mode, and the batch's replay of it: bounded, u64, the same."""
        from unwind.session.output import replay_json, replay_text

        options, reliable = MODES[mode]
        r = session.replay(task, options, reliable=reliable)
        for got, how in ((r, ""), (batched, " (batch)")):
            if len(got.frames) > limit:
                return "runaway", f"{task.describe()} {mode}{how}: {len(got.frames)} frames > limit {limit}"
            bad = _bad_value(got.frames)
            if bad:
                return "bad-value", f"{task.describe()} {mode}{how}: {bad}"
        if _replay_key(batched) != _replay_key(r):
            return "batch-differs", (f"{task.describe()} {mode}: the batch gave {len(batched.frames)} frames, "
                                     f"{batched.stop.reason.name}; replay {len(r.frames)}, {r.stop.reason.name}")
        if not reliable:  # reliable: the same frames as faithful, only the verdict is new
            "\n".join(replay_text(session, r, explain=options.record)).encode()  # as printed: UTF-8
            if mode == "explain":
                json.dumps(replay_json(session, r, True))
        return None


def _replay_key(r: Any) -> tuple[Any, ...]:
    """What ``unwind replay`` prints of a replay (text, ``--explain``, ``--json``)."""
    frames = [(f.pc, f.sp, f.fp, f.source, f.stack, f.flags, f.symbol, f.provenance, f.extra) for f in r.frames]
    reliable = None if r.reliable is None else (r.reliable.ok, r.reliable.reason, r.reliable.stop)
    return frames, (r.stop.reason, r.stop.detail, r.stop.frames), reliable, r.basis


def _on_timer(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def _where() -> str:
    tb = traceback.extract_tb(sys.exc_info()[2])
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(tb[-4:]))


def _one_line(fam: str, e: Exception) -> Outcome:
    text = str(e)
    if not text or "\n" in text:
        return Outcome(fam, "traceback", f"input error is not one line: {type(e).__name__}: {text[:200]!r}")
    return Outcome(fam, "rejected", text[:200])


def _bad_value(frames: list[Frame]) -> str | None:
    for f in frames:
        for name in ("pc", "sp", "fp"):
            v = getattr(f, name)
            if v is not None and not (isinstance(v, int) and 0 <= v < U64):
                return f"frame {name} {v!r} is not a u64"
        if f.provenance is not None:
            for rd in f.provenance.reads:
                if not (0 <= rd.addr < U64 and 0 <= rd.value < U64):
                    return f"provenance read {rd.addr!r}={rd.value!r} is not a u64"
    return None


# --- campaigns ----------------------------------------------------------------------------------

@dataclass
class Summary:
    """Counts per family and outcome, with one example of each non-ok outcome signature."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    cpu_seconds: float = 0.0

    def add(self, o: Outcome) -> None:
        """Count one outcome."""
        self.counts.setdefault(o.family, Counter())[o.kind] += 1
        if o.kind not in ("ok", "rejected"):
            sig = f"{o.family} {o.kind}: {o.detail.splitlines()[-1] if o.detail else ''}"
            self.examples.setdefault(sig[:300], o.detail)

    def merge(self, other: "Summary") -> None:
        """Add another worker's counts."""
        for fam, c in other.counts.items():
            self.counts.setdefault(fam, Counter()).update(c)
        for k, v in other.examples.items():
            self.examples.setdefault(k, v)
        self.cpu_seconds += other.cpu_seconds

    @property
    def failures(self) -> int:
        """Cases that broke a promise."""
        return sum(n for c in self.counts.values() for k, n in c.items() if k not in ("ok", "rejected"))

    def table(self) -> str:
        """The summary table (markdown)."""
        kinds = ("traceback", "hang", "runaway", "out-of-dump", "bad-value", "batch-differs")
        rows = ["| family | cases | rejected (one line) | " + " | ".join(kinds) + " |",
                "|---|---|---|" + "---|" * len(kinds)]
        total: Counter[str] = Counter()
        for fam in FAMILIES:
            c = self.counts.get(fam, Counter())
            total.update(c)
            rows.append(f"| {fam} | {sum(c.values())} | {c['rejected']} | "
                        + " | ".join(str(c[k]) for k in kinds) + " |")
        rows.append(f"| **all** | {sum(total.values())} | {total['rejected']} | "
                    + " | ".join(str(total[k]) for k in kinds) + " |")
        return "\n".join(rows)


def run_cases(fuzzer: Fuzzer, seed_value: int, indices: range,
              progress: Callable[[int, Summary], None] | None = None, family: str | None = None) -> Summary:
    """Run cases ``indices`` of campaign ``seed_value`` in this process (all of ``family`` if given)."""
    summary = Summary()
    t0 = time.process_time()
    for n, i in enumerate(indices):
        summary.add(fuzzer.case(i, seed_value, family))
        if progress is not None and n % 1000 == 999:
            summary.cpu_seconds = time.process_time() - t0
            progress(n + 1, summary)
    summary.cpu_seconds = time.process_time() - t0
    return summary


_WORKER: Fuzzer | None = None


def _fuzzer(args: argparse.Namespace) -> Fuzzer:
    """The fuzzer ``args`` describe: corpus seeds, vmcore seeds, BTF of the given ELF files."""
    blobs = []
    for path in args.btf or []:
        sec = Image(path).section(".BTF")
        if sec is None:
            raise OSError(f"{path} has no .BTF section")
        blobs.append(sec[1])
    vmcores = load_vmcore_seeds(Path(args.vmcore_seeds)) if args.vmcore_seeds else None
    fuzzer = Fuzzer(load_seeds(Path(args.corpus)), args.cpu_limit, vmcores, btf_blobs=blobs,
                    vmmem_seeds=load_vmmem_seeds(Path(args.corpus)))
    fuzzer.keep = Path(args.keep) if args.keep else None
    fuzzer.vmmem_cpu_limit = getattr(args, "vmmem_cpu_limit", VMMEM_CPU_LIMIT)
    return fuzzer


def _worker_init(args: argparse.Namespace) -> None:
    global _WORKER
    _WORKER = _fuzzer(args)


def _worker_run(args: tuple[int, int, int, str | None]) -> Summary:
    seed_value, start, stop, family = args
    assert _WORKER is not None
    return run_cases(_WORKER, seed_value, range(start, stop), family=family)


def cmd_fuzz(args: argparse.Namespace) -> int:
    """``unwind fuzz``: run a campaign, print (and write) the summary table; exit 1 on any failure."""
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise OSError(f"no corpus folder {corpus}")
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.RLIM_INFINITY))
    if args.engine == "atheris":
        from . import fuzz_guided

        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        return fuzz_guided.run(_fuzzer(args), work, args.max_time, args.runs, [])
    start_wall = time.time()
    summary = Summary()
    out = Path(args.report) if args.report else None
    chunk, first, end = args.chunk, args.start, args.start + args.cases
    jobs = [(args.seed, a, min(a + chunk, end), args.family) for a in range(first, end, chunk)]
    span = f" (cases {first} to {end - 1} of campaign {args.seed})" if first else ""

    def report(done: int) -> None:
        wall = time.time() - start_wall
        text = (f"# unwind fuzz\n\ncommand: `{' '.join(sys.argv)}`\n\ncases: {done} of {args.cases}{span}, "
                f"wall {wall:.0f} s, CPU {summary.cpu_seconds:.0f} s, "
                f"{done / max(summary.cpu_seconds, 1e-9):.0f} cases per CPU second\n\n{summary.table()}\n")
        if summary.examples:
            text += "\n## failures (one example per signature)\n\n" + "\n".join(
                f"- {k}\n\n```\n{v}\n```" for k, v in sorted(summary.examples.items()))
        if out is not None:
            out.write_text(text)
        print(text if done == args.cases else f"{done} cases, {summary.failures} failures, {wall:.0f} s",
              file=sys.stderr if done != args.cases else sys.stdout, flush=True)

    done = 0
    if args.jobs <= 1:
        fuzzer = _fuzzer(args)
        for job in jobs:
            summary.merge(run_cases(fuzzer, job[0], range(job[1], job[2]), family=job[3]))
            done = job[2] - first
            report(done)
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.jobs, _worker_init, (args,)) as pool:
            for part in pool.imap(_worker_run, jobs):
                summary.merge(part)
                done += sum(part.counts[f].total() for f in part.counts)
                report(done)
    return 1 if summary.failures else 0


def _case_index(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a case index (0 or more)")
    return n


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``fuzz`` to the top-level parser."""
    f = sub.add_parser("fuzz", help="mutate the corpus dumps and check replay never breaks its promises")
    f.add_argument("--corpus", default="corpora", help="corpus folder (default: corpora)")
    f.add_argument("--cases", type=int, default=2000, help="number of cases (default 2000)")
    f.add_argument("--seed", type=int, default=0, help="campaign seed: the same seed runs the same cases")
    f.add_argument("--start", type=_case_index, default=0, metavar="N",
                   help="first case index: runs cases N to N+cases-1 of the campaign, so a long campaign can be "
                        "run in sittings on one commit and its reports summed (default 0)")
    f.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    f.add_argument("--chunk", type=int, default=5000, help="cases per progress report (default 5000)")
    f.add_argument("--cpu-limit", type=float, default=CASE_CPU_LIMIT,
                   help=f"CPU seconds a case may take before it counts as a hang (default {CASE_CPU_LIMIT})")
    f.add_argument("--vmmem-cpu-limit", type=float, default=VMMEM_CPU_LIMIT,
                   help=f"the same for a vmmem case, which loads a whole vmcore (default {VMMEM_CPU_LIMIT})")
    f.add_argument("--family", choices=FAMILIES,
                   help="run only this family's cases (case i is then family's case i of the campaign)")
    f.add_argument("--vmcore-seeds", metavar="DIR",
                   help="small vmcore files for the vmcore family (python -m tests.fuzz.vmcore_seeds DIR writes some)")
    f.add_argument("--btf", metavar="ELF", action="append",
                   help="a vmlinux (or any ELF with .BTF) whose BTF seeds the btf family (repeatable)")
    f.add_argument("--keep", metavar="DIR", help="write each failing case's input and outcome into DIR "
                   "(copy them to tests/fuzz/regressions/ to keep them as regression cases)")
    f.add_argument("--report", metavar="OUT", help="write the summary table (markdown) to OUT as it goes")
    f.add_argument("--engine", choices=("random", "atheris"), default="random",
                   help="random: numbered, reproducible cases (default); atheris: coverage-guided by libFuzzer "
                        "(the [fuzz] extra), the same checks on every input")
    f.add_argument("--max-time", type=int, default=600, help="atheris: seconds to run (default 600)")
    f.add_argument("--runs", type=int, help="atheris: stop after this many inputs")
    f.add_argument("--work", metavar="DIR", default="fuzz-work",
                   help="atheris: libFuzzer's inputs (the seeds, then every input that found new code) "
                        "and artifacts (default fuzz-work)")
    f.set_defaults(func=cmd_fuzz)


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
