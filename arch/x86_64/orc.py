"""ORC tables: every format generation, normalised to one form, with the kernel's lookup.

The raw tables are ``.orc_unwind_ip`` (``s32`` self-relative offsets:
``ip = &table[i] + table[i]``, ``orc_ip()`` in ``unwind_orc.c``) and
``.orc_unwind`` (6-byte ``struct orc_entry``, declared per generation in
:mod:`.structs`). They are decoded once into numpy columns and normalised,
like drgn's loader, so nothing after this module knows old formats:

- **types** use the v3 numbering (v6.4+): ``UNDEFINED 0, END_OF_STACK 1, CALL 2,
  REGS 3, REGS_PARTIAL 4``. v1/v2 ``CALL 0, REGS 1, REGS_PARTIAL 2`` become
  ``type + 2``; their ``sp_reg == UNDEFINED`` entries become ``END_OF_STACK``
  when ``end`` is set and ``UNDEFINED`` otherwise.
- **signal**: v1 has no bit; REGS and REGS_PARTIAL imply it (``unwind_orc.c``
  before ffb1b4a41016 set ``state->signal`` per type).
- **registers** use the v4 numbering (v7.1+, 1735858caa4b), the only one with
  every register: ``UNDEFINED 0, AX 1, DX 2, SP 3, BP 4, DI 5, R10 6, R13 7,
  PREV_SP 8, SP_INDIRECT 9, BP_INDIRECT 10``. v1-v3 numbers are mapped; the
  stable backport of ``ORC_REG_AX = 10`` (96f3b16a9de5) maps to AX. Numbers no
  generation defines (11..15) stay as they are, so the unwinder rejects them
  as the kernel does.

Lookup mirrors ``orc_find()``: the null-ip entry, the ``.orc_lookup`` table of
256-byte text blocks that ``unwind_init()`` builds at boot (it is NOBITS in the
file, so it is built here), ``__orc_find()``'s rightmost entry ``<= ip`` (so a
section terminator loses to a real entry at the same ip), the full-table
search for init text, and ``None`` where the kernel would return NULL (the
unwinder then uses ``orc_fp_entry``). The batch form refines the same block
table to 32-byte sub-blocks with an occupancy bitmap: within a block, the
search becomes a population count.
"""

from __future__ import annotations

import bisect
import hashlib
import re
import weakref
from array import array
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from unwind.formats.cachefile import CacheFileError, cache_dir, read_arrays, write_arrays, write_atomically
from unwind.formats.image import Image, ImageError

from .structs import ORC_ENTRY_SIZE, flag_bits, orc_entry

if TYPE_CHECKING:
    import numpy as np

    from unwind.core.target import Target

# ORC_TYPE_* (normalised: v3 numbering)
ORC_TYPE_UNDEFINED = 0
ORC_TYPE_END_OF_STACK = 1
ORC_TYPE_CALL = 2
ORC_TYPE_REGS = 3
ORC_TYPE_REGS_PARTIAL = 4

# ORC_REG_* (normalised: v4 numbering)
ORC_REG_UNDEFINED = 0
ORC_REG_AX = 1
ORC_REG_DX = 2
ORC_REG_SP = 3
ORC_REG_BP = 4
ORC_REG_DI = 5
ORC_REG_R10 = 6
ORC_REG_R13 = 7
ORC_REG_PREV_SP = 8
ORC_REG_SP_INDIRECT = 9
ORC_REG_BP_INDIRECT = 10

TYPE_NAMES = {ORC_TYPE_UNDEFINED: "(und)", ORC_TYPE_END_OF_STACK: "end", ORC_TYPE_CALL: "call",
              ORC_TYPE_REGS: "regs", ORC_TYPE_REGS_PARTIAL: "regs (partial)"}
REG_NAMES = {ORC_REG_UNDEFINED: "undef", ORC_REG_AX: "ax", ORC_REG_DX: "dx", ORC_REG_SP: "sp", ORC_REG_BP: "bp",
             ORC_REG_DI: "di", ORC_REG_R10: "r10", ORC_REG_R13: "r13", ORC_REG_PREV_SP: "prevsp",
             ORC_REG_SP_INDIRECT: "sp(ind)", ORC_REG_BP_INDIRECT: "bp(ind)"}

#: v1..v3 register number -> normalised (v4) number; v4 is the identity
_OLD_TO_V4 = (ORC_REG_UNDEFINED, ORC_REG_PREV_SP, ORC_REG_DX, ORC_REG_DI, ORC_REG_BP, ORC_REG_SP,
              ORC_REG_R10, ORC_REG_R13, ORC_REG_BP_INDIRECT, ORC_REG_SP_INDIRECT, ORC_REG_AX, 11, 12, 13, 14, 15)
_V4_TO_OLD = tuple(_OLD_TO_V4.index(v4) for v4 in range(len(_OLD_TO_V4)))

#: ``.orc_header`` hashes (``scripts/orc_hash.sh``; drgn ``orc_version_from_header``)
ORC_HASHES: dict[bytes, int] = {
    bytes.fromhex("db84aed4103b31dd51e017f8f79783ca985c2c51"): 2,   # v6.3
    bytes.fromhex("fe5d32bf581bd63b2ca9a5c65ba5a625eab3fe24"): 3,   # v6.4 .. v7.0
    bytes.fromhex("137c36ad7627c4dd55932176bb0ecdbd5041fc82"): 4,   # v7.1+
}
VERSIONS = (1, 2, 3, 4)

