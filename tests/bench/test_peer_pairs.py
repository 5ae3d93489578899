"""How the peer benches find their pairs under ``$UNWIND_PEER_DUMPS`` (no drgn run: the vmcore here is empty)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))
import benchkit  # noqa: E402

from unwind.dev.synth import SynthDump  # noqa: E402


def test_no_folder_is_a_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(benchkit.PEER_ENV, raising=False)
    got = benchkit.peer_pairs()
    assert isinstance(got, benchkit.Missing) and "set $UNWIND_PEER_DUMPS" in got.reason


def test_pair_is_vmcore_beside_dump_with_its_vmlinux(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("drgn")
    sd = SynthDump("arm64")
    sd.stack("task", 0xFFFF800082000000, 0x4000, pid=1)
    sd.blocked_task(1, "init", {"fp": 0, "pc": 0, "sp": 0})
    (tmp_path / "stop.bin").write_bytes(sd.to_bytes())
    (tmp_path / "stop.vmcore").write_bytes(b"")
    (tmp_path / "stop.vmlinux").write_bytes(b"")
    (tmp_path / "lonely.vmcore").write_bytes(b"")  # no dump beside it: not a pair
    monkeypatch.setenv(benchkit.PEER_ENV, str(tmp_path))
    pairs = benchkit.peer_pairs()
    assert not isinstance(pairs, benchkit.Missing)
    assert [(p.arch, p.dump.name, p.vmcore.name, p.vmlinux.name, p.image.name) for p in pairs] == [
        ("arm64", "stop.bin", "stop.vmcore", "stop.vmlinux", "stop.vmlinux")]


def test_hide_cfi_renames_only_the_cfi_sections(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from elftools.elf.elffile import ELFFile

    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing: the test ELF is built with it")
    (tmp_path / "f.c").write_text("int g(int x) { return x + 1; }\nint f(int x) { return g(x) * 2; }\n")
    obj = tmp_path / "f.o"
    subprocess.run(["gcc", "-g", "-c", "-fasynchronous-unwind-tables", str(tmp_path / "f.c"), "-o", str(obj)],
                   check=True)

    def sections(path: Path) -> dict[str, bytes]:
        with open(path, "rb") as f:
            return {s.name: s.data() for s in ELFFile(f).iter_sections() if s["sh_type"] != "SHT_NOBITS"}
    before = sections(obj)
    assert ".eh_frame" in before  # the compiler wrote CFI for drgn to find
    after = sections(benchkit.hide_cfi(obj, tmp_path / "f.nocfi"))
    renamed = {name.replace(".eh_frame", ".no_frame").replace(".debug_frame", ".nocfi_frame"): data
               for name, data in before.items() if name != ".shstrtab"}
    assert {n: d for n, d in after.items() if n != ".shstrtab"} == renamed
    assert not [n for n in after if n.endswith((".eh_frame", ".debug_frame"))]
