"""gdb-multiarch's ``bt`` on a lab guest under QEMU, with and without unwind's unwinder, against the
kernel's own trace of the same stop (:mod:`unwind.lab.gdbcompare`: inside the timer interrupt handler,
and in ``read_zero`` under the function_graph-traced ``vfs_read`` and the kretprobed ``ksys_read``).

Slow: it boots the guest (fetching the kernel when the cache has none) and runs QEMU TCG. The counts of a
run are in docs/gdb.md."""

from __future__ import annotations

import shutil

import pytest

from unwind.lab import gdbcompare
from unwind.lab.fetch import ARCHES, FetchError, fetch, find_kernel


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["arm64", "x86_64", "riscv"])
def test_bt_with_unwind_follows_the_kernels_own_trace(arch: str) -> None:
    for tool in ("gdb-multiarch", ARCHES[arch][2]):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    try:
        find_kernel(arch)
    except FetchError:
        fetch(arch, "trixie")
    stops = gdbcompare.run(arch)
    assert [s.event for s in stops] == [e.name for e in gdbcompare.events_for(arch)]
    for stop in stops:
        assert stop.refused is None, stop.summary()
        without, with_unwind = stop.counts
        assert with_unwind == len(stop.kernel), stop.to_json()  # every frame of the kernel's own, in order
        assert without <= with_unwind