LOOKUP_BLOCK_ORDER = 8                        # orc_lookup.h
LOOKUP_BLOCK_SIZE = 1 << LOOKUP_BLOCK_ORDER
_SUB_ORDER = 5                                # batch sub-blocks: 32 bytes, one u32 bitmap word each

#: :meth:`OrcTable.orc_find_batch` results that are not table indices
NOT_FOUND = -1
NULL_ENTRY = -2
#: up to this many ips, :meth:`OrcTable.orc_find_batch` asks :meth:`OrcTable.find_index` of each: a lockstep
#: bisection costs its numpy calls whatever the count (compiled: 56 µs for 1 ip against 3 µs, even at ~128)
SCALAR_IPS = 64


class OrcFormatError(ImageError):
    """The ORC tables cannot be read: unknown format, missing or inconsistent sections."""


class OrcEntry:
    """One normalised ``struct orc_entry`` (types v3-numbered, registers v4-numbered); a value, never changed."""

    __slots__ = ("sp_offset", "bp_offset", "sp_reg", "bp_reg", "type", "signal")

    def __init__(self, sp_offset: int, bp_offset: int, sp_reg: int, bp_reg: int, type: int, signal: bool) -> None:
        self.sp_offset = sp_offset
        self.bp_offset = bp_offset
        self.sp_reg = sp_reg
        self.bp_reg = bp_reg
        self.type = type
        self.signal = signal

    def _fields(self) -> tuple[int, int, int, int, int, bool]:
        return self.sp_offset, self.bp_offset, self.sp_reg, self.bp_reg, self.type, self.signal

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return ("OrcEntry(sp_offset={!r}, bp_offset={!r}, sp_reg={!r}, bp_reg={!r}, type={!r}, signal={!r})"
                .format(*self._fields()))

    def __str__(self) -> str:
        """objtool ``--dump=orc`` style: ``type:call sp:sp+8 bp:undef signal:0``."""
        return (f"type:{TYPE_NAMES.get(self.type, '?')} sp:{_reg_text(self.sp_reg, self.sp_offset)} "
                f"bp:{_reg_text(self.bp_reg, self.bp_offset)} signal:{int(self.signal)}")


def _reg_text(reg: int, offset: int) -> str:
    """objtool's ``orc_print_reg()``: ``(und)``, ``sp+8``, ``prevsp-16``, ``(bp-16)``, ``(sp)+8``."""
    if reg == ORC_REG_BP_INDIRECT:
        return f"(bp{offset:+d})"
    if reg == ORC_REG_SP_INDIRECT:
        return f"(sp){offset:+d}"
    if reg == ORC_REG_UNDEFINED:
        return "(und)"
    return f"{REG_NAMES.get(reg, '?')}{offset:+d}"


#: ``null_orc_entry``: unwinds a call through a NULL function pointer
NULL_ORC_ENTRY = OrcEntry(sp_offset=8, bp_offset=0, sp_reg=ORC_REG_SP, bp_reg=ORC_REG_UNDEFINED,
                          type=ORC_TYPE_CALL, signal=False)
#: ``orc_fp_entry``: the frame-pointer guess for code without ORC data
ORC_FP_ENTRY = OrcEntry(sp_offset=16, bp_offset=-16, sp_reg=ORC_REG_BP, bp_reg=ORC_REG_PREV_SP,
                        type=ORC_TYPE_CALL, signal=False)


# --- format generation ------------------------------------------------------------------------

def parse_version(text: str | int) -> int:
    """``--orc-version`` value (``3``, ``v3``) as a generation number."""
    m = re.fullmatch(r"v?([1-4])", str(text).strip().lower())
    if not m:
        raise OrcFormatError(f"--orc-version {text!r}: expected 1, 2, 3 or 4")
    return int(m.group(1))


def version_for_release(release: str) -> int | None:
    """The generation a kernel release used (drgn's fallback without ``.orc_header``)."""
    m = re.match(r"(\d+)\.(\d+)", release)
    if not m:
        return None
    ver = (int(m.group(1)), int(m.group(2)))
    if ver >= (7, 1):
        return 4
    if ver >= (6, 4):
        return 3
    return 2 if ver == (6, 3) else 1


def choose_version(header: bytes | None, release: str | None, forced: str | int | None) -> tuple[int, str]:
    """``(generation, how it was chosen)``: forced, else ``.orc_header`` hash, else the release.

    A forced generation that a known ``.orc_header`` hash contradicts is refused: the tables
    would decode as another format's bit fields. Forcing is for images without a header or
    with a hash this code does not know.
    """
    if forced is not None:
        v = parse_version(forced)
        known = ORC_HASHES.get(bytes(header)) if header is not None else None
        if known is not None and known != v:
            raise OrcFormatError(f"--orc-version {v} disagrees with the image: its .orc_header hash "
                                 f"{bytes(header).hex()[:16]}... is ORC v{known}")
        return v, f"forced v{v}"
    if header is not None:
        known = ORC_HASHES.get(bytes(header))
        if known is None:
            raise OrcFormatError(f"unknown ORC format: .orc_header hash {bytes(header).hex()} is not a known "
                                 "generation (force one with --orc-version 1..4)")
        return known, f".orc_header {bytes(header).hex()[:16]}... (v{known})"
    by_release = version_for_release(release) if release else None
    if by_release is None:
        raise OrcFormatError("no .orc_header and no kernel release to choose the ORC format "
                             "(force one with --orc-version 1..4)")
    return by_release, f"release {release} (v{by_release})"


