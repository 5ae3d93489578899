"""``unwind decode`` on console text in each arch's style (the formats of the real consoles in
``corpora/``), against ``addr2line -i`` on the program gcc builds here: a return address decoded at
its call, an exception pc where it stands, every other line unchanged."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from unwind.cli.decode import Decoder, find_symbol
from unwind.cli.main import main

from .conftest import addr2line, build, return_addresses, symbols


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))


def _frame(prog: Path, addr: int) -> str:
    """``name+0xoff/0xsize`` of ``addr`` from ``nm -S``."""
    for name, (start, size) in symbols(prog).items():
        if start <= addr < start + size and not name.startswith("_"):
            return f"{name}+{addr - start:#x}/{size:#x}"
    raise AssertionError(hex(addr))


def _code(prog: Path, addr: int) -> str:
    """What decode_stacktrace.sh puts in the parentheses: ``addr2line -i`` lines, joined by spaces."""
    return " ".join(line.removeprefix(f"{prog.parent}/") for line in addr2line(prog, [addr], functions=False)[addr])


def _pc_inside_inlines(prog: Path) -> int:
    """An address of bottom where leaf_add is inlined (addr2line gives three levels)."""
    start, size = symbols(prog)["bottom"]
    chains = addr2line(prog, list(range(start, start + size)))
    return next(a for a, lines in chains.items() if len(lines) == 6)


def _styles(prog: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per arch: console lines and what decode must print for each (``None``: the line unchanged)."""
    rets = return_addresses(prog)
    assert len(rets) >= 3
    pc = _pc_inside_inlines(prog)
    name = lambda a: _frame(prog, a).split("+")[0]  # noqa: E731
    out: dict[str, tuple[list[str], list[str]]] = {}
    ra = [r for _, r in rets]
    # x86-64, 6.12: sysrq-t with <TASK> markers, `? ` guesses, a RIP: line, a loglevel prefix
    out["x86_64"] = ([
        "[  497.132183] sysrq: Show State",
        "<4>[  497.133160] task:sh              state:R  running task     stack:0     pid:1     tgid:1",
        "[  497.134396] Call Trace:",
        "[  497.137148]  <TASK>",
        f"[  497.138244]  {_frame(prog, ra[0])}",
        f"[  497.142909]  ? {_frame(prog, ra[1])}",
        f"[  497.143554]  {_frame(prog, ra[2])}",
        "[  497.148740]  ? 0xffffffffc020c099",
        f"[   35.919313] RIP: 0010:{_frame(prog, pc)}",
        "[   35.919314] RIP: 0033:0x4ae3f7",
        "[  497.161160]  </TASK>",
    ], [
        None, None, None, None,
        f"[  497.138244]  {name(ra[0])} ({_code(prog, ra[0] - 1)})",
        f"[  497.142909]  ? {name(ra[1])} ({_code(prog, ra[1] - 1)})",
        f"[  497.143554]  {name(ra[2])} ({_code(prog, ra[2] - 1)})",
        None,
        f"[   35.919313] RIP: 0010:{name(pc)} ({_code(prog, pc)})",
        None, None,
    ])
    # arm64, 7.x: the kunwind source markers after a frame, pc : / lr : register lines
    out["arm64"] = ([
        "[   24.477672] Call trace:",
        f"[   24.498394]  {_frame(prog, pc)} (P)",
        f"[   24.498969]  {_frame(prog, ra[0])} (C)",
        f"[   24.499219]  {_frame(prog, ra[1])} (F)",
        f"[   24.499280]  {_frame(prog, ra[2])} (CF)",
        f"[ 1658.611725] pc : {_frame(prog, pc)}",
        f"[ 1658.621962] lr : {_frame(prog, ra[0])}",
        "[ 1658.621963] sp : ffff800080003e40",
    ], [
        None,
        f"[   24.498394]  {name(pc)} ({_code(prog, pc)}) (P)",
        f"[   24.498969]  {name(ra[0])} ({_code(prog, ra[0] - 1)}) (C)",
        f"[   24.499219]  {name(ra[1])} ({_code(prog, ra[1] - 1)}) (F)",
        f"[   24.499280]  {name(ra[2])} ({_code(prog, ra[2] - 1)}) (CF)",
        f"[ 1658.611725] pc : {name(pc)} ({_code(prog, pc)})",
        f"[ 1658.621962] lr : {name(ra[0])} ({_code(prog, ra[0] - 1)})",
        None,
    ])
    # riscv, 7.x: [<address>] before each frame (dropped, as decode_stacktrace.sh drops it), epc : / ra :
    out["riscv"] = ([
        "[   42.469262] Call Trace:",
        f"[   42.469638] [<ffffffff8001af18>] {_frame(prog, ra[0])}",
        f"[   42.470531] [<ffffffff8000263a>] {_frame(prog, ra[1])}",
        f"[  595.374662] epc : {_frame(prog, pc)}",
        f"[  595.375838]  ra : {_frame(prog, ra[2])}",
        "[  595.375931] epc : ffffffff8015fdd6 ra : ffffffff8015fe40 sp : ff20000000eeb800",
    ], [
        None,
        f"[   42.469638] {name(ra[0])} ({_code(prog, ra[0] - 1)})",
        f"[   42.470531] {name(ra[1])} ({_code(prog, ra[1] - 1)})",
        f"[  595.374662] epc : {name(pc)} ({_code(prog, pc)})",
        f"[  595.375838]  ra : {name(ra[2])} ({_code(prog, ra[2] - 1)})",
        None,
    ])
    return out


