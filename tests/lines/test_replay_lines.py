"""``unwind replay --lines``: a frame's source lines under its trace line and in the JSON; an image
without DWARF leaves the output as it was, with one note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.core.frame import Flag, Frame, Source
from unwind.core.target import Options
from unwind.formats.dwarf_lines import index_for
from unwind.session.lines import FrameLines
from unwind.session.replay import Session

from .conftest import addr2line, return_addresses, symbols

ROOT = Path(__file__).resolve().parents[2]
DUMP = ROOT / "corpora" / "x86_64" / "6.12.117+deb13-amd64" / "stop-004-random.bin.xz"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache without any fetched -dbg vmlinux: the corpus' slim image is the only one found."""
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("UNWIND_IMAGE_PATH", raising=False)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_without_dwarf_the_text_is_unchanged_and_one_note_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    rc, plain, _ = _run(capsys, "replay", str(DUMP))
    rc_lines, text, err = _run(capsys, "replay", str(DUMP), "--lines")
    assert (rc_lines, text) == (rc, plain)
    notes = [line for line in err.splitlines() if "--lines" in line]
    assert len(notes) == 1 and "has no DWARF" in notes[0] and notes[0].startswith("unwind: note: ")


def test_without_dwarf_the_json_adds_empty_lines(capsys: pytest.CaptureFixture[str]) -> None:
    _, plain, _ = _run(capsys, "replay", str(DUMP), "--json")
    _, with_lines, _ = _run(capsys, "replay", str(DUMP), "--json", "--lines")
    for a, b in zip(plain.splitlines(), with_lines.splitlines(), strict=True):
        doc = json.loads(b)
        assert doc.pop("lines_image") is None
        assert all(f.pop("lines") == [] for f in doc["frames"])
        assert doc == json.loads(a)


def test_frame_lines_decode_a_return_address_at_its_call(prog: Path) -> None:
    sources = FrameLines(index_for(prog))
    rets = [r for _, r in return_addresses(prog)]
    start, size = symbols(prog)["bottom"]
    pcs = [a for a in range(start, start + size) if len(addr2line(prog, [a])[a]) == 6][:1]
    frames = [Frame(r, source=Source.FRAME) for r in rets] + [Frame(pc, source=Source.REGS_PC, flags=Flag.BOUNDARY)
                                                              for pc in pcs]
    want = addr2line(prog, [r - 1 for r in rets] + pcs)
    sources.fill(frames)
    for f, at in zip(frames, [r - 1 for r in rets] + pcs):
        got = [x for s in sources.of_frame(f) for x in (s.function, f"{prog.parent}/{s.location(sources.index.comp_dir)}")]
        assert got == want[at]
        assert [d["line"] for d in sources.to_json(f)] == [int(x.rsplit(":", 1)[1]) for x in want[at][1::2]]
    assert len(sources.text(frames[-1])) == 3 and sources.text(frames[-1])[1].startswith("       (inlined by) ")


def test_frame_line_and_inlined_are_addr2lines_levels(prog: Path) -> None:
    """``Frame.line`` is addr2line's last (outermost) level, ``Frame.inlined`` the levels before it."""
    sources = FrameLines(index_for(prog))
    assert sources.index is not None
    rets = [r for _, r in return_addresses(prog)]
    start, size = symbols(prog)["bottom"]
    pcs = [a for a in range(start, start + size) if len(addr2line(prog, [a])[a]) == 6][:1]
    assert pcs, "no pc of bottom() with two inlined levels"
    frames = [Frame(r, source=Source.FRAME) for r in rets] + [Frame(pc, source=Source.REGS_PC, flags=Flag.BOUNDARY)
                                                              for pc in pcs]
    at = [r - 1 for r in rets] + pcs
    want = addr2line(prog, at)
    sources.fill(frames)
    for f, a in zip(frames, at):
        assert f.line is not None
        levels = [(s.function, f"{prog.parent}/{s.location(sources.index.comp_dir)}") for s in (*f.inlined, f.line)]
        assert levels == list(zip(want[a][0::2], want[a][1::2]))
        assert len(f.inlined) == len(want[a]) // 2 - 1
    assert len(frames[-1].inlined) == 2


def test_frame_line_is_none_outside_the_dwarf(prog: Path) -> None:
    frames = [Frame(0x10, source=Source.FRAME)]
    FrameLines(index_for(prog)).fill(frames)
    assert (frames[0].line, frames[0].inlined) == (None, ())


def test_replay_lines_on_a_slim_image_leave_the_frames_without_lines() -> None:
    session = Session.load(DUMP)
    tasks = session.select(every=True)
    plain = [r.frames for r in session.replay_all(Options(), tasks)]
    one = [session.replay(t, Options(), lines=True).frames for t in tasks]
    batch = [r.frames for r in session.replay_all(Options(), tasks, lines=True)]
    assert session.source_lines().note is not None and "has no DWARF" in session.source_lines().note
    assert one == batch == plain and any(plain)
    assert all(f.line is None and f.inlined == () for frames in one + batch for f in frames)
