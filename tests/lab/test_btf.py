"""BTF reader on a small blob built here with the same construct records."""

import pytest

from unwind.lab.btf import BTF_MAGIC, Btf, BtfError, BtfType, Header


def _blob() -> bytes:
    strings = b"\0int\0long\0inner\0a\0b\0outer\0x\0in\0u1\0u2\0arr\0outer_t\0bits\0"

    def s(name: str) -> int:
        return strings.index(b"\0" + name.encode() + b"\0") + 1

    def t(name_off: int, kind: int, vlen: int, size_or_type: int, extra=None, kflag: int = 0) -> bytes:
        return BtfType.build(dict(name_off=name_off, info=(kflag << 31) | (kind << 24) | vlen,
                                  size_or_type=size_or_type, extra=extra))

    types = b"".join([
        t(s("int"), 1, 0, 4, 0x01000020),                                   # 1 int
        t(s("long"), 1, 0, 8, 0x01000040),                                  # 2 long
        t(s("inner"), 4, 2, 8, [dict(name_off=s("a"), type=1, offset=0),    # 3 struct inner
                                dict(name_off=s("b"), type=1, offset=32)]),
        t(0, 5, 2, 8, [dict(name_off=s("u1"), type=1, offset=0),            # 4 anon union
                       dict(name_off=s("u2"), type=2, offset=0)]),
        t(0, 3, 0, 0, dict(type=1, index_type=1, nelems=4)),                # 5 int[4]
        t(s("outer"), 4, 5, 48, [dict(name_off=s("x"), type=1, offset=0),   # 6 struct outer
                                 dict(name_off=s("in"), type=3, offset=32),
                                 dict(name_off=0, type=4, offset=128),
                                 dict(name_off=s("arr"), type=5, offset=192),
                                 dict(name_off=s("bits"), type=1, offset=(3 << 24) | 320)],
          kflag=1),
        t(s("outer_t"), 8, 0, 6),                                           # 7 typedef
    ])
    hdr = Header.build(dict(magic=BTF_MAGIC, version=1, flags=0, hdr_len=24, type_off=0,
                            type_len=len(types), str_off=len(types), str_len=len(strings)))
    return hdr + types + strings


def test_nested_anonymous_and_array_members() -> None:
    b = Btf(_blob())
    assert b.offsetof("outer", "x") == 0
    assert b.offsetof("outer", "in.b") == 8
    assert b.member("outer", "in.b").size == 4
    assert b.offsetof("outer", "u2") == 16          # inside the anonymous union
    assert b.member("outer", "u2").size == 8
    assert b.offsetof("outer", "arr[2]") == 24 + 8
    assert b.member("outer", "bits").bit_size == 3
    assert b.sizeof("outer") == 48
    assert b.sizeof("outer_t") == 48                  # through the typedef
    assert b.offsetof("outer_t", "in.a") == 4


def test_errors_are_one_line() -> None:
    b = Btf(_blob())
    with pytest.raises(BtfError, match="has no member"):
        b.offsetof("outer", "nope")
    with pytest.raises(BtfError, match="no BTF type"):
        b.sizeof("missing")
    with pytest.raises(BtfError, match="not an array"):
        b.offsetof("outer", "x[1]")
    with pytest.raises(BtfError, match="not a BTF blob"):
        Btf(b"\x00" * 30)
    with pytest.raises(BtfError, match="truncated"):
        Btf(_blob()[:-5])


def test_elf_without_btf(tmp_path) -> None:
    import sys

    with pytest.raises(BtfError, match="no .BTF section"):
        Btf.from_elf(sys.executable if not sys.executable.endswith(".py") else "/bin/ls")