# --- raw tables <-> columns -------------------------------------------------------------------

#: ``struct orc_entry`` as numpy reads it (the flag bits are split per generation by :func:`_field`)
_RAW = [("sp_offset", "<i2"), ("bp_offset", "<i2"), ("flags", "<u2")]


def _field(flags: np.ndarray, version: int, name: str) -> np.ndarray:
    import numpy as np

    shift, mask = flag_bits(version, name)
    return ((flags >> np.uint16(shift)) & np.uint16(mask)).astype(np.uint8)


def decode_entries(raw: bytes, version: int) -> dict[str, np.ndarray]:
    """Columns of a raw ``.orc_unwind``, normalised (see the module docstring)."""
    if len(raw) % ORC_ENTRY_SIZE:
        raise OrcFormatError(f".orc_unwind is {len(raw)} bytes, not a multiple of {ORC_ENTRY_SIZE}")
    import numpy as np

    rec = np.frombuffer(raw, dtype=np.dtype(_RAW))
    flags = rec["flags"]
    sp_reg, bp_reg = _field(flags, version, "sp_reg"), _field(flags, version, "bp_reg")
    typ = _field(flags, version, "type")
    if version <= 2:
        end = _field(flags, version, "end").astype(bool)
        undef = sp_reg == ORC_REG_UNDEFINED
        if version == 2:
            signal = _field(flags, version, "signal").astype(bool)
        else:  # v1: REGS and REGS_PARTIAL imply a signal frame
            signal = ~undef & ((typ == 1) | (typ == 2))
        typ = np.where(undef, np.where(end, ORC_TYPE_END_OF_STACK, ORC_TYPE_UNDEFINED), typ + 2).astype(np.uint8)
    else:
        signal = _field(flags, version, "signal").astype(bool)
    if version <= 3:
        old_to_v4 = np.array(_OLD_TO_V4, dtype=np.uint8)
        sp_reg, bp_reg = old_to_v4[sp_reg], old_to_v4[bp_reg]
    return {"sp_offset": rec["sp_offset"].copy(), "bp_offset": rec["bp_offset"].copy(),
            "sp_reg": sp_reg, "bp_reg": bp_reg, "type": typ, "signal": signal}


def encode_entries(entries: Sequence[OrcEntry], version: int) -> bytes:
    """A raw ``.orc_unwind`` of generation ``version``; ``ValueError`` for what it cannot express."""
    layout = orc_entry(version)
    out = bytearray()
    for e in entries:
        sp_reg, bp_reg = (_V4_TO_OLD[e.sp_reg], _V4_TO_OLD[e.bp_reg]) if version <= 3 \
            else (e.sp_reg, e.bp_reg)
        flags: dict[str, int | bool] = {"sp_reg": sp_reg, "bp_reg": bp_reg}
        if version <= 2:
            if e.type in (ORC_TYPE_UNDEFINED, ORC_TYPE_END_OF_STACK):
                if e.sp_reg != ORC_REG_UNDEFINED:
                    raise ValueError(f"v{version} marks {TYPE_NAMES[e.type]} only by sp_reg undefined: {e}")
                flags.update(type=0, end=e.type == ORC_TYPE_END_OF_STACK)
            else:
                if e.sp_reg == ORC_REG_UNDEFINED:
                    raise ValueError(f"v{version} cannot have sp_reg undefined on a {TYPE_NAMES[e.type]} entry")
                flags.update(type=e.type - 2, end=False)
            if version == 2:
                flags["signal"] = e.signal
            elif e.signal != (e.type in (ORC_TYPE_REGS, ORC_TYPE_REGS_PARTIAL)):
                raise ValueError(f"v1 has no signal bit: signal must follow the type: {e}")
            if version == 1:
                flags["unused"] = 0
        else:
            flags.update(type=e.type, signal=e.signal)
        out += layout.build({"sp_offset": e.sp_offset, "bp_offset": e.bp_offset, "flags": flags})
    return bytes(out)


