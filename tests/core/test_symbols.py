"""kallsyms-style symbol lookup: aliases, sizes and System.map parsing."""

from __future__ import annotations

import pytest

from unwind.kernel.symbols import SymbolError, SymbolTable


def table() -> SymbolTable:
    # source order as nm -n would give it; aliases at 0x1000
    return SymbolTable([
        (0x1000, "W", "weak_alias"), (0x1000, "T", "__start_thing"), (0x1000, "T", "__real"),
        (0x1000, "T", "real"), (0x1040, "t", "local.constprop.0"), (0x1100, "A", "absolute"),
        (0x1100, "T", "last"), (0x1200, "T", "_etext"), (0x1050, "U", "undefined"), (0x1060, "t", "$x"),
    ])


def test_alias_order_follows_compare_symbols():
    # weak after strong, linker-provided after others, fewer underscores first
    assert table().lookup(0x1010).name == "real"


def test_size_is_distance_to_next_symbol():
    t = table()
    s = t.lookup(0x1044)
    assert (s.name, s.offset, s.size) == ("local.constprop.0", 4, 0xC0)
    assert t.format(0x1044) == "local.constprop.0+0x4/0xc0"


def test_ignored_symbols_do_not_split_functions():
    t = table()
    assert t.lookup(0x1060).name == "local.constprop.0"   # mapping symbol $x ignored
    assert t.lookup(0x1100).name == "last"                 # absolute symbol ignored


def test_below_first_and_past_the_end():
    t = table()
    assert t.lookup(0xFFF) is None and t.format(0xFFF) == "0xfff"
    assert t.lookup(0x11FF).name == "last" and t.lookup(0x11FF).size == 0x100   # runs to _etext
    # is_ksym_addr() is false from the image's end on: %pS prints the bare address
    assert t.lookup(0x1200) is None and t.format(0x1200) == "0x1200"
    assert t.format(0xAEBE6ED8715 + 0x1200) == hex(0xAEBE6ED8715 + 0x1200)


def test_end_of_image_is_end_symbol():
    t = SymbolTable([(0x1000, "T", "_stext"), (0x1100, "T", "_etext"), (0x2000, "D", "data"),
                     (0x3000, "B", "init_pg_end"), (0x3000, "B", "_end")])
    assert t.format(0x2010) == "data+0x10/0x1000"
    assert t.lookup(0x3000) is None and t.format(0x3000 + 0xAEBE6ED8715) == hex(0x3000 + 0xAEBE6ED8715)


def test_system_map(tmp_path):
    p = tmp_path / "System.map"
    p.write_text("ffffffff81000000 T _stext\nffffffff81000000 T startup_64\n"
                 "ffffffff81000040 t helper\nffffffff81000100 T _etext\n")
    t = SymbolTable.from_system_map(p)
    assert t.format(0xFFFFFFFF81000044) == "helper+0x4/0xc0"
    assert t.address("_stext") == 0xFFFFFFFF81000000
    p.write_text("zzzz T broken\n")
    with pytest.raises(SymbolError):
        SymbolTable.from_system_map(p)


def test_address_by_name_asked_again_and_past_the_memo(monkeypatch):
    # the answers by construction: each alias's address as given, the lowest for a name given twice
    entries = [(0x1000 + 0x10 * i, "T", f"f{i}") for i in range(40)] + [(0x2000, "T", "f3"), (0x1000, "W", "alias")]
    want = {f"f{i}": 0x1000 + 0x10 * i for i in range(40)} | {"alias": 0x1000}
    monkeypatch.setattr("unwind.kernel.symbols._ASKED_MAX", 8)  # the memo is emptied several times below
    t = SymbolTable(entries)
    for _ in range(3):
        for name, addr in want.items():
            assert t.address(name) == addr and name in t
        assert t.address("missing") is None and "missing" not in t
        assert t.address(["not", "hashable"]) is None and t.address(None) is None and t.address("\udc80") is None
    assert len(t._asked) <= 8
    again = SymbolTable.from_arrays(t.to_arrays())
    assert all(again.address(n) == a for n, a in want.items())
