"""BTF reader on small blobs built here with the same construct records (answers known by construction)."""

import random

import pytest
from construct import Array

from unwind.kernel.btf import BTF_MAGIC, EXTRA_EACH, EXTRA_ONCE, Btf, BtfError, Header, TypeHeader

STRINGS = (b"\0int\0long\0inner\0a\0b\0outer\0x\0in\0u1\0u2\0arr\0outer_t\0bits\0p\0"
           b"colour\0RED\0BLUE\0NEG\0big\0HUGE\0")


def s(name: str) -> int:
    return STRINGS.index(b"\0" + name.encode() + b"\0") + 1


def t(name_off: int, kind: int, vlen: int, size_or_type: int, extra=None, kflag: int = 0) -> bytes:
    """One BTF record: struct btf_type and what follows it."""
    out = TypeHeader.build(dict(name_off=name_off, info=(kflag << 31) | (kind << 24) | vlen,
                                size_or_type=size_or_type))
    if kind in EXTRA_ONCE:
        out += EXTRA_ONCE[kind].build(extra)
    elif kind in EXTRA_EACH:
        out += Array(vlen, EXTRA_EACH[kind]).build(extra)
    return out


def blob_of(types: bytes, strings: bytes = STRINGS) -> bytes:
    hdr = Header.build(dict(magic=BTF_MAGIC, version=1, flags=0, hdr_len=24, type_off=0,
                            type_len=len(types), str_off=len(types), str_len=len(strings)))
    return hdr + types + strings


def _blob() -> bytes:
    return blob_of(b"".join([
        t(s("int"), 1, 0, 4, 0x01000020),                                   # 1 int
        t(s("long"), 1, 0, 8, 0x01000040),                                  # 2 long
        t(s("inner"), 4, 2, 8, [dict(name_off=s("a"), type=1, offset=0),    # 3 struct inner
                                dict(name_off=s("b"), type=1, offset=32)]),
        t(0, 5, 2, 8, [dict(name_off=s("u1"), type=1, offset=0),            # 4 anon union
                       dict(name_off=s("u2"), type=2, offset=0)]),
        t(0, 3, 0, 0, dict(type=1, index_type=1, nelems=4)),                # 5 int[4]
        t(s("outer"), 4, 6, 56, [dict(name_off=s("x"), type=1, offset=0),   # 6 struct outer
                                 dict(name_off=s("in"), type=3, offset=32),
                                 dict(name_off=0, type=4, offset=128),
                                 dict(name_off=s("arr"), type=5, offset=192),
                                 dict(name_off=s("bits"), type=1, offset=(3 << 24) | 320),
                                 dict(name_off=s("p"), type=9, offset=384)],
          kflag=1),
        t(s("outer_t"), 8, 0, 6),                                           # 7 typedef
        t(0, 10, 0, 7),                                                     # 8 const outer_t
        t(0, 2, 0, 8),                                                      # 9 const outer_t *
        t(s("colour"), 6, 3, 4, [dict(name_off=s("RED"), val=0),            # 10 signed enum
                                 dict(name_off=s("BLUE"), val=7),
                                 dict(name_off=s("NEG"), val=0xFFFFFFFF)], kflag=1),
        t(s("big"), 19, 1, 8, [dict(name_off=s("HUGE"), lo=1, hi=2)]),      # 11 enum64
    ]))


def test_nested_anonymous_and_array_members() -> None:
    b = Btf(_blob())
    assert b.offsetof("outer", "x") == 0
    assert b.offsetof("outer", "in.b") == 8
    assert b.member("outer", "in.b").size == 4
    assert b.offsetof("outer", "u2") == 16          # inside the anonymous union
    assert b.member("outer", "u2").size == 8
    assert b.offsetof("outer", "arr[2]") == 24 + 8
    assert b.member("outer", "bits").bit_size == 3
    assert b.member("outer", "bits").bit_offset == 320
    assert b.sizeof("outer") == 56
    assert b.sizeof("outer_t") == 56                  # through the typedef
    assert b.offsetof("outer_t", "in.a") == 4
    assert b.offsetof(6, "in.a") == 4                 # by type id
    assert b.has("outer") and not b.has("nothing") and b.has("outer_t", "typedef")
    assert b.has_member("outer", "in.b") and not b.has_member("outer", "in.c")


def test_type_walking() -> None:
    b = Btf(_blob())
    p = b.member("outer", "p")
    assert b.kind(p.type_id) == "ptr" and p.size == 8
    assert b.pointee(p.type_id) == 6                   # const outer_t -> outer_t -> struct outer
    assert b.array(b.member("outer", "arr").type_id) == (1, 4)
    assert [n for n, _ in b.members("outer")] == ["x", "in", "", "arr", "bits", "p"]
    assert b.type_name(p.type_id) == "const outer_t *"
    assert b.type_name(5) == "int[4]"
    assert b.resolve(8) == 6 and b.kind(7) == "struct"
    with pytest.raises(BtfError, match="not a pointer"):
        b.pointee(6)


def test_enums() -> None:
    b = Btf(_blob())
    assert b.enum_value("BLUE") == 7
    assert b.enum_value("NEG") == -1                   # kind_flag: signed
    assert b.enum_value("HUGE") == 2 << 32 | 1
    assert b.enumerators("colour") == {"RED": 0, "BLUE": 7, "NEG": -1}
    with pytest.raises(BtfError, match="no enumerator"):
        b.enum_value("GREEN")


