"""Build small BTF blobs for tests, with the reader's own construct records (``unwind.btf``)."""

from __future__ import annotations

from typing import Any

from unwind.btf import BTF_MAGIC, EXTRA_EACH, EXTRA_ONCE, Header, TypeHeader

_KINDS = {"int": 1, "ptr": 2, "array": 3, "struct": 4, "union": 5, "enum": 6, "var": 14}


class BtfBuilder:
    """Types are added in order; each ``add`` returns the new type id."""

    def __init__(self) -> None:
        self._strings = bytearray(b"\0")
        self._offs: dict[str, int] = {"": 0}
        self._types: list[bytes] = []
        self.long = self.int("long", 8)
        self.u32 = self.int("unsigned int", 4)
        self.char = self.int("char", 1)
        self.voidp = self.ptr(0)

    def _str(self, s: str) -> int:
        if s not in self._offs:
            self._offs[s] = len(self._strings)
            self._strings += s.encode() + b"\0"
        return self._offs[s]

    def _add(self, name: str, kind: str, vlen: int, size_or_type: int, extra: Any = None) -> int:
        k = _KINDS[kind]
        rec = TypeHeader.build(dict(name_off=self._str(name), info=(k << 24) | vlen, size_or_type=size_or_type))
        if k in EXTRA_ONCE:
            rec += EXTRA_ONCE[k].build(extra)
        elif k in EXTRA_EACH:
            rec += b"".join(EXTRA_EACH[k].build(e) for e in extra)
        self._types.append(rec)
        return len(self._types)

    def int(self, name: str, size: int) -> int:
        return self._add(name, "int", 0, size, size * 8)

    def ptr(self, target: int) -> int:
        return self._add("", "ptr", 0, target)

    def array(self, elem: int, n: int) -> int:
        return self._add("", "array", 0, 0, dict(type=elem, index_type=self.u32 if hasattr(self, "u32") else 1,
                                                  nelems=n))

    def struct(self, name: str, size: int, members: list[tuple[str, int, int]]) -> int:
        """``members``: (name, type id, byte offset)."""
        return self._add(name, "struct", len(members), size,
                         [dict(name_off=self._str(n), type=t, offset=off * 8) for n, t, off in members])

    def enum(self, name: str, values: dict[str, int]) -> int:
        return self._add(name, "enum", len(values), 4, [dict(name_off=self._str(n), val=v) for n, v in values.items()])

    def var(self, name: str, type_: int) -> int:
        return self._add(name, "var", 0, type_, 1)

    def blob(self) -> bytes:
        types = b"".join(self._types)
        hdr = Header.build(dict(magic=BTF_MAGIC, version=1, flags=0, hdr_len=24, type_off=0, type_len=len(types),
                                str_off=len(types), str_len=len(self._strings)))
        return hdr + types + bytes(self._strings)
