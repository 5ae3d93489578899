"""A BTF (BPF Type Format) reader: kernel struct layouts by name, read lazily.

Every Debian kernel carries ``.BTF`` (``CONFIG_DEBUG_INFO_BTF``); it gives member
offsets and sizes without DWARF::

    btf = Btf.from_elf("vmlinux")
    btf.sizeof("pt_regs")
    btf.offsetof("task_struct", "thread.cpu_context.fp")
    btf.member("task_struct", "thread.s[0]")          # -> Member(offset, size, type_id, ...)
    btf.has("frame_record_meta"), btf.has_member("pt_regs", "stackframe")
    btf.enum_value("FRAME_META_TYPE_FINAL"), btf.enumerators("frame_type")

Walking types (``task_struct`` and what it points at)::

    m = btf.member("task_struct", "stack")
    btf.kind(m.type_id)                    # "ptr" (typedef/const/volatile resolved)
    btf.pointee(m.type_id)                 # the pointed-to type id (resolved)
    btf.array(btf.member("pt_regs", "regs").type_id)   # (element type id, nelems)
    btf.members("list_head")               # [("next", Member), ("prev", Member)]

Records follow ``include/uapi/linux/btf.h`` and are declared once below with
``construct``. Construction only walks the record headers (one pass over the
type section, sizes taken from those declarations) and remembers where each
type starts; a type is decoded when first asked for. Anything malformed, in
the blob or in a query, raises :class:`BtfError` with a one-line message.
"""

from __future__ import annotations

import hashlib
import operator
import re
import struct
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, TypeVar

from construct import Const, Construct, Int16ul, Int32sl, Int32ul, Int8ul, Struct
from elftools.common.exceptions import ELFError

from unwind.formats.elfcore import section_data
from unwind.formats.packed import packed

BTF_MAGIC = 0xEB9F

_T = TypeVar("_T")


def _remembered(answers: dict[Any, Any], key: Hashable, answer: Callable[[], _T]) -> _T:
    """``answer()`` the first time ``key`` is asked, the remembered answer after: a :class:`BtfError` is
    remembered as its message and raised again."""
    got = answers.get(key)
    if got is None:
        try:
            got = answer()
        except BtfError as e:
            got = str(e)
        answers[key] = got
    if isinstance(got, str):
        raise BtfError(got)
    return got

#: BTF_KIND_* (uapi/linux/btf.h)
KIND = {1: "int", 2: "ptr", 3: "array", 4: "struct", 5: "union", 6: "enum", 7: "fwd", 8: "typedef",
        9: "volatile", 10: "const", 11: "restrict", 12: "func", 13: "func_proto", 14: "var",
        15: "datasec", 16: "float", 17: "decl_tag", 18: "type_tag", 19: "enum64"}
_KIND_ID = {v: k for k, v in KIND.items()}

Header = Struct(
    "magic" / Const(BTF_MAGIC, Int16ul),
    "version" / Int8ul,
    "flags" / Int8ul,
    "hdr_len" / Int32ul,
    "type_off" / Int32ul,
    "type_len" / Int32ul,
    "str_off" / Int32ul,
    "str_len" / Int32ul,
)

#: struct btf_type: every record starts with it
TypeHeader = Struct("name_off" / Int32ul, "info" / Int32ul, "size_or_type" / Int32ul)

_Member = Struct("name_off" / Int32ul, "type" / Int32ul, "offset" / Int32ul)
_Param = Struct("name_off" / Int32ul, "type" / Int32ul)
_Enum = Struct("name_off" / Int32ul, "val" / Int32ul)
_Enum64 = Struct("name_off" / Int32ul, "lo" / Int32ul, "hi" / Int32ul)
_VarSec = Struct("type" / Int32ul, "offset" / Int32ul, "size" / Int32ul)
_ArrayInfo = Struct("type" / Int32ul, "index_type" / Int32ul, "nelems" / Int32ul)

#: what follows the header, once per record: int encoding, btf_array, var linkage, decl_tag index
EXTRA_ONCE = {1: Int32ul, 3: _ArrayInfo, 14: Int32ul, 17: Int32sl}
#: what follows the header ``vlen`` times: members, enumerators, params, datasec entries
EXTRA_EACH = {4: _Member, 5: _Member, 6: _Enum, 13: _Param, 15: _VarSec, 19: _Enum64}

