"""No import cycle among the project's modules, and a replay imports none of the developer tools.

The graph is read from the sources (``unwind/`` and ``arch/``, installed as ``unwind.arch``) with :mod:`ast`.
An import inside a function is an edge as much as one at the top (it only moves the cycle to the first
call); an import under ``if TYPE_CHECKING:`` is for the type checker and is no edge. The checker is shown
to find a cycle, on a package whose one cycle is known by construction, before it is asked for none.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

def modules(root: Path, packages: dict[str, str]) -> dict[str, Path]:
    """Every module under each folder of ``packages`` (folder: its import name), by dotted name."""
    found = {}
    for folder, name in packages.items():
        for path in (root / folder).rglob("*.py"):
            parts = [name, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """The import statements in ``node``, at any depth, but none under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules ``name`` (at ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = []
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([node.module] if node.module else []))
        # ``from package import module`` imports the module; ``from module import name``, the module
        targets += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for target in targets:
        if target.startswith("arch."):
            target = "unwind." + target
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_cycles(root: Path, packages: dict[str, str]) -> list[frozenset[str]]:
    known = modules(root, packages)
    return cycles({name: imports(name, path, known) for name, path in known.items()})


def test_the_checker_finds_a_deferred_cycle_and_not_a_type_checking_one(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from .sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from pkg import a\n    return a\n",           # a -> b -> a, deferred
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n",
        "d.py": "import pkg.c\n",                                                 # c -> d only for types
        "e.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from . import f\n",
        "f.py": "class F:\n    def g(self):\n        from .e import x\n",        # e -> f at run time: a cycle
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert sorted(map(sorted, import_cycles(tmp_path, {"pkg": "pkg"}))) == [["pkg.a", "pkg.sub.b"],
                                                                             ["pkg.e", "pkg.f"]]


def test_no_import_cycle_among_the_project_modules() -> None:
    found = set(import_cycles(ROOT, {"unwind": "unwind", "arch": "unwind.arch"}))
    assert not found, sorted(map(sorted, found))


DUMP = ROOT / "corpora/arm64/6.12.117+deb13-arm64/stop-000-random.bin.xz"
VMCORE = ROOT / "corpora/arm64/6.12.117+deb13-arm64/vmcore/stop-000-random.elf.xz"


@pytest.mark.parametrize("argv", [[str(DUMP)], [str(DUMP), "--all"], [str(VMCORE), "--all"]],
                         ids=["dump", "dump-all", "vmcore-all"])
def test_a_replay_imports_nothing_of_the_developer_tools(argv: list[str], tmp_path: Path) -> None:
    """``unwind replay`` in a fresh interpreter: the modules Python reports importing (``-X importtime``)."""
    env = {**os.environ, "UNWIND_CACHE": str(tmp_path)}
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "unwind", "replay", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout, p.stderr[-2000:]
    imported = {line.rpartition("|")[2].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert {"unwind.session.replay", "unwind.cli.main"} <= imported
    tools = sorted(m for m in imported if m.split(".")[:2] in (["unwind", "dev"], ["unwind", "lab"]))
    assert not tools