def decode_ips(sh_addr: int, raw: bytes) -> np.ndarray:
    """Absolute ips of a raw ``.orc_unwind_ip`` at ``sh_addr``: ``sh_addr + 4*i + s32[i]``."""
    if len(raw) % 4:
        raise OrcFormatError(f".orc_unwind_ip is {len(raw)} bytes, not a multiple of 4")
    import numpy as np

    rel = np.frombuffer(raw, dtype="<i4").astype(np.int64) + 4 * np.arange(len(raw) // 4, dtype=np.int64)
    return np.uint64(sh_addr) + rel.astype(np.uint64)


def encode_ips(ips: Iterable[int], sh_addr: int) -> bytes:
    """A raw ``.orc_unwind_ip`` at ``sh_addr`` holding ``ips``."""
    import numpy as np

    ips = [int(i) for i in ips]
    rel = np.array([ip - (sh_addr + 4 * i) for i, ip in enumerate(ips)], dtype=np.int64)
    if len(rel) and (rel.min() < -2**31 or rel.max() >= 2**31):
        raise ValueError("an ip is out of s32 reach of .orc_unwind_ip")
    return rel.astype("<i4").tobytes()


# --- the table --------------------------------------------------------------------------------

class OrcTable:
    """A sorted, normalised ORC table with the kernel's lookup (``orc_find``) and a batch form.

    ``stext``/``etext`` are ``_stext``/``_etext`` (the ``.orc_lookup`` range);
    ``inittext`` is ``(_sinittext, _einittext)`` when known.

    The scalar lookup reads flat ``array`` columns (the ips, ``.orc_lookup``, and
    each row's index into the few hundred distinct entries), which is also what
    the cache file holds (:meth:`to_arrays`), so a cached table is ready without
    numpy. The numpy columns (:attr:`ips`, :attr:`type`, ...) and the batch
    form's bitmaps are made on first use.
    """

    def __init__(self, ips: np.ndarray, columns: dict[str, np.ndarray], *, stext: int, etext: int,
                 inittext: tuple[int, int] | None = None, version: int = 3, how: str = "") -> None:
        import numpy as np

        ips = np.asarray(ips, dtype=np.uint64)
        n = len(ips)
        if any(len(c) != n for c in columns.values()):
            raise OrcFormatError(f"{n} ORC ips but {min(len(c) for c in columns.values())} entries")
        if not stext < etext:
            raise OrcFormatError(f"bad text range {stext:#x}..{etext:#x}")
        if not n:
            raise OrcFormatError("empty ORC table")
        # vmlinux tables are sorted at build time (scripts/sorttable), module tables at load
        # (unwind_module_init): by ip, section terminators (UNDEFINED) first among equal ips.
        if n > 1 and not (np.all(ips[1:] >= ips[:-1]) and _terminators_first(ips, columns["type"])):
            order = np.lexsort((columns["type"] != ORC_TYPE_UNDEFINED, ips))
            ips = ips[order]
            columns = {k: v[order] for k, v in columns.items()}
        shared, rows, fields = _share_entries(columns)
        lookup = _build_lookup(ips, int(stext), int(etext))
        self._set(array("Q", ips.tobytes()), _index_array(rows, len(shared)), shared,
                  array("I", lookup.astype(np.uint32).tobytes()), int(stext), int(etext), inittext, version, how,
                  fields)

    def _set(self, ips: array, rows: array, shared: list[OrcEntry], lookup: array, stext: int, etext: int,
             inittext: tuple[int, int] | None, version: int, how: str,
             fields: "dict[str, array | np.ndarray] | None" = None) -> None:
        self._ip_array = ips
        #: per table row, its entry's index into ``_shared`` (a table has a few hundred distinct entries)
        self._row_entry = rows
        self._shared = shared
        #: each field of ``_shared`` as a column, where the table was made from columns (``None``: read from
        #: ``_shared`` when :attr:`entry_columns` is first asked for)
        self._entry_fields = fields
        #: the kernel's ``.orc_lookup``
        self._lookup_array = lookup
        self.version = version
        self.how = how
        self.stext, self.etext = stext, etext
        self._size = etext - stext
        self.inittext = inittext
        self._ranked = False
        #: text ips :meth:`orc_find_batch` answered by bisection so far
        self._bisected = 0

    # --- the cache file (unwind.formats.cachefile) ---

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, array]]:
        """``(meta, arrays)`` of the table, for a cache file (:meth:`from_arrays` reads them back)."""
        meta = {"stext": self.stext, "etext": self.etext, "inittext": self.inittext, "version": self.version,
                "how": self.how}
        arrays = {"ips": self._ip_array, "rows": self._row_entry, "lookup": self._lookup_array}
        for name, code in _ENTRY_FIELDS:
            arrays[f"entry_{name}"] = array(code, [int(getattr(e, name)) for e in self._shared])
        return meta, arrays

    @classmethod
    def from_arrays(cls, meta: dict[str, Any], arrays: dict[str, array]) -> "OrcTable":
        """A table saved by :meth:`to_arrays`; :class:`CacheFileError` when the parts do not fit."""
        try:
            stext, etext, version, how = int(meta["stext"]), int(meta["etext"]), int(meta["version"]), str(meta["how"])
            inittext = tuple(int(v) for v in meta["inittext"]) if meta["inittext"] is not None else None
            ips, rows, lookup = arrays["ips"], arrays["rows"], arrays["lookup"]
            fields = {name: arrays[f"entry_{name}"] for name, _ in _ENTRY_FIELDS}
        except (KeyError, TypeError, ValueError) as e:
            raise CacheFileError(f"cached ORC table: missing or bad {e}") from None
        nblocks = (etext - stext + LOOKUP_BLOCK_SIZE - 1) // LOOKUP_BLOCK_SIZE + 1
        if (not ips or len(rows) != len(ips) or len(lookup) != nblocks or not stext < etext
                or (inittext is not None and len(inittext) != 2)
                or len({len(col) for col in fields.values()}) != 1):
            raise CacheFileError("cached ORC table: inconsistent columns")
        shared = _entries_of(fields)
        self = cls.__new__(cls)
        self._set(ips, rows, shared, lookup, stext, etext, inittext, version, how, fields)  # type: ignore[arg-type]
        return self

    def with_entries(self, changes: dict[int, OrcEntry]) -> "OrcTable":
        """A copy whose rows ``changes`` names hold other entries (the fuzzer's corrupted tables)."""
        new = OrcTable.__new__(OrcTable)
        rows = array("I", self._row_entry)
        shared = list(self._shared)
        for index, entry in changes.items():
            rows[index] = len(shared)
            shared.append(entry)
        new._set(self._ip_array, rows, shared, self._lookup_array, self.stext, self.etext, self.inittext,
                 self.version, self.how)
        return new

    # --- numpy views, made on first use (the batch form, benches, tests) ---

    @cached_property
    def ips(self) -> np.ndarray:
        """Each row's ip (``uint64``), ascending."""
        import numpy as np

        return np.frombuffer(self._ip_array, dtype=np.uint64)

    @cached_property
    def lookup(self) -> np.ndarray:
        """The kernel's ``.orc_lookup``: one entry index per 256-byte text block, plus the end (``uint32``)."""
        import numpy as np

        return np.frombuffer(self._lookup_array, dtype=np.uint32)

    @cached_property
    def entry_rows(self) -> np.ndarray:
        """Each row's index into the table's distinct entries (a view of the flat array)."""
        import numpy as np

        return np.frombuffer(self._row_entry, dtype=_NUMPY_INDEX[self._row_entry.typecode])

    @cached_property
    def entry_columns(self) -> dict[str, np.ndarray]:
        """Each field (``sp_offset``, ``bp_offset``, ``sp_reg``, ``bp_reg``, ``type``, ``signal``) of each
        distinct entry, as :attr:`entry_rows` indexes them: a few hundred values, not one per row."""
        import numpy as np

        fields = self._entry_fields
        if fields is not None:  # the columns the table was made from (a cached table's arrays: not copied)
            return {name: np.asarray(fields[name]).astype(dtype, copy=False) for name, dtype in _COLUMN_TYPES.items()}
        return {name: np.array([getattr(e, name) for e in self._shared], dtype=dtype)
                for name, dtype in _COLUMN_TYPES.items()}

    def _column(self, name: str) -> np.ndarray:
        return self.entry_columns[name][self.entry_rows]

    @cached_property
    def sp_offset(self) -> np.ndarray:
        """Each row's ``sp_offset``."""
        return self._column("sp_offset")

    @cached_property
    def bp_offset(self) -> np.ndarray:
        """Each row's ``bp_offset``."""
        return self._column("bp_offset")

    @cached_property
    def sp_reg(self) -> np.ndarray:
        """Each row's ``sp_reg`` (v4 numbering)."""
        return self._column("sp_reg")

    @cached_property
    def bp_reg(self) -> np.ndarray:
        """Each row's ``bp_reg`` (v4 numbering)."""
        return self._column("bp_reg")

    @cached_property
    def type(self) -> np.ndarray:
        """Each row's type (v3 numbering)."""
        return self._column("type")

    @cached_property
    def signal(self) -> np.ndarray:
        """Each row's signal bit."""
        return self._column("signal")

    def _orc_find_index_all(self, ips: np.ndarray) -> np.ndarray:
        """``__orc_find`` over the whole table for each ip: rightmost ``<= ip``, else the first entry."""
        return _orc_find_index_all(self.ips, ips)

    def _build_rank(self) -> None:
        """The batch refinement of ``.orc_lookup``: 32-byte sub-blocks, each an occupancy bitmap.

        ``base[w]`` counts the distinct ips below sub-block ``w`` (minus one),
        derived from the block's ``orc_lookup`` entry plus the bits of the
        block's earlier sub-blocks; an ip's entry is then
        ``base[w] + popcount(bits of w up to the ip)``, mapped back to the
        rightmost duplicate.
        """
        import numpy as np

        ips = self.ips
        last_of_run = np.ones(len(ips), dtype=bool)
        last_of_run[:-1] = ips[1:] != ips[:-1]
        self._distinct_to_index = np.nonzero(last_of_run)[0].astype(np.int32)
        # runs of equal ips: (distinct position, entries dropped); a few are cheaper as compares than a gather
        ends = self._distinct_to_index
        extra = np.diff(ends, prepend=-1) - 1
        self._dup_runs = [(int(p), int(e)) for p, e in zip(np.nonzero(extra)[0].tolist(), extra[extra > 0].tolist())]
        distinct = ips[last_of_run]
        size = self.etext - self.stext
        nsub = (size + (1 << _SUB_ORDER) - 1) >> _SUB_ORDER
        inside = distinct[(distinct >= np.uint64(self.stext)) & (distinct < np.uint64(self.etext))]
        off = (inside - np.uint64(self.stext)).astype(np.uint32)
        bits = np.zeros(nsub, dtype=np.uint32)
        np.bitwise_or.at(bits, (off >> np.uint32(_SUB_ORDER)).astype(np.intp),
                         np.left_shift(np.uint32(1), off & np.uint32((1 << _SUB_ORDER) - 1)))
        # distinct rank of each block's orc_lookup entry, minus one when that entry is not below the block
        per_block = 1 << (LOOKUP_BLOCK_ORDER - _SUB_ORDER)
        blocks = np.arange(nsub, dtype=np.int64) >> (LOOKUP_BLOCK_ORDER - _SUB_ORDER)
        entry = self.lookup[:-1].astype(np.int64)
        dist_rank = np.cumsum(last_of_run)[entry] - 1
        block_start = np.uint64(self.stext) + np.arange(len(entry), dtype=np.uint64) * np.uint64(LOOKUP_BLOCK_SIZE)
        below = dist_rank - (ips[entry] >= block_start)
        pop = np.bitwise_count(bits).astype(np.int64)
        padded = np.zeros(len(entry) * per_block, dtype=np.int64)
        padded[:nsub] = pop
        within = np.cumsum(padded.reshape(-1, per_block), axis=1) - padded.reshape(-1, per_block)
        self._sub_base = (below[blocks] + within.ravel()[:nsub]).astype(np.int32)
        self._sub_bits = bits
        self._clamp = bool(ips[0] > np.uint64(self.stext))
        self._ranked = True

    # --- constructors ---

    @classmethod
    def from_entries(cls, rows: Iterable[tuple[int, OrcEntry]], *, stext: int, etext: int,
                     inittext: tuple[int, int] | None = None, version: int = 4) -> "OrcTable":
        """A table from ``(ip, entry)`` rows in any order (sorted as ``unwind_module_init`` sorts)."""
        import numpy as np

        rows = list(rows)
        ips = np.array([ip for ip, _ in rows], dtype=np.uint64)
        cols = {name: np.array([getattr(e, name) for _, e in rows], dtype=dt)
                for name, dt in (("sp_offset", np.int16), ("bp_offset", np.int16), ("sp_reg", np.uint8),
                                 ("bp_reg", np.uint8), ("type", np.uint8), ("signal", bool))}
        return cls(ips, cols, stext=stext, etext=etext, inittext=inittext, version=version, how="built")

    @classmethod
    def from_sections(cls, ip_addr: int, ip_raw: bytes, orc_raw: bytes, version: int, *, stext: int,
                      etext: int, inittext: tuple[int, int] | None = None, how: str = "") -> "OrcTable":
        """A table from the raw ``.orc_unwind_ip`` (at ``ip_addr``) and ``.orc_unwind`` bytes."""
        ips = decode_ips(ip_addr, ip_raw)
        cols = decode_entries(orc_raw, version)
        if len(ips) != len(cols["type"]):
            raise OrcFormatError(f".orc_unwind_ip has {len(ips)} entries, .orc_unwind {len(cols['type'])}")
        return cls(ips, cols, stext=stext, etext=etext, inittext=inittext, version=version, how=how)

    # --- lookup ---

    def __len__(self) -> int:
        return len(self._ip_array)

    def entry(self, index: int) -> OrcEntry:
        """The normalised entry at table ``index``."""
        return self._shared[self._row_entry[index]]

    def ip(self, index: int) -> int:
        """The ip of table ``index``."""
        return self._ip_array[index]

    # orc_find() (unwind_orc.c:198-242) with __orc_find() (83-110)
    def orc_find(self, ip: int) -> OrcEntry | None:
        """The kernel's entry for ``ip``, or ``None`` where ``orc_find()`` returns NULL."""
        off = ip - self.stext
        if 0 < off < self._size:  # the per-frame case, inline: the .orc_lookup block, then __orc_find
            lookup = self._lookup_array
            blk = off >> LOOKUP_BLOCK_ORDER
            lo = lookup[blk]
            i = bisect.bisect_right(self._ip_array, ip, lo, lookup[blk + 1] + 1) - 1
            return self._shared[self._row_entry[i if i >= lo else lo]]
        i = self.find_index(ip)
        if i >= 0:
            return self.entry(i)
        return NULL_ORC_ENTRY if i == NULL_ENTRY else None

    def find_index(self, ip: int) -> int:
        """:meth:`orc_find` as a table index, :data:`NULL_ENTRY` for ip 0, :data:`NOT_FOUND`."""
        if ip == 0:
            return NULL_ENTRY
        off = ip - self.stext
        if 0 <= off and ip < self.etext:
            blk = off >> LOOKUP_BLOCK_ORDER
            lo = self._lookup_array[blk]
            i = bisect.bisect_right(self._ip_array, ip, lo, self._lookup_array[blk + 1] + 1) - 1
            return i if i >= lo else lo
        if self.inittext is not None and self.inittext[0] <= ip < self.inittext[1]:
            i = bisect.bisect_right(self._ip_array, ip) - 1
            return i if i >= 0 else 0
        return NOT_FOUND

    def orc_find_batch(self, ips: np.ndarray | Sequence[int]) -> np.ndarray:
        """:meth:`find_index` for an array of ips at once (``int64``; negative: see :data:`NOT_FOUND`).

        At most :data:`SCALAR_IPS` ips are found one by one. More text ips are found by ``__orc_find()``'s
        bisection of their ``.orc_lookup`` block (:meth:`_bisect`), in lockstep, until the table has answered
        as many ips as it has entries; then it builds its rank (:meth:`_rank`, a popcount per ip), whose
        build costs about as much as bisecting that many.
        """
        import numpy as np

        q = np.asarray(ips, dtype=np.uint64)
        if len(q) <= SCALAR_IPS:  # a few ips (a batch's new ones of a step): __orc_find() of each
            return np.array([self.find_index(ip) for ip in q.tolist()], np.int64)
        if not self._ranked:
            self._bisected += len(q)
            if self._bisected >= len(self):
                self._build_rank()
        find = self._rank if self._ranked else self._bisect
        off = q - np.uint64(self.stext)
        text = off < np.uint64(self._size)
        if text.all():
            return find(off).astype(np.int64)
        out = np.full(q.shape, NOT_FOUND, dtype=np.int64)
        out[text] = find(off[text])
        out[q == 0] = NULL_ENTRY
        if self.inittext is not None:
            init = (q >= np.uint64(self.inittext[0])) & (q < np.uint64(self.inittext[1]))
            out[init] = self._orc_find_index_all(q[init])
        return out

    # orc_find() (unwind_orc.c:198-242): the .orc_lookup block, then __orc_find() (83-110), over ips
    def _bisect(self, off: np.ndarray) -> np.ndarray:
        """Table indices of text offsets: the last entry at or below each ip among its block's entries,
        else the block's first (``bisect_right`` over ``[lookup[blk], lookup[blk + 1] + 1)``, in lockstep)."""
        import numpy as np

        ips, lookup = self.ips, self.lookup
        blk = (off >> np.uint64(LOOKUP_BLOCK_ORDER)).astype(np.intp)
        first = lookup[blk].astype(np.intp)
        lo, hi = first, lookup[blk + 1].astype(np.intp) + 1
        ip = off + np.uint64(self.stext)
        last = len(ips) - 1
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) >> 1
            right = ips[np.minimum(mid, last)] <= ip
            lo = np.where(open_ & right, mid + 1, lo)
            hi = np.where(open_ & ~right, mid, hi)
        return np.maximum(lo - 1, first)

    def _rank(self, off: np.ndarray) -> np.ndarray:
        """Table indices of text offsets: sub-block base plus the popcount of its bits up to each ip."""
        import numpy as np

        off32 = off.astype(np.uint32)
        sub = (off32 >> np.uint32(_SUB_ORDER)).astype(np.intp)
        mask = np.left_shift(np.uint32(2), off32 & np.uint32((1 << _SUB_ORDER) - 1))
        mask -= np.uint32(1)
        mask &= self._sub_bits[sub]
        idx = self._sub_base[sub]
        idx += np.bitwise_count(mask)
        if self._clamp:
            np.maximum(idx, 0, out=idx)
        if len(self._dup_runs) > 4:
            return self._distinct_to_index[idx]
        distinct = idx.copy() if len(self._dup_runs) > 1 else idx
        for pos, dropped in self._dup_runs:  # the rightmost duplicate: skip the entries dropped up to here
            idx += (distinct >= pos) if dropped == 1 else (distinct >= pos).astype(np.int32) * dropped
        return idx


