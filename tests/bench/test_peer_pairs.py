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
