"""The line index against ``addr2line -i -f`` on a program gcc builds here."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.core.frame import Flag, Frame, Source
from unwind.formats import dwarf_lines
from unwind.formats.dwarf_lines import LineIndex, index_for
from unwind.formats.image import Image
from unwind.session.lines import decode_address, inline_text

from .conftest import addr2line, build, symbols


def _levels(index: LineIndex, addr: int) -> list[str]:
    out = []
    for s in index.lookup(addr):
        out += [s.function or "??", f"{s.file}:{s.line}"]
    return out


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))


def test_every_address_of_every_function_matches_addr2line(prog: Path) -> None:
    index = index_for(prog)
    assert index is not None
    addrs = [a for name, (start, size) in symbols(prog).items() if name in ("bottom", "callee", "caller", "main")
             for a in range(start, start + size)]
    want = addr2line(prog, addrs)
    got = {a: _levels(index, a) for a in addrs}
    assert {a: got[a] for a in addrs if got[a] != want[a]} == {}
    # the chain is exercised: leaf_add inlined into middle inlined into bottom
    assert max(len(v) for v in got.values()) >= 6


def test_the_index_is_read_back_from_the_cache_without_dwarf(prog: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = index_for(prog)
    assert first is not None and first.build_id
    monkeypatch.setattr(dwarf_lines, "build_index", lambda *a: pytest.fail("DWARF parsed again"))
    again = index_for(prog)
    start, size = symbols(prog)["bottom"]
    assert again is not None
    assert [again.lookup(a) for a in range(start, start + size)] == [first.lookup(a) for a in range(start, start + size)]


def test_an_image_without_dwarf_has_no_index(tmp_path: Path) -> None:
    plain = build(tmp_path, "-O2", name="plain")
    assert index_for(plain) is None


def test_files_are_shown_relative_to_the_build_folder(prog: Path) -> None:
    index = index_for(prog)
    start, _ = symbols(prog)["caller"]
    (level,) = index.lookup(start)
    assert index.comp_dir == str(prog.parent)
    assert level.file == f"{prog.parent}/prog.c" and level.location(index.comp_dir) == f"prog.c:{level.line}"


def test_a_return_address_is_decoded_at_its_call_an_exception_pc_where_it_stands() -> None:
    ret = Frame(0x1000, source=Source.FRAME)
    regs = Frame(0x1000, source=Source.REGS_PC, flags=Flag.BOUNDARY)
    orc = Frame(0x1000, source=Source.ORC_REGS, flags=Flag.BOUNDARY)
    live_lr = Frame(0x1000, source=Source.LIVE_LR, flags=Flag.BOUNDARY | Flag.COMPLETE)
    assert [decode_address(f) for f in (ret, regs, orc, live_lr)] == [0xfff, 0x1000, 0x1000, 0xfff]


def test_inline_chains_print_as_faddr2line_prints_them(prog: Path) -> None:
    index = index_for(prog)
    start, size = symbols(prog)["bottom"]
    deepest = max((index.lookup(a) for a in range(start, start + size)), key=len)
    text = inline_text(deepest, index.comp_dir)
    assert text[0].startswith("leaf_add at prog.c:")
    assert text[1].startswith(" (inlined by) middle at prog.c:")
    assert text[-1].startswith(" (inlined by) bottom at prog.c:")


def test_an_image_opened_twice_gives_one_index(prog: Path) -> None:
    a, b = LineIndex.of_image(Image(prog)), LineIndex.of_image(Image(prog))
    assert a.to_arrays()[0] == b.to_arrays()[0] and len(a) == len(b) > 0
