"""Checks shared by the per-arch real-corpus tests."""

from __future__ import annotations

import json
import lzma
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from unwind.cli.corpus import compare_oracle
from unwind.session.replay import Session, load_session
from unwind.core.target import Options


def open_slice(xz: Path, folder: Path) -> dict[str, Any]:
    """A committed vmcore slice (``vmcore/stop-*.elf.xz``) decompressed into ``folder``: ``elf``, its ``arch``,
    the lab's ``capture`` of the same stop, the folder's ``slim`` image and drgn's record (``drgn``; ``None``
    where drgn could not read the vmcore)."""
    stem = xz.name.split(".")[0]
    elf = folder / f"{stem}.elf"
    elf.write_bytes(lzma.decompress(xz.read_bytes()))
    drgn = xz.with_name(f"{stem}.drgn-tasks.json.xz")
    return {"arch": xz.parts[-4], "elf": elf, "capture": xz.with_name(f"{stem}.bin.xz"),
            "slim": next(xz.parents[1].glob("vmlinux-*.slim.xz")),
            "drgn": json.loads(lzma.decompress(drgn.read_bytes())) if drgn.exists() else None}


def running_cpu_results(session: Session, counts: dict[str, Counter[str]]) -> Iterator[tuple[Any, str]]:
    """Each running-CPU oracle of the dump compared with the replay (counted in ``counts`` by source and
    category), with the sentence an assertion about it says; skips the test when the dump has none."""
    seen = 0
    for oracle in session.dump.oracles():
        if oracle.get("cpu") is None:
            continue
        res = compare_oracle(session, oracle)
        if res is None:
            continue
        seen += 1
        counts.setdefault(res.source, Counter())[res.category] += 1
        yield res, (f"{res.source} {res.who}: {res.category}: expected {[hex(x) for x in res.expected]}, "
                    f"replayed {[hex(x) for x in res.got]}")
    if not seen:
        pytest.skip("no running-CPU oracle in this dump")


def assert_blocked_tasks_equal_sysrq_t(dump: str, counts: dict[str, Counter[str]]) -> None:
    """Faithful replay of every blocked task equals the kernel's sysrq-t trace pc for pc."""
    session = load_session(dump)
    tasks = {t.pid: t for t in session.dump.tasks() if not t.running}
    checked = 0
    for oracle in session.dump.oracles():
        if oracle.get("source") != "sysrq-t" or oracle.get("stale") or oracle.get("pid") not in tasks:
            continue
        r = session.replay(tasks[oracle["pid"]], Options(), symbolize=False)
        got = [hex(f.pc) for f in r.frames]
        want = [hex(int(x, 0)) for x in oracle["frames"]]
        counts.setdefault("sysrq-t", Counter())["exact" if got == want else "DIFFERENT"] += 1
        assert got == want, f"pid {oracle['pid']} ({oracle.get('comm')}): stop {r.stop}"
        checked += 1
    if not checked:
        pytest.skip("no fresh sysrq-t oracle for a blocked task in this dump")
