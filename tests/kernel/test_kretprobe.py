"""kretprobe_find_ret_addr() / rethook_find_ret_addr() on instance lists whose answers are known by
construction (the kernel's loops applied by hand; the list is newest first, -1 is NULL)."""

from __future__ import annotations

from unwind.core.target import KretprobeInstance
from unwind.kernel.kretprobe import kretprobe_find_ret_addr, rethook_find_ret_addr

TR = 0xFFFF800080099990  # the trampoline


def test_cursor_moves_past_each_instance():
    inst = [KretprobeInstance(TR, 0x10), KretprobeInstance(0xA, 0x10), KretprobeInstance(0xB, 0x20)]
    assert kretprobe_find_ret_addr(inst, 0x10, -1, TR) == (0xA, 1)  # the trampoline's own entry skipped
    assert kretprobe_find_ret_addr(inst, 0x20, 1, TR) == (0xB, 2)
    assert kretprobe_find_ret_addr(inst, 0x10, 1, TR)[0] == 0       # behind the cursor: not found


def test_a_miss_leaves_cur_at_the_last_instance_passed():
    """kretprobe_find_ret_addr(): *cur moves over every non-trampoline node tried, and stays there on a miss."""
    inst = [KretprobeInstance(0xA, 0x10), KretprobeInstance(0xB, 0x20), KretprobeInstance(TR, 0x30)]
    assert kretprobe_find_ret_addr(inst, 0x99, -1, TR) == (0, 1)
    assert kretprobe_find_ret_addr(inst, 0x20, 1, TR) == (0, 1)     # so a later search finds nothing
    assert kretprobe_find_ret_addr([], 0x10, -1, TR) == (0, -1)


def test_rethook_is_the_same_walk():
    inst = [KretprobeInstance(0xA, 0x10), KretprobeInstance(TR, 0x20), KretprobeInstance(0xC, 0x20)]
    assert rethook_find_ret_addr(inst, 0x20, -1, TR) == (0xC, 2)
    assert rethook_find_ret_addr(inst, 0x10, -1, TR) == (0xA, 0)
