"""The committed real-kernel corpora are complete: enough stops, every blocked task's stack, oracles."""

from pathlib import Path

import pytest

from unwind.dump import Dump

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
FOLDERS = sorted(p for p in CORPORA.glob("*/*") if p.is_dir() and any(p.glob("stop-*.bin.xz")))


def test_every_arch_has_a_corpus() -> None:
    assert {p.parent.name for p in FOLDERS} >= {"x86_64", "arm64", "riscv"}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_folder(folder: Path) -> None:
    dumps = sorted(folder.glob("stop-*.bin.xz"))
    assert len(dumps) >= 20
    kinds = set()
    for path in dumps:
        d = Dump.open(path)
        assert d.release == folder.name
        assert (folder / f"vmlinux-{d.build_id}.slim.xz").exists()
        assert d.vmcoreinfo.get("OSRELEASE") == folder.name
        kinds.add(d.meta["capture"]["kind"].split(":")[0])
        blocked = [t for t in d.tasks() if t.cpu is None and t.context]
        assert len(blocked) >= 40
        for t in blocked:
            sp = t.context["sp"]
            top = max(s.high for s in t.stacks if s.kind == "task")
            d.memory.read(sp, top - sp)  # the whole [sp, top) was captured
        srcs = {o["source"] for o in d.oracles()}
        assert "sysrq-t" in srcs and "gdb" in srcs
    assert kinds >= {"random", "irq", "syscall-entry", "hijack", "sysrq-l"}