@pytest.mark.parametrize("arch", ["x86_64", "arm64", "riscv"])
def test_console_trace_lines_decode_as_addr2line_says(prog: Path, arch: str) -> None:
    lines, want = _styles(prog)[arch]
    got = list(Decoder(prog).decode(lines))
    assert got == [w if w is not None else line for line, w in zip(lines, want)]


def test_a_trace_frame_repeating_the_register_pc_is_that_pc(prog: Path) -> None:
    """arm64 before 6.13 and riscv print a trace from registers starting at the pc, unmarked."""
    pc = _pc_inside_inlines(prog)
    ret = return_addresses(prog)[0][1]
    name = _frame(prog, pc).split("+")[0]
    lines = [f"[ 1658.611725] pc : {_frame(prog, pc)}", "[ 1658.612000] Call trace:", f"[ 1658.612001]  {_frame(prog, pc)}",
             f"[ 1658.612002]  {_frame(prog, ret)}"]
    got = list(Decoder(prog).decode(lines))
    assert got[2] == f"[ 1658.612001]  {name} ({_code(prog, pc)})"
    assert got[3] == f"[ 1658.612002]  {_frame(prog, ret).split('+')[0]} ({_code(prog, ret - 1)})"


def test_the_command_reads_a_file_or_stdin(prog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    lines, want = _styles(prog)["x86_64"]
    log = tmp_path / "console.txt"
    log.write_text("\r\n".join(lines) + "\r\n")
    expect = "".join((w if w is not None else line) + "\n" for line, w in zip(lines, want))
    assert main(["decode", str(log), "--vmlinux", str(prog)]) == 0
    assert capsys.readouterr().out == expect
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["decode", "-", "--vmlinux", str(prog)]) == 0
    assert capsys.readouterr().out == expect


def test_module_frames_decode_from_the_ko_found_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mods = tmp_path / "mods" / "kernel" / "drivers"
    mods.mkdir(parents=True)
    # one code section (.text), as a module's functions: a symbol's address is its offset in .text
    ko = build(mods, "-g", "-O2", "-c", "-fno-reorder-functions", "-fno-reorder-blocks-and-partition",
               name="t_mod.ko")
    prog = build(tmp_path, "-g", "-O2", name="prog")
    start, size = symbols(ko)["callee"]
    ret = next(r for f, r in return_addresses(ko) if f == "callee")
    log = tmp_path / "log"
    log.write_text(f"[    1.000000]  callee+{ret - start:#x}/{size:#x} [t_mod]\n"
                   f"[    1.000001]  callee+{ret - start:#x}/{size:#x} [other_mod]\n")
    assert main(["decode", str(log), "--vmlinux", str(prog), "--modules", str(tmp_path / "mods")]) == 0
    out = capsys.readouterr()
    code = " ".join(line.removeprefix(f"{mods}/") for line in addr2line(ko, [ret - 1], functions=False)[ret - 1])
    assert out.out.splitlines() == [f"[    1.000000]  callee ({code}) [t_mod]",
                                    f"[    1.000001]  callee+{ret - start:#x}/{size:#x} [other_mod]"]
    assert out.err.count("other_mod") == 1


def test_an_image_without_dwarf_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = build(tmp_path, "-O2", name="plain")
    assert main(["decode", "-", "--vmlinux", str(plain)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no DWARF" in err


def test_the_symbol_decoded_is_the_last_of_the_line_with_its_module_and_marker() -> None:
    sym = find_symbol("[  1.5] RIP: 0010:foo_bar.cold+0x1c/0x40 [mod_x 0123abcd] (PF)")
    assert (sym.segment, sym.name, sym.offset, sym.module, sym.info, sym.pc_register, sym.in_place) == \
        ("0010:", "foo_bar.cold", 0x1c, "mod_x", " (PF)", True, True)
    assert find_symbol(" ? 0xffffffffc020c099") is None
    assert find_symbol("<4>[ 3.2] lr : a+0x4/0x8").in_place is False
    assert find_symbol(" ret_from_fork+0x0/0x20").in_place is True  # a function's entry: no call before it


def test_decode_runs_as_a_command(prog: Path) -> None:
    lines, want = _styles(prog)["riscv"]
    done = subprocess.run([sys.executable, "-m", "unwind", "decode", "--vmlinux", str(prog)],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[1] == want[1]
