"""How gdb's walk is counted against the kernel's own trace of the same stop (unwind.lab.gdbcompare)."""

from __future__ import annotations

from unwind.lab.gdbcompare import matched


def test_matched_counts_from_the_kernels_first_frame_in_order() -> None:
    kernel = [0x10, 0x20, 0x30, 0x40]
    assert matched(kernel, [0x1, 0x2, 0x10, 0x20, 0x30, 0x40, 0x50]) == 4  # the tracer's own frames above
    assert matched(kernel, [0x10, 0x20, 0x99, 0x40]) == 2  # a wrong frame ends the count
    assert matched(kernel, [0x1, 0x20, 0x30]) == 0  # the kernel's first frame never reached
    assert matched(kernel, [0x10, 0x20]) == 2 and matched([], [0x10]) == 0
