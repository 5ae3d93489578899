"""Small user-facing edges: `kernels list` with nothing fetched, re-slimming a slim image."""

from __future__ import annotations

from pathlib import Path

from unwind.cli.main import main
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
