"""The peer: drgn's ``stack_trace`` against our walk, on the same tasks of the same stopped kernel.

Needs a pair per arch under ``$UNWIND_PEER_DUMPS``: ``NAME.vmcore`` (QEMU
``dump-guest-memory`` of the stopped guest, ~1 GB, never committed) beside
``NAME.bin[.xz]`` (our dump of the same stop), and the debug vmlinux
(``NAME.vmlinux``, else the lab's fetched kernel of that release). Both
tools walk the same tasks (those drgn can name: running tasks by CPU,
others by pid; tasks where drgn loops past 64 frames are left out of both);
each side's time is divided by the frames it walked. drgn cannot unwind
riscv64, so only x86-64 and arm64 are compared.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchkit import PeerWorkload, drgn_all, measure, need, peer_workload, walk_all


@pytest.mark.parametrize("tool", ["unwind", "drgn"])
@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_peer(benchmark: Any, arch: str, tool: str) -> None:
    """Every shared task walked by ``tool``."""
    w: PeerWorkload = need(peer_workload(arch))
    benchmark.group = f"peer: {arch}"
    benchmark.extra_info.update(kind="peer", arch=arch, tool=tool, pair=w.label, tasks=len(w.ours),
                                left_out=w.left_out)
    if tool == "unwind":
        benchmark.extra_info["frames"] = measure(benchmark, walk_all, w.backend, w.ours)
    else:
        benchmark.extra_info["frames"] = measure(benchmark, drgn_all, w.drgn_trace, w.drgn_tasks)
