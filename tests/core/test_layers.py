"""The layers of docs/architecture.md, as folders: a module imports only from the layers its own may use.

Imports inside functions count; ``if TYPE_CHECKING:`` imports do not (they are for the reader and the
type checker). The table is the documented one; a new edge is either a design change (update the doc
and this table together) or a misplaced module.
"""

from __future__ import annotations

from pathlib import Path

from .test_no_import_cycles import ROOT, imports, modules

#: layer -> the layers it may import from (besides itself)
ALLOWED = {
    "top": {"cli"},                                   # unwind/__init__, __main__, lazy
    "core": set(),
    "kernel": {"core", "formats"},
    "formats": {"core", "kernel", "top"},
    "session": {"core", "kernel", "formats"},
    "cli": {"core", "kernel", "formats", "session", "top"},
    "arch": {"core", "kernel", "formats", "session"},
    "dev": {"core", "kernel", "formats", "session", "cli", "arch"},
    "lab": {"core", "kernel", "formats", "session", "cli", "arch"},
}
#: an arch's scenario builders are development tools: they build on unwind/dev/synth.py
ARCH_DEV = {"synth"}


def layer(module: str) -> str:
    """The layer of a dotted module name."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "top"


def wrong_imports(root: Path, packages: dict[str, str]) -> list[str]:
    """Every import that leaves its layer's allowed set."""
    known = modules(root, packages)
    wrong = []
    for name, path in known.items():
        mine = layer(name)
        for target in imports(name, path, known):
            theirs = layer(target)
            if theirs == mine or theirs in ALLOWED[mine]:
                continue
            if mine == "arch" and theirs == "dev" and name.rpartition(".")[2] in ARCH_DEV:
                continue
            wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    return sorted(wrong)


def test_every_import_stays_within_the_layers() -> None:
    wrong = wrong_imports(ROOT, {"unwind": "unwind", "arch": "unwind.arch"})
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_deferred_upward_import_and_not_a_type_checking_one(tmp_path: Path) -> None:
    pkg = tmp_path / "unwind"
    for folder in ("core", "session"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "session" / "replay.py").write_text("from unwind.core import walk\n")
    (pkg / "core" / "walk.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from unwind.session import replay\n"
        "def f():\n    from unwind.session.replay import g\n")
    assert wrong_imports(tmp_path, {"unwind": "unwind"}) == [
        "unwind.core.walk (core) imports unwind.session.replay (session)"]
