"""The mutation families of ``unwind fuzz``: each turns a seed into a broken input with a
``random.Random``, so case ``i`` of a campaign is the same everywhere."""

from __future__ import annotations

import copy
import gzip
import lzma
import random
import re
import string
import struct
from typing import Any, Iterator

from unwind.core import registry
from unwind.formats.dump import DumpWriter
from unwind.kernel.btf import Header as BtfHeader

from .checks import U64
from .seeds import BtfSeed, ReadWord, Seed, VmmemSeed


# --- dumps: stack, regs, json, vmcoreinfo, elf ---------------------------------------------------

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


# --- the compressed container -------------------------------------------------------------------

def mutate_container(rng: random.Random, seed: Seed) -> bytes:
    """The seed's dump as a user's compressed file (xz or gzip), its compressed stream then damaged
    (:func:`damage_stream`)."""
    data = seed.writer().to_bytes()
    return damage_stream(rng, lzma.compress(data, preset=0) if rng.random() < 0.5 else gzip.compress(data, 1, mtime=0))


def damage_stream(rng: random.Random, packed: bytes) -> bytes:
    """A compressed file's bytes damaged: bytes set anywhere (its headers more often), a run zeroed, the stream cut
    short or junk after it."""
    raw = bytearray(packed)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(4)
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                off = rng.randrange(min(len(raw), 64) if rng.random() < 0.3 else len(raw))
                raw[off] = rng.choice((0, 0xFF, rng.getrandbits(8), raw[off] ^ (1 << rng.randrange(8))))
        elif kind == 1:
            off, n = rng.randrange(len(raw)), rng.randint(1, 256)
            raw[off:off + n] = bytes(len(raw[off:off + n]))
        elif kind == 2:
            raw = raw[:rng.randrange(1, len(raw))]
        else:
            raw += rng.choice((bytes(rng.randint(1, 64)), rng.randbytes(rng.randint(1, 64)), raw[:rng.randint(1, 64)]))
    return bytes(raw)


# --- BTF ----------------------------------------------------------------------------------------

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


# --- vmcores -------------------------------------------------------------------------------------

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


def xz_wrapped(rng: random.Random, data: bytes) -> bytes:
    """``data`` (a mutated vmcore) as users often ship a vmcore, xz-compressed as a whole, half the time with the
    xz stream damaged too (:func:`damage_stream`)."""
    packed = lzma.compress(data, preset=0)
    return damage_stream(rng, packed) if rng.random() < 0.5 else packed


# --- images: the unpacked slim image -----------------------------------------------------------

#: sections whose bytes the image family mutates
_IMAGE_SECTIONS = (".symtab", ".strtab", ".notes", ".BTF", ".orc_unwind", ".orc_unwind_ip", ".orc_header",
                   ".shstrtab", ".text")


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


# --- vmcore memory: the words a clean load read --------------------------------------------------

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
