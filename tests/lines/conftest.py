"""A small program built with gcc (``gcc -g -O2``: a call chain, functions inlined two deep) and
binutils' ``addr2line`` as the independent oracle of its source lines."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found")
    return path


def build(tmp: Path, *flags: str, name: str = "prog", source: Path = HERE / "prog.c") -> Path:
    """``source`` compiled in ``tmp`` (its ``DW_AT_comp_dir``) with ``flags``."""
    gcc = _tool("gcc")
    shutil.copy(source, tmp / source.name)
    subprocess.run([gcc, *flags, "-o", name, source.name], cwd=tmp, check=True, capture_output=True)
    return tmp / name


@pytest.fixture(scope="session")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The program with DWARF."""
    return build(tmp_path_factory.mktemp("prog"), "-g", "-O2")


def addr2line(path: Path, addrs: list[int], functions: bool = True, section: str | None = None,
              tool: str = "addr2line") -> dict[int, list[str]]:
    """``addr2line -a -i [-f] [-j section] -e path`` per address (with ``section``, offsets in it): its output
    lines (``function``, ``file:line`` pairs with ``-f``), the ``(discriminator N)`` notes dropped. ``tool``:
    binutils' (the default) or ``llvm-addr2line``, which takes the same options."""
    found = _tool(tool)
    out = subprocess.run([found, "-a", "-i", *(["-f"] if functions else []), *(["-j", section] if section else []),
                          "-e", str(path), *map(hex, addrs)],
                         check=True, capture_output=True, text=True).stdout
    result: dict[int, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if re.fullmatch(r"0x[0-9a-f]+", line):
            current = result.setdefault(int(line, 16), [])
        elif line:
            current.append(line.split(" (discriminator")[0])
    return result


def symbols(path: Path) -> dict[str, tuple[int, int]]:
    """``nm -S``: each text symbol's address and size."""
    out = subprocess.run([_tool("nm"), "-S", str(path)], check=True, capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT":
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return syms


def return_addresses(path: Path) -> list[tuple[str, int]]:
    """``(function, return address)`` of every call ``objdump -d`` shows in the program's own functions."""
    out = subprocess.run([_tool("objdump"), "-d", "--no-show-raw-insn", str(path)], check=True,
                         capture_output=True, text=True).stdout
    found, function, pending = [], None, False
    for line in out.splitlines():
        head = re.match(r"[0-9a-f]+ <(?P<name>[^>]+)>:", line)
        if head:
            function, pending = head["name"], False
            continue
        insn = re.match(r"\s+(?P<addr>[0-9a-f]+):\s+(?P<op>\S+)", line)
        if not insn:
            continue
        if pending and function in ("bottom", "callee", "caller", "main"):
            found.append((function, int(insn["addr"], 16)))
        pending = insn["op"].startswith("call") or insn["op"] in ("bl", "jal", "jalr")
    return found
