"""ftrace_graph_ret_addr() of kernel/trace/fgraph.c, per layout, on return stacks whose answers are known by
construction (each entry's ret names the entry; the kernel's loops applied by hand)."""

from __future__ import annotations

from unwind.core.target import FgraphEntry
from unwind.kernel.fgraph import fgraph_idx, ftrace_graph_ret_addr

RTH = 0xFFFF800080012340  # return_to_handler


def test_not_hijacked_comes_back_unchanged():
    stack = [FgraphEntry(0xA0, 0x100)]
    for by_idx in (True, False):
        assert ftrace_graph_ret_addr(stack, 0, 0x1234, 0x100, RTH, by_idx) == (0x1234, 0, -1)


def test_shadow_stack_walks_down_from_idx_and_skips_tail_calls():
    """v6.11+: from *idx (0: the top) down; an entry whose ret is return_to_handler (a tail call's) is skipped;
    *idx becomes the place found."""
    stack = [FgraphEntry(0xA0, 0x100), FgraphEntry(RTH, 0x200), FgraphEntry(0xA2, 0x200), FgraphEntry(0xA3, 0x300)]
    assert ftrace_graph_ret_addr(stack, 0, RTH, 0x300, RTH, True) == (0xA3, 3, 3)     # from the top
    assert ftrace_graph_ret_addr(stack, 3, RTH, 0x200, RTH, True) == (0xA2, 2, 2)     # below the last hit
    assert ftrace_graph_ret_addr(stack, 2, RTH, 0x300, RTH, True) == (RTH, 2, -1)     # already passed
    assert ftrace_graph_ret_addr(stack, 0, RTH, 0x999, RTH, True) == (RTH, 0, -1)     # retp mismatch
    # finding the bottom entry (offset 0) sets *idx = 0: the next search starts at the top again
    assert ftrace_graph_ret_addr(stack, 1, RTH, 0x100, RTH, True) == (0xA0, 0, 0)
    assert ftrace_graph_ret_addr(stack, 0, RTH, 0x300, RTH, True) == (0xA3, 3, 3)


def test_tail_call_entry_above_its_real_one():
    """Two entries keyed by one slot: the top one holds return_to_handler, the real return is below it."""
    stack = [FgraphEntry(0xA, 0x100), FgraphEntry(0xB, 0x200), FgraphEntry(RTH, 0x200), FgraphEntry(0xC, 0x300)]
    assert ftrace_graph_ret_addr(stack, 0, RTH, 0x200, RTH, True) == (0xB, 1, 1)
    assert ftrace_graph_ret_addr(stack, 1, RTH, 0x300, RTH, True) == (RTH, 1, -1)  # above idx: not found


def test_ret_stack_array_scans_up_and_ignores_idx():
    """v6.1: for (i = 0; i <= curr_ret_stack; i++) the first retp match; *idx is neither read nor written."""
    stack = [FgraphEntry(0xA0, 0x100), FgraphEntry(0xA1, 0x200), FgraphEntry(0xA2, 0x200), FgraphEntry(0xA3, 0x300)]
    assert ftrace_graph_ret_addr(stack, 0, RTH, 0x200, RTH, False) == (0xA1, 0, 1)  # the lowest of two
    assert ftrace_graph_ret_addr(stack, 1, RTH, 0x300, RTH, False) == (0xA3, 1, 3)  # above *idx: still found
    assert ftrace_graph_ret_addr(stack, 2, RTH, 0x999, RTH, False) == (RTH, 2, -1)
    assert ftrace_graph_ret_addr([], 0, RTH, 0x100, RTH, False) == (RTH, 0, -1)     # curr_ret_stack < 0


def test_layout_by_version():
    assert not fgraph_idx((6, 1)) and not fgraph_idx((6, 10))
    assert fgraph_idx((6, 11)) and fgraph_idx((6, 12)) and fgraph_idx((7, 2))
    assert fgraph_idx(None)  # unknown: the newest
