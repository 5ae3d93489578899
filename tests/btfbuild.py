"""A small BTF writer for tests: types declared here, encoded with unwind.kernel.btf's own construct records."""

from __future__ import annotations

from construct import Array

from unwind.kernel.btf import BTF_MAGIC, EXTRA_EACH, EXTRA_ONCE, Header, TypeHeader

_KIND = {"int": 1, "ptr": 2, "array": 3, "struct": 4, "union": 5, "enum": 6, "typedef": 8, "var": 14}


class BtfBuilder:
    """Add types, get their ids; :meth:`blob` is the ``.BTF`` section."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types: list[bytes] = []
        self._offsets: dict[str, int] = {"": 0}

    def _str(self, name: str) -> int:
        if name not in self._offsets:
            self._offsets[name] = len(self.strings)
            self.strings += name.encode() + b"\0"
        return self._offsets[name]

    def _add(self, name: str, kind: str, vlen: int, size_or_type: int, extra=None, kflag: int = 0) -> int:
        k = _KIND[kind]
        rec = TypeHeader.build(dict(name_off=self._str(name), info=(kflag << 31) | (k << 24) | vlen,
                                    size_or_type=size_or_type))
        if k in EXTRA_ONCE:
            rec += EXTRA_ONCE[k].build(extra)
        elif k in EXTRA_EACH:
            rec += Array(vlen, EXTRA_EACH[k]).build(extra)
        self.types.append(rec)
        return len(self.types)

    def int(self, name: str, size: int) -> int:
        """An integer type of ``size`` bytes."""
        return self._add(name, "int", 0, size, size * 8)

    def ptr(self, tid: int) -> int:
        """A pointer to ``tid``."""
        return self._add("", "ptr", 0, tid)

    def array(self, tid: int, nelems: int, index: int = 1) -> int:
        """``tid[nelems]``."""
        return self._add("", "array", 0, 0, dict(type=tid, index_type=index, nelems=nelems))

    def struct(self, name: str, size: int, members: list[tuple[str, int, int]], kind: str = "struct") -> int:
        """A struct (or union) of ``(member, type id, byte offset)``."""
        return self._add(name, kind, len(members), size,
                         [dict(name_off=self._str(m), type=t, offset=off * 8) for m, t, off in members])

    def enum(self, name: str, values: dict[str, int]) -> int:
        """A 4-byte enum of ``values``."""
        return self._add(name, "enum", len(values), 4, [dict(name_off=self._str(n), val=v) for n, v in values.items()])

    def var(self, name: str, tid: int) -> int:
        """A global variable of type ``tid``."""
        return self._add(name, "var", 0, tid, 1)

    def blob(self) -> bytes:
        """The BTF section: header, types, strings."""
        types = b"".join(self.types)
        hdr = Header.build(dict(magic=BTF_MAGIC, version=1, flags=0, hdr_len=24, type_off=0,
                                type_len=len(types), str_off=len(types), str_len=len(self.strings)))
        return hdr + types + bytes(self.strings)