#: :class:`OrcEntry` fields and their ``array`` typecodes in a cache file
_ENTRY_FIELDS = (("sp_offset", "h"), ("bp_offset", "h"), ("sp_reg", "B"), ("bp_reg", "B"), ("type", "B"),
                 ("signal", "B"))
_NUMPY_INDEX = {"B": "uint8", "H": "uint16", "I": "uint32"}
#: the numpy type of each :class:`OrcEntry` field's column
_COLUMN_TYPES = {"sp_offset": "int16", "bp_offset": "int16", "sp_reg": "uint8", "bp_reg": "uint8", "type": "uint8",
                 "signal": "bool"}


def _terminators_first(ips: np.ndarray, typ: np.ndarray) -> bool:
    import numpy as np

    same = np.nonzero(ips[1:] == ips[:-1])[0]
    return not np.any((typ[same + 1] == ORC_TYPE_UNDEFINED) & (typ[same] != ORC_TYPE_UNDEFINED))


def _share_entries(columns: dict[str, np.ndarray]) -> tuple[list[OrcEntry], np.ndarray, dict[str, np.ndarray]]:
    """The distinct :class:`OrcEntry` values of the rows, each row's index among them, and each field of the
    distinct values as a column."""
    import numpy as np

    sp_offset, bp_offset = columns["sp_offset"].astype(np.int16), columns["bp_offset"].astype(np.int16)
    sp_reg, bp_reg = columns["sp_reg"].astype(np.uint8), columns["bp_reg"].astype(np.uint8)
    typ, signal = columns["type"].astype(np.uint8), columns["signal"].astype(bool)
    key = (sp_offset.astype(np.uint16).astype(np.uint64)
           | bp_offset.astype(np.uint16).astype(np.uint64) << np.uint64(16)
           | sp_reg.astype(np.uint64) << np.uint64(32) | bp_reg.astype(np.uint64) << np.uint64(40)
           | typ.astype(np.uint64) << np.uint64(48) | signal.astype(np.uint64) << np.uint64(56))
    _uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    typed = {"sp_offset": sp_offset, "bp_offset": bp_offset, "sp_reg": sp_reg, "bp_reg": bp_reg, "type": typ,
             "signal": signal}
    fields = {name: column.take(first) for name, column in typed.items()}
    return _entries_of({name: column.tolist() for name, column in fields.items()}), inverse.ravel(), fields