_HDR_SIZE = Header.sizeof()
_TYPE_HDR = TypeHeader.sizeof()
_ONCE_SIZE = {k: c.sizeof() for k, c in EXTRA_ONCE.items()}
_EACH_SIZE = {k: c.sizeof() for k, c in EXTRA_EACH.items()}


def _decoder(layout: Construct) -> tuple[struct.Struct, Callable[[tuple[int, ...]], Any]]:
    """A record layout declared above, as a ``struct`` format and what makes its value from the
    unpacked fields: an int for one integer, a named tuple of the fields for a struct of integers."""
    if isinstance(layout, Struct):
        return packed(layout), namedtuple("BtfRecord", [sc.name for sc in layout.subcons])._make  # type: ignore[misc]
    return struct.Struct(layout.fmtstr), operator.itemgetter(0)


_DECODE_HDR = _decoder(TypeHeader)
_DECODE_ONCE = {k: _decoder(c) for k, c in EXTRA_ONCE.items()}
_DECODE_EACH = {k: _decoder(c) for k, c in EXTRA_EACH.items()}
#: typedef, volatile, const, restrict, type_tag: resolved through
_MODIFIERS = frozenset({8, 9, 10, 11, 18})
#: enum, enum64: their enumerators are indexed by name
_ENUM_KINDS = frozenset({6, 19})
#: how many modifier/array/anonymous-member hops a query follows (the kernel's MAX_RESOLVE_DEPTH)
MAX_RESOLVE_DEPTH = 32
#: the kinds a bare name means, most wanted first
_DEFAULT_KINDS = (4, 5, 8, 6, 19, 1, 16, 14, 12)
#: pointers are a long wide: every arch here is 64-bit
POINTER_SIZE = 8


class BtfError(Exception):
    """Missing BTF, a malformed blob, or an unknown type or member; the message is one line."""


@dataclass(frozen=True, slots=True)
class Member:
    """A resolved (possibly nested) member: byte offset, byte size, BTF type id, bit position."""

    offset: int
    size: int
    type_id: int
    bit_offset: int = 0
    bit_size: int = 0


@dataclass(frozen=True, slots=True)
class Type:
    """One decoded BTF record: its id, kind name, name and the words after its header."""

    id: int
    kind: str
    name: str
    size_or_type: int
    vlen: int
    kind_flag: int
    extra: Any


_VOID = Type(0, "void", "void", 0, 0, 0, None)
#: the layout of ``$UNWIND_CACHE/btf`` files (:meth:`Btf.cached`)
_INDEX_VERSION = 2
#: the scan's arrays and their ``array`` typecodes
_INDEX_TYPES = {"offsets": "I", "kinds": "B", "named_offs": "I", "named_ids": "I", "enum_offs": "I", "enum_ids": "I"}


def _index_fits(index: dict[str, array]) -> bool:
    """A cached scan whose arrays fit together (one kind per type, one type id per name)."""
    try:
        return (len(index["offsets"]) == len(index["kinds"]) > 0
                and all(len(index[f"{k}_offs"]) == len(index[f"{k}_ids"]) for k in ("named", "enum"))
                and all(index[k].typecode == t for k, t in _INDEX_TYPES.items())
                and all(not index[k] or max(index[k]) < len(index["offsets"]) for k in ("named_ids", "enum_ids")))
    except KeyError:
        return False


