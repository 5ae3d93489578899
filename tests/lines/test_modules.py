"""Source lines of frames in a module: the module's kallsyms name the frame (``name+offset``), its ``.ko``
(found by name under a folder) gives the lines. The ``.ko`` here is built by gcc with one section per
function, so every function starts at 0 of its own section, as a module's ``.text``, ``.text.unlikely``
and ``.init.text`` all do; ``addr2line -j SECTION`` (offsets within that section) is the oracle."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.core.frame import Flag, Frame, Source
from unwind.formats.object_lines import ModuleFiles
from unwind.kernel.symbols import KernelSymbols, ModuleSymbols, SymbolTable
from unwind.session.lines import FrameLines

from .conftest import _tool, addr2line, build, return_addresses, symbols

ROOT = Path(__file__).resolve().parents[2]
DUMP = ROOT / "corpora" / "x86_64" / "6.12.117+deb13-amd64" / "stop-004-random.bin.xz"
#: where the module's text is "loaded": its functions one page apart, in the reverse of their file order
TEXT = 0xFFFFFFFFC0A00000


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def ko(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``t_mod.ko``: the program compiled (not linked) with a section per function."""
    mods = tmp_path_factory.mktemp("mods") / "kernel" / "drivers"
    mods.mkdir(parents=True)
    return build(mods, "-g", "-O2", "-c", "-ffunction-sections", name="t_mod.ko")


def sections_of(path: Path) -> dict[str, str]:
    """Each function's section, as ``objdump -d`` lists them."""
    out = subprocess.run([_tool("objdump"), "-d", str(path)], check=True, capture_output=True, text=True).stdout
    found, section = {}, ""
    for line in out.splitlines():
        if m := re.match(r"Disassembly of section (\S+):", line):
            section = m[1]
        elif m := re.match(r"[0-9a-f]+ <(?P<name>[^>]+)>:", line):
            found[m["name"]] = section
    return found


def loaded(ko: Path) -> tuple[dict[str, int], FrameLines]:
    """Each function's run-time address, and the lines of frames in the module ``t_mod`` so laid out."""
    syms = symbols(ko)
    runtime = {name: TEXT + 0x1000 * i for i, name in enumerate(sorted(syms, reverse=True))}
    module = ModuleSymbols("t_mod", [(TEXT, 0x1000 * len(runtime))], [(a, n) for n, a in runtime.items()])
    lines = FrameLines(None, modules=ModuleFiles(ko.parent.parent.parent),
                       symbols=KernelSymbols(SymbolTable([(0xFFFFFFFF81000000, "T", "_stext")]), [module]))
    return runtime, lines


def test_module_frames_have_the_lines_addr2line_gives_in_their_section(ko: Path) -> None:
    runtime, lines = loaded(ko)
    sections = sections_of(ko)
    syms = symbols(ko)
    checked = 0
    for function, ret in return_addresses(ko):
        start = syms[function][0]
        frame = Frame(runtime[function] + ret - start, source=Source.FRAME)
        want = addr2line(ko, [ret - 1], section=sections[function])[ret - 1]
        got = [x for s in lines.of_frame(frame) for x in (s.function, s.file + ":" + str(s.line))]
        assert got == want, (function, hex(ret))
        checked += 1
    assert checked >= 4


def test_an_exception_pc_in_a_module_is_decoded_where_it_stands(ko: Path) -> None:
    runtime, lines = loaded(ko)
    section = sections_of(ko)["bottom"]
    start, size = symbols(ko)["bottom"]
    want = addr2line(ko, list(range(start, start + size)), section=section)
    pc = next(a for a in range(start, start + size) if len(want[a]) == 6)  # two functions inlined here
    frame = Frame(runtime["bottom"] + pc - start, source=Source.REGS_PC, flags=Flag.BOUNDARY)
    assert [x for s in lines.of_frame(frame) for x in (s.function, s.file + ":" + str(s.line))] == want[pc]
    lines.fill([frame])
    assert frame.line is not None and [frame.line.function, f"{frame.line.file}:{frame.line.line}"] == want[pc][-2:]
    assert lines.text(frame)[1].lstrip().startswith("(inlined by) ")
    assert lines.modules is not None and lines.modules.problems == {}


def test_a_module_without_its_ko_has_no_lines_and_is_named(ko: Path, tmp_path: Path) -> None:
    runtime, lines = loaded(ko)
    lines.modules = ModuleFiles(tmp_path)
    assert lines.of_frame(Frame(runtime["callee"] + 1, source=Source.FRAME)) == []
    assert lines.modules.problems == {"t_mod": f"no .ko of that name under {tmp_path}"}


def test_a_module_ko_without_dwarf_is_named_with_why(ko: Path, tmp_path: Path) -> None:
    runtime, lines = loaded(ko)
    build(tmp_path, "-O2", "-c", name="t_mod.ko")
    lines.modules = ModuleFiles(tmp_path)
    assert lines.of_frame(Frame(runtime["callee"] + 1, source=Source.FRAME)) == []
    assert "has no DWARF" in lines.modules.problems["t_mod"]


def test_decode_finds_a_module_symbol_in_its_own_section(ko: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    prog = build(tmp_path, "-g", "-O2", name="prog")
    start, size = symbols(ko)["caller"]
    ret = next(r for f, r in return_addresses(ko) if f == "caller")
    log = tmp_path / "log"
    log.write_text(f" caller+{ret - start:#x}/{size:#x} [t_mod]\n")
    assert main(["decode", str(log), "--vmlinux", str(prog), "--modules", str(ko.parent.parent.parent)]) == 0
    want = addr2line(ko, [ret - 1], functions=False, section=sections_of(ko)["caller"])[ret - 1]
    assert capsys.readouterr().out == f" caller ({' '.join(x.removeprefix(f'{ko.parent}/') for x in want)}) [t_mod]\n"


@pytest.mark.parametrize("argv, says", [
    (["--modules", "."], "needs --lines"),
    (["--lines", "--modules", "/nonexistent/mods"], "not a folder"),
])
def test_modules_is_refused_without_lines_or_a_folder(argv: list[str], says: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(DUMP), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