def _entries_of(fields: "dict[str, Sequence[int]]") -> list[OrcEntry]:
    """The :class:`OrcEntry` of each row of ``fields`` (a column per :data:`_ENTRY_FIELDS` name)."""
    return [OrcEntry(sp, bp, spr, bpr, typ, bool(sig)) for sp, bp, spr, bpr, typ, sig
            in zip(*(fields[name] for name, _ in _ENTRY_FIELDS))]


def _index_array(rows: np.ndarray, distinct: int) -> array:
    """``rows`` (indices below ``distinct``) as the smallest unsigned ``array`` that holds them."""
    code = "B" if distinct <= 1 << 8 else "H" if distinct <= 1 << 16 else "I"
    return array(code, rows.astype(_NUMPY_INDEX[code]).tobytes())


# unwind_init() (unwind_orc.c:338-359): orc_lookup[i] = __orc_find(_stext + 256 * i), then _etext's
def _build_lookup(ips: np.ndarray, stext: int, etext: int) -> np.ndarray:
    """The kernel's ``.orc_lookup``: one entry index per 256-byte text block, plus the end."""
    import numpy as np

    nblocks = (etext - stext + LOOKUP_BLOCK_SIZE - 1) // LOOKUP_BLOCK_SIZE + 1
    starts = np.uint64(stext) + np.arange(nblocks, dtype=np.uint64) * np.uint64(LOOKUP_BLOCK_SIZE)
    starts[-1] = np.uint64(etext)
    return _orc_find_index_all(ips, starts).astype(np.uint32)