class Btf:
    """BTF types with lazy decoding, name lookup and member-path resolution."""

    def __init__(self, blob: bytes, index: "dict[str, array] | None" = None) -> None:
        """Check ``blob``'s header and scan its records (or take the scan from ``index``, which
        :meth:`cached` read back for the same blob)."""
        self._blob = memoryview(bytes(blob))
        hdr = self._header()
        base = hdr.hdr_len
        types = (base + hdr.type_off, base + hdr.type_off + hdr.type_len)
        strs = (base + hdr.str_off, base + hdr.str_off + hdr.str_len)
        if types[1] > len(self._blob) or strs[1] > len(self._blob):
            raise BtfError("truncated BTF blob (sections run past its end)")
        self._types = self._blob[types[0]:types[1]]
        self.strings = bytes(self._blob[strs[0]:strs[1]])
        index = index or self._scan()
        #: type id -> offset in the type section (id 0 is void), and its kind
        self._offsets: array = index["offsets"]
        self._kinds: array = index["kinds"]
        #: the name offsets of named types and their ids, ordered by name (then id)
        self._named_offs: array = index["named_offs"]
        self._named_ids: array = index["named_ids"]
        #: the name offsets of every enumerator and its enum's id, ordered by name (then id)
        self._enum_offs: array = index["enum_offs"]
        self._enum_ids: array = index["enum_ids"]
        self._decoded: dict[int, Type] = {0: _VOID}
        #: member paths resolved, and the messages of those that are not there
        self._members: dict[tuple[str | int, str], Member | str] = {}
        #: type ids found by name and kind, and the messages of those that are not there
        self._found: dict[tuple[str, str | None], int | str] = {}

    @classmethod
    def from_elf(cls, path: str | Path) -> "Btf":
        """Read the ``.BTF`` section of an ELF file (a vmlinux or a slim image)."""
        from elftools.elf.elffile import ELFFile  # here: an image's BTF is read through unwind.formats.image

        try:
            with open(path, "rb") as f:
                sec = ELFFile(f).get_section_by_name(".BTF")
                if sec is None or sec["sh_type"] == "SHT_NOBITS":
                    raise BtfError(f"{path} has no .BTF section (kernel built without DEBUG_INFO_BTF?)")
                return cls(section_data(sec))
        except OSError as e:
            raise BtfError(f"cannot read {path}: {e.strerror}") from None
        except (ELFError, ValueError, zlib.error) as e:
            raise BtfError(f"{path}: not a readable ELF file ({e})") from None

    # -- the blob ------------------------------------------------------------------------------

    def _header(self) -> Any:
        """struct btf_header, checked (btf_parse_hdr())."""
        if len(self._blob) < _HDR_SIZE:
            raise BtfError("not a BTF blob (truncated header)")
        if self._blob[:2] == BTF_MAGIC.to_bytes(2, "big"):
            raise BtfError("big-endian BTF is not supported")
        try:
            hdr = Header.parse(self._blob)
        except Exception:
            raise BtfError("not a BTF blob (bad magic)") from None
        if hdr.hdr_len < _HDR_SIZE:
            raise BtfError(f"bad BTF header length {hdr.hdr_len}")
        return hdr

    @classmethod
    def cached(cls, blob: bytes) -> "Btf":
        """``Btf(blob)``, its record scan kept in ``$UNWIND_CACHE/btf`` per blob (SHA-1): a kernel's
        ~100k types take ~150 ms to scan and order by name, ~10 ms (hash included) to read back. A damaged
        entry is rebuilt."""
        from unwind.formats.cachefile import CacheFileError, cache_dir, read_arrays, write_arrays, write_atomically

        digest = hashlib.sha1(blob).hexdigest()
        folder = cache_dir("btf")
        path = folder / f"{digest}-v{_INDEX_VERSION}.arrays" if folder is not None else None
        if path is not None and path.exists():
            try:
                meta, index = read_arrays(path)
                if meta.get("sha1") == digest and _index_fits(index):
                    return cls(blob, index)
            except (OSError, CacheFileError):
                pass
        btf = cls(blob)
        if path is not None:
            index = {"offsets": btf._offsets, "kinds": btf._kinds, "named_offs": btf._named_offs,
                     "named_ids": btf._named_ids, "enum_offs": btf._enum_offs, "enum_ids": btf._enum_ids}
            write_atomically(path, lambda f: write_arrays(f, {"sha1": digest}, index))
        return btf

    def _scan(self) -> dict[str, array]:
        """One pass over the record headers: where each type starts, its kind and name offset, and
        the name offset of every enumerator; the names are then put in order for bisection."""
        data, end, pos = self._types, len(self._types), 0
        offsets, kinds, named, enums = [0], bytearray(1), ([], []), ([], [])
        unpack = struct.Struct("<II").unpack_from
        unpack_name = struct.Struct("<I").unpack_from
        once, each = _ONCE_SIZE, _EACH_SIZE
        while pos < end:
            if pos + _TYPE_HDR > end:
                raise BtfError(f"truncated BTF type {len(offsets)}")
            name_off, info = unpack(data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind not in KIND:
                raise BtfError(f"BTF type {len(offsets)} has unknown kind {kind}")
            size = _TYPE_HDR + once.get(kind, 0) + vlen * each.get(kind, 0)
            if pos + size > end:
                raise BtfError(f"truncated BTF type {len(offsets)}")
            if name_off:
                named[0].append(name_off)
                named[1].append(len(offsets))
            if kind in _ENUM_KINDS:
                for (off,) in (unpack_name(data, e) for e in range(pos + _TYPE_HDR, pos + size, each[kind])):
                    if off:
                        enums[0].append(off)
                        enums[1].append(len(offsets))
            offsets.append(pos)
            kinds.append(kind)
            pos += size
        return {"offsets": array("I", offsets), "kinds": array("B", kinds),
                **self._by_name("named", *named), **self._by_name("enum", *enums)}

    def _by_name(self, what: str, offs: list[int], ids: list[int]) -> dict[str, array]:
        """``offs`` and ``ids`` (in id order) ordered by name, then id: ``{what}_offs``, ``{what}_ids``."""
        keys = [self._name_key(off) for off in offs]
        order = sorted(range(len(offs)), key=keys.__getitem__)  # stable: equal names stay in id order
        return {f"{what}_offs": array("I", [offs[i] for i in order]), f"{what}_ids": array("I", [ids[i] for i in order])}

    def _name_key(self, off: int) -> bytes:
        """The bytes of the string at ``off`` (the names' sort key; past the section: empty)."""
        end = self.strings.find(b"\0", off)
        return self.strings[off:end] if end >= 0 else self.strings[off:]

    def _named(self, off: int, key: bytes) -> bool:
        """Is the string at ``off`` ``key`` (a name's bytes and its NUL)?"""
        return self.strings.startswith(key, off)

    def _ids_by_name(self, offs: array, ids: array, name: str) -> array:
        """The ids beside the name offsets in ``offs`` (ordered by name) whose string is ``name``."""
        key = name.encode()
        lo = bisect_left(offs, key, key=self._name_key)
        hi = bisect_right(offs, key, lo, key=self._name_key)
        return ids[lo:hi]

    def name(self, off: int) -> str:
        """The string at ``off`` in the string section."""
        end = self.strings.find(b"\0", off)
        if off < 0 or off >= len(self.strings) or end < 0:
            raise BtfError(f"BTF string offset {off} outside the string section")
        return self.strings[off:end].decode("utf-8", "replace")

    def __len__(self) -> int:
        """The number of type ids, void included."""
        return len(self._offsets)

    def types_end(self, count: int) -> int:
        """Bytes of the type section that hold types 1..``count`` (all of it past the last type)."""
        if count < 0:
            raise BtfError(f"BTF type count {count} is negative")
        return self._offsets[count + 1] if count + 1 < len(self._offsets) else len(self._types)

    # -- types by id ---------------------------------------------------------------------------

    def type(self, tid: int) -> Type:
        """The decoded record of type ``tid`` (0 is void)."""
        got = self._decoded.get(tid)
        if got is not None:
            return got
        if not 0 < tid < len(self._offsets):
            raise BtfError(f"BTF type id {tid} out of range")
        pos, kind = self._offsets[tid], self._kinds[tid]
        fmt, make = _DECODE_HDR
        hdr = make(fmt.unpack_from(self._types, pos))
        vlen = hdr.info & 0xFFFF
        start = pos + _TYPE_HDR
        if kind in _DECODE_ONCE:
            fmt, make = _DECODE_ONCE[kind]
            extra: Any = make(fmt.unpack_from(self._types, start))
        elif kind in _DECODE_EACH:
            fmt, make = _DECODE_EACH[kind]
            extra = [make(fields) for fields in fmt.iter_unpack(self._types[start:start + vlen * fmt.size])]
        else:
            extra = None
        got = Type(tid, KIND[kind], self.name(hdr.name_off) if hdr.name_off else "", hdr.size_or_type,
                   vlen, hdr.info >> 31, extra)
        self._decoded[tid] = got
        return got

    def kind(self, tid: int) -> str:
        """The kind of ``tid`` once typedefs and qualifiers are resolved ("struct", "ptr", ...)."""
        return self.type(self.resolve(tid)).kind

    def resolve(self, tid: int) -> int:
        """Skip typedef/const/volatile/restrict/type_tag."""
        for _ in range(MAX_RESOLVE_DEPTH):
            if tid == 0 or self._kind_of(tid) not in _MODIFIERS:
                return tid
            tid = self.type(tid).size_or_type
        raise BtfError(f"BTF type {tid}: typedef/qualifier chain too long (a loop?)")

    def _kind_of(self, tid: int) -> int:
        if not 0 <= tid < len(self._kinds):
            raise BtfError(f"BTF type id {tid} out of range")
        return self._kinds[tid]

    def sizeof_id(self, tid: int, _depth: int = 0) -> int:
        """Byte size of type ``tid``."""
        if _depth > MAX_RESOLVE_DEPTH:
            raise BtfError(f"BTF type {tid}: nested too deep (a loop?)")
        tid = self.resolve(tid)
        if tid == 0:
            return 0
        t = self.type(tid)
        if t.kind == "ptr":
            return POINTER_SIZE
        if t.kind == "array":
            return t.extra.nelems * self.sizeof_id(t.extra.type, _depth + 1)
        if t.kind in ("int", "struct", "union", "enum", "enum64", "float", "datasec"):
            return t.size_or_type
        raise BtfError(f"BTF type {tid} ({t.kind}) has no size")

    def pointee(self, tid: int) -> int:
        """The (resolved) type a pointer type points at."""
        t = self.type(self.resolve(tid))
        if t.kind != "ptr":
            raise BtfError(f"BTF type {tid} is a {t.kind}, not a pointer")
        return self.resolve(t.size_or_type)

    def array(self, tid: int) -> tuple[int, int]:
        """``(element type id, nelems)`` of an array type."""
        t = self.type(self.resolve(tid))
        if t.kind != "array":
            raise BtfError(f"BTF type {tid} is a {t.kind}, not an array")
        return t.extra.type, t.extra.nelems

    def type_name(self, tid: int, _depth: int = 0) -> str:
        """A C-ish spelling of ``tid``: ``struct pt_regs``, ``u64``, ``struct list_head *``."""
        if _depth > MAX_RESOLVE_DEPTH:
            return "?"
        t = self.type(tid)
        if t.kind in ("ptr", "const", "volatile", "restrict", "type_tag"):
            inner = self.type_name(t.size_or_type, _depth + 1)
            return f"{inner} *" if t.kind == "ptr" else f"{t.kind} {inner}"
        if t.kind == "array":
            return f"{self.type_name(t.extra.type, _depth + 1)}[{t.extra.nelems}]"
        if t.kind in ("struct", "union", "enum", "enum64"):
            return f"{'enum' if t.kind == 'enum64' else t.kind} {t.name or '(anon)'}"
        return t.name or t.kind

    # -- types by name -------------------------------------------------------------------------

    def find(self, name: str, kind: str | None = None) -> int:
        """Type id of the named type (struct/union/typedef/enum/int... or the given ``kind``)."""
        return _remembered(self._found, (name, kind), lambda: self._find(name, kind))

    def _find(self, name: str, kind: str | None) -> int:
        """:meth:`find`, by a bisection of the names."""
        if kind is not None and kind not in _KIND_ID:
            raise BtfError(f"no BTF kind {kind!r}")
        wanted = (_KIND_ID[kind],) if kind else _DEFAULT_KINDS
        ids = self._ids_by_name(self._named_offs, self._named_ids, name)
        for k in wanted:
            for tid in ids:
                if self._kinds[tid] == k:
                    return tid
        raise BtfError(f"no BTF type {name!r}" + (f" of kind {kind}" if kind else ""))

    def has(self, name: str, kind: str | None = None) -> bool:
        """Whether the named type exists."""
        try:
            self.find(name, kind)
        except BtfError:
            return False
        return True

    def _tid(self, type_: str | int) -> int:
        return type_ if isinstance(type_, int) else self.find(type_)

    def sizeof(self, type_: str | int) -> int:
        """Byte size of the named (or numbered) struct/union/typedef/int."""
        return self.sizeof_id(self._tid(type_))

    # -- members -------------------------------------------------------------------------------

    def members(self, type_: str | int) -> list[tuple[str, Member]]:
        """The direct members of a struct or union (anonymous ones named ``""``)."""
        t = self.type(self.resolve(self._tid(type_)))
        if t.kind not in ("struct", "union"):
            raise BtfError(f"BTF type {t.id} is a {t.kind}, not a struct or union")
        return [(self.name(m.name_off) if m.name_off else "", self._member_at(t, m)) for m in t.extra]

    def _member_at(self, t: Type, m: Any) -> Member:
        """btf_member_bit_offset()/btf_member_bitfield_size() of one member record."""
        bits = m.offset & 0xFFFFFF if t.kind_flag else m.offset
        bsize = m.offset >> 24 if t.kind_flag else 0
        return Member(bits // 8, 0 if bsize else self.sizeof_id(m.type), m.type, bits, bsize)

    def _field(self, tid: int, name: str, depth: int = 0) -> Member | None:
        """The member ``name`` of struct/union ``tid``, looking inside anonymous members."""
        if depth > MAX_RESOLVE_DEPTH:
            raise BtfError(f"BTF type {tid}: anonymous members nested too deep (a loop?)")
        t = self.type(self.resolve(tid))
        if t.kind not in ("struct", "union"):
            return None
        key = name.encode() + b"\0"
        for m in t.extra:
            if m.name_off and self._named(m.name_off, key):
                return self._member_at(t, m)
            if not m.name_off:
                inner = self._field(m.type, name, depth + 1)
                if inner is not None:
                    bits = self._member_at(t, m).bit_offset
                    return Member(bits // 8 + inner.offset, inner.size, inner.type_id,
                                  bits + inner.bit_offset, inner.bit_size)
        return None

    def member(self, type_: str | int, path: str) -> Member:
        """Resolve ``a.b[2].c`` inside ``type_`` (a name or a type id) to its offset from the start."""
        got = self._members.get((type_, path))  # a member asked before (each task's, per task): one look-up
        if isinstance(got, Member):
            return got
        return _remembered(self._members, (type_, path), lambda: self._walk_path(self._tid(type_), type_, path))

    def _walk_path(self, tid: int, what: str | int, path: str) -> Member:
        off = bits = bsize = size = 0
        for part in path.split("."):
            m = re.fullmatch(r"(\w+)((?:\[\d+\])*)", part)
            if not m:
                raise BtfError(f"bad member path {path!r}")
            f = self._field(tid, m.group(1))
            if f is None:
                raise BtfError(f"{what} has no member {path!r}")
            bits = off * 8 + f.bit_offset
            off += f.offset
            tid, size, bsize = f.type_id, f.size, f.bit_size
            for idx in re.findall(r"\[(\d+)\]", m.group(2)):
                if self.kind(tid) != "array":
                    raise BtfError(f"{what}.{path}: {m.group(1)} is not an array")
                tid, nelems = self.array(tid)
                if int(idx) >= nelems > 0:
                    raise BtfError(f"{what}.{path}: index {idx} past {m.group(1)}[{nelems}]")
                size = self.sizeof_id(tid)
                off += int(idx) * size
                bits, bsize = off * 8, 0
        return Member(off, size, tid, bits, bsize)

    def has_member(self, type_: str | int, path: str) -> bool:
        """Whether ``type_`` exists and has the member ``path``."""
        try:
            self.member(type_, path)
        except BtfError:
            return False
        return True

    def offsetof(self, type_: str | int, path: str) -> int:
        """Byte offset of ``path`` in ``type_``."""
        return self.member(type_, path).offset

    # -- enums ---------------------------------------------------------------------------------

    def _enum_value(self, t: Type, e: Any) -> int:
        """An enumerator's value: signed when the enum says so (btf_kflag())."""
        if t.kind == "enum64":
            v = e.lo | e.hi << 32
            return v - (1 << 64) if t.kind_flag and v >> 63 else v
        return e.val - (1 << 32) if t.kind_flag and e.val >> 31 else e.val

    def enumerators(self, type_: str | int) -> dict[str, int]:
        """``{name: value}`` of an enum type."""
        t = self.type(self.resolve(self._tid(type_)))
        if t.kind not in ("enum", "enum64"):
            raise BtfError(f"BTF type {t.id} is a {t.kind}, not an enum")
        return {self.name(e.name_off): self._enum_value(t, e) for e in t.extra}

    def enum_value(self, name: str) -> int:
        """Value of the enumerator ``name`` (searched in every enum)."""
        key = name.encode() + b"\0"
        for tid in self._ids_by_name(self._enum_offs, self._enum_ids, name):
            t = self.type(tid)
            for e in t.extra:
                if self._named(e.name_off, key):
                    return self._enum_value(t, e)
        raise BtfError(f"no enumerator {name!r}")
