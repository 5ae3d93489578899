"""Layouts for a walk: BTF, then the dump's offsets, then derived, then the table; and the capture's writer."""

from __future__ import annotations

from types import SimpleNamespace

from construct import Int64ul, Struct

from tests.btfbuild import BtfBuilder
from unwind.core.dumpinfo import DumpInfo
from unwind.formats.note import validate_note
from unwind.formats.note_info import dump_info
from unwind.kernel.btf import Btf
from unwind.lab.guest import CaptureSession
from unwind.kernel.layout import StructLayout, btf_offsets, dump_layout, resolve_layout, table_layout

DECL = Struct("a" / Int64ul, "b" / Int64ul, "c" / Int64ul)
TABLE = table_layout("thing", DECL, ("a", "c"), "test table")


def _btf() -> Btf:
    b = BtfBuilder()
    u64 = b.int("u64", 8)
    b.struct("thing", 40, [("a", u64, 8), ("b", u64, 16), ("c", u64, 32)])
    return Btf(b.blob())


def _offsets(offsets):
    """``offsets`` as a dump's note holds them, read back as replay reads a note (malformed ones dropped)."""
    note = validate_note({"format": 1, "arch": "arm64", "offsets": offsets}, None, lambda _msg: None)
    return dump_info(note, None).offsets


def _target(image=None, offsets=None):
    return SimpleNamespace(image=image, info=DumpInfo(offsets=None if offsets is None else _offsets(offsets)))


def test_the_order_of_sources():
    btf = _btf()
    dumped = {"thing": {"size": 48, "members": {"a": 0, "c": "0x28"}}}
    derived = StructLayout("thing", 32, {"a": 0, "c": 24}, "derived", "from the stacks")
    got = resolve_layout(_target(SimpleNamespace(btf=btf), dumped), "thing", ("a", "c"), TABLE, lambda: derived)
    assert (got.source, got.size, dict(got.offsets)) == ("btf", 40, {"a": 8, "c": 32})
    got = resolve_layout(_target(SimpleNamespace(btf=None), dumped), "thing", ("a", "c"), TABLE, lambda: derived)
    assert (got.source, got.size, dict(got.offsets)) == ("dump", 48, {"a": 0, "c": 40})
    got = resolve_layout(_target(None, None), "thing", ("a", "c"), TABLE, lambda: derived)
    assert got.source == "derived"
    got = resolve_layout(_target(None, None), "thing", ("a", "c"), TABLE, lambda: None)
    assert (got.source, got.size, dict(got.offsets)) == ("table", 24, {"a": 0, "c": 16})
    assert got.describe() == "struct thing: 24 bytes, from table (test table)"


def test_a_btf_without_the_struct_falls_through():
    b = BtfBuilder()
    b.int("u64", 8)
    got = resolve_layout(_target(SimpleNamespace(btf=Btf(b.blob()))), "thing", ("a",), TABLE)
    assert got.source == "table"


def test_a_layout_read_once_per_btf_answers_each_btf_as_its_own():
    """Dumps of one image share its BTF's layouts; another BTF (another image) reads its own, and a
    struct or member missing from a BTF stays missing on every later walk."""
    btf = _btf()
    b = BtfBuilder()
    u64 = b.int("u64", 8)
    b.struct("thing", 64, [("a", u64, 0), ("c", u64, 56)])
    other = Btf(b.blob())
    for _ in range(2):
        got = resolve_layout(_target(SimpleNamespace(btf=btf)), "thing", ("a", "c"), TABLE)
        assert (got.source, got.size, dict(got.offsets)) == ("btf", 40, {"a": 8, "c": 32})
        got = resolve_layout(_target(SimpleNamespace(btf=other)), "thing", ("a", "c"), TABLE)
        assert (got.source, got.size, dict(got.offsets)) == ("btf", 64, {"a": 0, "c": 56})
        got = resolve_layout(_target(SimpleNamespace(btf=btf)), "thing", ("a", "d"), TABLE)
        assert got.source == "table"
        got = resolve_layout(_target(SimpleNamespace(btf=btf)), "nothing", ("a",), TABLE)
        assert got.source == "table"


def test_malformed_dump_offsets_are_ignored():
    for bad in (None, [], {"thing": 3}, {"thing": {"size": "x", "members": {"a": 0, "c": 8}}},
                {"thing": {"size": 24, "members": {"a": 0}}}, {"thing": {"size": 24, "members": {"a": True, "c": 8}}},
                {"thing": {"size": 24, "members": {"a": -8, "c": 8}}}, {"thing": {"size": 1 << 40, "members": {}}},
                {"thing": {"size": 24, "members": {"a": 0, "c": 24}}}):
        assert dump_layout(_offsets(bad), "thing", ("a", "c")) is None, bad


def test_capture_writes_what_replay_reads_back():
    offsets = btf_offsets(_btf(), {"thing": ("a", "c", "missing"), "absent": ("x",)})
    assert offsets == {"thing": {"size": 40, "members": {"a": 8, "c": 32}}}
    back = dump_layout(_offsets(offsets), "thing", ("a", "c"))
    assert back is not None and (back.size, dict(back.offsets), back.source) == (40, {"a": 8, "c": 32}, "dump")


def test_capture_offsets_meta_names_the_arch_layouts():
    b = BtfBuilder()
    u64 = b.int("u64", 8)
    regs = b.array(u64, 31)
    b.struct("pt_regs", 320, [("regs", regs, 0), ("pc", u64, 256), ("pstate", u64, 264), ("stackframe", u64, 296)])
    got = CaptureSession.offsets_meta(SimpleNamespace(btf=Btf(b.blob()), arch="arm64"))  # type: ignore[arg-type]
    assert got == {"pt_regs": {"size": 320, "members": {"regs": 0, "pc": 256, "pstate": 264, "stackframe": 296}}}