def _orc_find_index_all(table_ips: np.ndarray, ips: np.ndarray) -> np.ndarray:
    """``__orc_find`` over the whole table for each ip: rightmost ``<= ip``, else the first entry."""
    import numpy as np

    return np.maximum(np.searchsorted(table_ips, ips, side="right").astype(np.int64) - 1, 0)


# --- from an image, cached ----------------------------------------------------------------------

_CACHE: dict[tuple, OrcTable] = {}
#: the layout of ``$UNWIND_CACHE/orc`` files (:meth:`OrcTable.to_arrays`)
_ORC_CACHE_VERSION = 1
#: per Image object: (release, forced) -> table, so a replay of many tasks skips even the key work
_BY_IMAGE: "weakref.WeakKeyDictionary[Image, dict[tuple, OrcTable]]" = weakref.WeakKeyDictionary()


def orc_table(target: "Target") -> "OrcTable":
    """The ORC table of ``target.image``, decoded once per image (see :func:`load_orc`)."""
    image = target.image
    if image is None:
        raise ImageError("x86-64 replay needs the kernel image's ORC tables: give --vmlinux "
                         "(full, stripped or slim image of the dump's build-id)")
    return load_orc(image, target.release, target.options.orc_version, target.symbol_address)


def load_orc(image: Image, release: str | None = None, forced: str | int | None = None,
             symbol: Callable[[str], int | None] | None = None) -> OrcTable:
    """The ORC table of ``image`` (full, stripped or slim), decoded once per image and format.

    ``symbol`` resolves ``_stext``/``_etext``/``_sinittext``/``_einittext``
    (default: the image's own symbols); without them the ``.text`` section
    bounds stand in for ``_stext``/``_etext``.
    """
    mine = _BY_IMAGE.setdefault(image, {})
    hit = mine.get((release, forced))
    if hit is not None:
        return hit
    header = image.section(".orc_header")
    version, how = choose_version(header[1] if header else None, release, forced)
    resolve = symbol or _image_symbol(image)
    stext, etext = resolve("_stext"), resolve("_etext")
    if stext is None or etext is None:
        text = image.elf.get_section_by_name(".text")
        if text is None:
            raise OrcFormatError(f"{image.path}: no _stext/_etext symbols and no .text section")
        stext, etext = text["sh_addr"], text["sh_addr"] + text["sh_size"]
    init = (resolve("_sinittext"), resolve("_einittext"))
    inittext = (init[0], init[1]) if init[0] is not None and init[1] is not None else None
    key = (str(Path(image.path).resolve()), image.build_id, version, stext, etext, inittext)
    table = _CACHE.get(key)
    if table is None:
        table = _CACHE[key] = _cached_table(image, version, how, stext, etext, inittext)
    mine[(release, forced)] = table
    return table


