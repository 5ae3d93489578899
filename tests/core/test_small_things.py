"""Small user-facing edges: `kernels list` with nothing fetched, re-slimming a slim image."""

from __future__ import annotations

from pathlib import Path

from unwind.cli.main import main
from unwind.core.memory import Memory
from unwind.core.target import Options, Target, Task
from unwind.formats.image import Image

ROOT = Path(__file__).resolve().parents[2]
RISCV = ROOT / "corpora/riscv/6.12.117+deb13-riscv64"


def test_kernels_list_says_none_fetched(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path))
    assert main(["kernels", "list"]) == 0
    assert capsys.readouterr().out.startswith("none fetched in ")


def test_slim_of_a_slim_image_keeps_its_text(tmp_path, capsys):
    src = next(RISCV.glob("vmlinux-*.slim.xz"))
    before = Image(src)
    assert before.has_text
    out = tmp_path / "again.slim"
    assert main(["slim", str(src), "-o", str(out)]) == 0
    after = Image(out)
    assert after.build_id == before.build_id and after.has_text
    addr = before.symbols.address("handle_exception")
    assert after.text(addr, 16) == before.text(addr, 16) is not None


def test_target_replace_changes_only_the_fields_named():
    mem, task = Memory([]), Task(1, "x")
    shared = {"k": 1}
    t = Target("arm64", mem, task, "6.12", options=Options(record=False), shared=shared)
    r = t.replace(options=Options(record=True), shared={})
    assert r.options.record and not t.options.record
    assert r.shared == {} and t.shared is shared
    assert (r.arch, r.mem, r.task, r.release, r.info) == ("arm64", mem, task, "6.12", t.info)
    assert t.replace() == t and r != t
    assert repr(t).startswith("Target(arch='arm64', mem=")
