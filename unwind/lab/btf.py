"""A BTF (BPF Type Format) reader built with ``construct``: struct layouts by name.

Every Debian kernel carries ``.BTF``; this gives member offsets without DWARF::

    btf = Btf.from_elf("vmlinux")
    btf.offsetof("task_struct", "thread.cpu_context.fp")
    btf.sizeof("pt_regs")
    btf.member("task_struct", "thread.s[0]")      # -> Member(offset, size, type_id)

Record layouts follow ``include/uapi/linux/btf.h``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from construct import (Array, Computed, Const, GreedyRange, Int16ul, Int32sl, Int32ul, Int8ul,
                       Pass, Struct, Switch, this)
from elftools.elf.elffile import ELFFile

BTF_MAGIC = 0xEB9F

KIND = {1: "int", 2: "ptr", 3: "array", 4: "struct", 5: "union", 6: "enum", 7: "fwd", 8: "typedef",
        9: "volatile", 10: "const", 11: "restrict", 12: "func", 13: "func_proto", 14: "var",
        15: "datasec", 16: "float", 17: "decl_tag", 18: "type_tag", 19: "enum64"}

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

_Member = Struct("name_off" / Int32ul, "type" / Int32ul, "offset" / Int32ul)
_Param = Struct("name_off" / Int32ul, "type" / Int32ul)
_Enum = Struct("name_off" / Int32ul, "val" / Int32sl)
_Enum64 = Struct("name_off" / Int32ul, "lo" / Int32ul, "hi" / Int32ul)
_VarSec = Struct("type" / Int32ul, "offset" / Int32ul, "size" / Int32ul)
_ArrayInfo = Struct("type" / Int32ul, "index_type" / Int32ul, "nelems" / Int32ul)

BtfType = Struct(
    "name_off" / Int32ul,
    "info" / Int32ul,
    "size_or_type" / Int32ul,
    "kind" / Computed((this.info >> 24) & 0x1F),
    "vlen" / Computed(this.info & 0xFFFF),
    "kind_flag" / Computed(this.info >> 31),
    "extra" / Switch(this.kind, {
        1: Int32ul,
        3: _ArrayInfo,
        4: Array(this.vlen, _Member),
        5: Array(this.vlen, _Member),
        6: Array(this.vlen, _Enum),
        13: Array(this.vlen, _Param),
        14: Int32ul,
        15: Array(this.vlen, _VarSec),
        17: Int32sl,
        19: Array(this.vlen, _Enum64),
    }, default=Pass),
)

BtfTypes = GreedyRange(BtfType)

_MODIFIERS = {8, 9, 10, 11, 18}  # typedef, volatile, const, restrict, type_tag


class BtfError(Exception):
    """Missing BTF, a bad blob, or an unknown type/member; the message is one line."""


@dataclass(frozen=True)
class Member:
    """A resolved (possibly nested) member: byte offset, byte size, BTF type id."""

    offset: int
    size: int
    type_id: int
    bit_offset: int = 0
    bit_size: int = 0


class Btf:
    """Parsed BTF types with name lookup and member-path resolution."""

    def __init__(self, blob: bytes) -> None:
        try:
            hdr = Header.parse(blob)
        except Exception:
            raise BtfError("not a BTF blob (bad magic or truncated header)") from None
        base = hdr.hdr_len
        tdata = blob[base + hdr.type_off: base + hdr.type_off + hdr.type_len]
        self.strings = blob[base + hdr.str_off: base + hdr.str_off + hdr.str_len]
        if len(tdata) != hdr.type_len or len(self.strings) != hdr.str_len:
            raise BtfError("truncated BTF blob")
        parsed = _parse_types(tdata)
        self.types: list = [None] + list(parsed)  # type id 0 is void
        self._by_name: dict[tuple[str, int], int] = {}
        for tid in range(len(self.types) - 1, 0, -1):
            t = self.types[tid]
            if t.name_off:
                self._by_name[(self.name(t.name_off), t.kind)] = tid

    @classmethod
    def from_elf(cls, path: str | Path) -> "Btf":
        """Read the ``.BTF`` section of an ELF file (a vmlinux)."""
        try:
            with open(path, "rb") as f:
                sec = ELFFile(f).get_section_by_name(".BTF")
                if sec is None:
                    raise BtfError(f"{path} has no .BTF section (kernel built without DEBUG_INFO_BTF?)")
                return cls(sec.data())
        except OSError as e:
            raise BtfError(f"cannot read {path}: {e.strerror}") from None

    def name(self, off: int) -> str:
        """The string at ``off`` in the string section."""
        end = self.strings.index(b"\0", off)
        return self.strings[off:end].decode()

    def find(self, name: str, kind: str | None = None) -> int:
        """Type id of the named type (struct/union/typedef/enum/int... or the given ``kind``)."""
        kinds = [k for k, v in KIND.items() if v == kind] if kind else [4, 5, 8, 6, 19, 1, 16, 14, 12]
        for k in kinds:
            tid = self._by_name.get((name, k))
            if tid is not None:
                return tid
        raise BtfError(f"no BTF type {name!r}" + (f" of kind {kind}" if kind else ""))

    def resolve(self, tid: int) -> int:
        """Skip typedef/const/volatile/restrict/type_tag."""
        while tid and self.types[tid].kind in _MODIFIERS:
            tid = self.types[tid].size_or_type
        return tid

    def sizeof_id(self, tid: int) -> int:
        """Byte size of type ``tid``."""
        tid = self.resolve(tid)
        if tid == 0:
            return 0
        t = self.types[tid]
        if t.kind == 2:
            return 8
        if t.kind == 3:
            return t.extra.nelems * self.sizeof_id(t.extra.type)
        if t.kind in (1, 4, 5, 6, 16, 19, 15):
            return t.size_or_type
        raise BtfError(f"type {tid} ({KIND.get(t.kind)}) has no size")

    def sizeof(self, name: str) -> int:
        """Byte size of the named struct/union/typedef."""
        return self.sizeof_id(self.find(name))

    def _field(self, tid: int, name: str) -> Member | None:
        t = self.types[self.resolve(tid)]
        if t.kind not in (4, 5):
            return None
        for m in t.extra:
            bits = m.offset & 0xFFFFFF if t.kind_flag else m.offset
            bsize = m.offset >> 24 if t.kind_flag else 0
            if m.name_off and self.name(m.name_off) == name:
                return Member(bits // 8, self.sizeof_id(m.type) if not bsize else 0, m.type,
                              bits, bsize)
            if not m.name_off:  # anonymous struct/union: look inside
                inner = self._field(m.type, name)
                if inner is not None:
                    return Member(bits // 8 + inner.offset, inner.size, inner.type_id,
                                  bits + inner.bit_offset, inner.bit_size)
        return None

    @lru_cache(maxsize=4096)
    def member(self, struct: str, path: str) -> Member:
        """Resolve ``a.b[2].c`` inside ``struct`` to its offset from the struct start."""
        tid = self.find(struct)
        off = 0
        bits = bsize = 0
        for part in path.split("."):
            m = re.fullmatch(r"(\w+)((?:\[\d+\])*)", part)
            if not m:
                raise BtfError(f"bad member path {path!r}")
            f = self._field(tid, m.group(1))
            if f is None:
                raise BtfError(f"{struct} has no member {path!r}")
            off += f.offset
            tid, size = f.type_id, f.size
            bits, bsize = off * 8 + f.bit_offset - f.offset * 8, f.bit_size
            for idx in re.findall(r"\[(\d+)\]", m.group(2)):
                t = self.types[self.resolve(tid)]
                if t.kind != 3:
                    raise BtfError(f"{struct}.{path}: {m.group(1)} is not an array")
                tid = t.extra.type
                size = self.sizeof_id(tid)
                off += int(idx) * size
                bits, bsize = off * 8, 0
        return Member(off, size, tid, bits, bsize)

    def offsetof(self, struct: str, path: str) -> int:
        """Byte offset of ``path`` in ``struct``."""
        return self.member(struct, path).offset

    def enum_value(self, name: str) -> int:
        """Value of the enumerator ``name`` (searched in every enum)."""
        for t in self.types[1:]:
            if t.kind == 6:
                for e in t.extra:
                    if self.name(e.name_off) == name:
                        return e.val
            elif t.kind == 19:
                for e in t.extra:
                    if self.name(e.name_off) == name:
                        return e.lo | e.hi << 32
        raise BtfError(f"no enumerator {name!r}")


def _parse_types(data: bytes) -> list:
    try:
        return _COMPILED.parse(data)
    except Exception as e:
        raise BtfError(f"bad BTF type section: {e}") from None


try:
    _COMPILED = BtfTypes.compile()
except Exception:  # construct's compiler needs a writable temp dir; the interpreter is the fallback
    _COMPILED = BtfTypes