def _cached_table(image: Image, version: int, how: str, stext: int, etext: int,
                  inittext: tuple[int, int] | None) -> OrcTable:
    """The decoded table from ``$UNWIND_CACHE/orc`` when this build was seen before, else decoded and kept
    there (per build-id, generation and text range: a KASLR-relocated image has a table of its own)."""
    folder = cache_dir("orc") if image.build_id else None
    path = None
    if folder is not None:
        digest = hashlib.sha1(repr((version, how, stext, etext, inittext)).encode()).hexdigest()[:16]
        path = folder / f"{image.build_id}-{digest}-v{_ORC_CACHE_VERSION}.arrays"
        if path.exists():
            try:
                return OrcTable.from_arrays(*read_arrays(path))
            except (OSError, CacheFileError):
                pass  # a damaged cache entry is rebuilt below
    ip_sec, orc_sec = image.section(".orc_unwind_ip"), image.section(".orc_unwind")
    if ip_sec is None or orc_sec is None:
        raise OrcFormatError(f"{image.path} has no .orc_unwind_ip/.orc_unwind sections "
                             "(not an x86-64 kernel built with CONFIG_UNWINDER_ORC?)")
    table = OrcTable.from_sections(ip_sec[0], ip_sec[1], orc_sec[1], version, stext=stext, etext=etext,
                                   inittext=inittext, how=how)
    if path is not None:
        write_atomically(path, lambda f: write_arrays(f, *table.to_arrays()))
    return table


def _image_symbol(image: Image) -> Callable[[str], int | None]:
    def resolve(name: str) -> int | None:
        try:
            return image.symbols.address(name)
        except ImageError:
            return None
    return resolve