def test_errors_are_one_line() -> None:
    b = Btf(_blob())
    with pytest.raises(BtfError, match="has no member"):
        b.offsetof("outer", "nope")
    with pytest.raises(BtfError, match="no BTF type"):
        b.sizeof("missing")
    with pytest.raises(BtfError, match="not an array"):
        b.offsetof("outer", "x[1]")
    with pytest.raises(BtfError, match="past"):
        b.offsetof("outer", "arr[4]")
    with pytest.raises(BtfError, match="not a BTF blob"):
        Btf(b"\x00" * 30)
    with pytest.raises(BtfError, match="truncated"):
        Btf(_blob()[:-5])


def test_a_name_looked_up_again_answers_as_the_first_time() -> None:
    b = Btf(_blob())
    for _ in range(2):
        assert b.find("outer") == 6 and b.find("outer_t") == 7 and b.find("outer_t", "typedef") == 7
        assert b.find("colour") == 10
        with pytest.raises(BtfError, match="no BTF type 'missing'"):
            b.find("missing")
        with pytest.raises(BtfError, match="no BTF type 'outer' of kind int"):
            b.find("outer", "int")
        with pytest.raises(BtfError, match="no BTF kind"):
            b.find("outer", "nokind")


def test_loops_raise_not_hang() -> None:
    loop = blob_of(t(s("outer_t"), 8, 0, 2) + t(0, 10, 0, 1)           # typedef -> const -> typedef
                   + t(s("outer"), 4, 1, 8, [dict(name_off=0, type=3, offset=0)]))  # 3: anon self
    b = Btf(loop)
    with pytest.raises(BtfError, match="loop"):
        b.sizeof("outer_t")
    with pytest.raises(BtfError, match="loop"):
        b.offsetof("outer", "x")


def _queries(b: Btf) -> None:
    for name, path in (("outer", "in.b"), ("outer", "u2"), ("outer_t", "arr[3]"), ("outer", "p")):
        b.offsetof(name, path)
        b.sizeof(name)
    b.members("outer")
    b.pointee(b.member("outer", "p").type_id)
    b.enum_value("NEG")
    b.enumerators("big")
    for tid in range(len(b)):
        b.type_name(tid)


def test_mutated_blobs_raise_only_btf_error() -> None:
    """Flip bytes and cut the blob anywhere: every failure is a BtfError (never construct/struct/Index)."""
    good = _blob()
    rng = random.Random(11)
    for i in range(1500):
        blob = bytearray(good)
        if i % 5 == 0:
            blob = blob[:rng.randrange(len(blob))]
        else:
            for _ in range(rng.randrange(1, 6)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        try:
            _queries(Btf(bytes(blob)))
        except BtfError as e:
            assert "\n" not in str(e)


def test_elf_without_btf() -> None:
    import sys

    with pytest.raises(BtfError, match="no .BTF section"):
        Btf.from_elf(sys.executable if not sys.executable.endswith(".py") else "/bin/ls")
    with pytest.raises(BtfError, match="not a readable ELF"):
        Btf.from_elf(__file__)


def test_pointer_cycle_names_without_recursing() -> None:
    b = Btf(blob_of(t(0, 2, 0, 2) + t(0, 2, 0, 1)))
    assert b.type_name(1).startswith("?") and b.type_name(1).endswith("* *")


def test_types_end_is_where_each_prefix_of_the_records_ends() -> None:
    records = [t(s("int"), 1, 0, 4, 0x01000020),                                 # 16 bytes
               t(s("inner"), 4, 2, 8, [dict(name_off=s("a"), type=1, offset=0),  # 12 + 2 * 12
                                       dict(name_off=s("b"), type=1, offset=32)]),
               t(0, 2, 0, 1)]                                                    # 12
    b = Btf(blob_of(b"".join(records)))
    assert [b.types_end(n) for n in range(5)] == [0, 16, 52, 64, 64]
    with pytest.raises(BtfError, match="negative"):
        b.types_end(-1)


def test_the_cached_scan_answers_as_the_scan_and_a_damaged_entry_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path))
    blob = _blob()
    scanned = Btf(blob)
    first = Btf.cached(blob)  # scanned, then written
    [entry] = (tmp_path / "btf").iterdir()
    again = Btf.cached(blob)  # read back
    for b in (first, again):
        assert len(b) == len(scanned) == 12
        assert [b.find(n) for n in ("int", "inner", "outer", "outer_t", "colour", "big")] == [1, 3, 6, 7, 10, 11]
        assert b.find("outer_t", "typedef") == 7 and not b.has("nothing")
        assert b.offsetof("outer_t", "in.a") == 4 and b.enum_value("BLUE") == 7
        assert [b.type(i) for i in range(len(b))] == [scanned.type(i) for i in range(len(b))]
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert Btf.cached(blob).find("outer") == 6      # the CRC refused it: scanned again, and rewritten
    assert entry.read_bytes() != bytes(data)
    other = blob_of(t(s("long"), 1, 0, 8, 0x01000040))
    assert Btf.cached(other).find("long") == 1 and len(list((tmp_path / "btf").iterdir())) == 2
