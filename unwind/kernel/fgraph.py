"""The function-graph tracer's return stack as an unwinder reads it: ``kernel/trace/fgraph.c``.

``function_graph_enter()`` replaces a traced function's return address with
``return_to_handler`` and pushes the original on the task's return stack with
``retp``, where the hijacked address is kept. ``ftrace_graph_ret_addr()``
gives an unwinder the original back, keyed by ``retp``. What ``retp`` is
depends on the arch (the frame record on arm64, ``&frame->ra`` on riscv, the
stack slot on x86-64): each arch's walk passes its own.

Two layouts of the return stack are followed:

- **v6.1-v6.10**: ``task->ret_stack`` is an array of ``struct ftrace_ret_stack``
  up to ``curr_ret_stack``; the search scans up from the bottom and ignores
  ``idx``.
- **v6.11+** ("function_graph: Convert ret_stack to a series of longs"): a
  shadow stack of longs; the search walks down from ``*idx`` (the top when 0),
  skips the entries a tail call left (their ``ret`` is ``return_to_handler``)
  and leaves the place found in ``*idx``.

``entries`` are the task's ret_stack entries as the dump stores them, bottom to
top (:class:`~unwind.core.target.FgraphEntry`); an entry's index stands for its
offset on the stack.
"""

from __future__ import annotations

from typing import Sequence

from unwind.core.target import FgraphEntry

#: the first kernel whose return stack is the shadow stack of longs, searched down from ``*idx``
#: ("function_graph: Convert ret_stack to a series of longs", v6.11)
FGRAPH_IDX_SINCE = (6, 11)


def fgraph_idx(version: tuple[int, int] | None) -> bool:
    """Does kernel ``version`` search its return stack down from ``*idx`` (v6.11+)? Unknown: the newest."""
    return version is None or version >= FGRAPH_IDX_SINCE


# ftrace_graph_ret_addr() in kernel/trace/fgraph.c
def ftrace_graph_ret_addr(entries: Sequence[FgraphEntry], idx: int, ret: int, retp: int, return_handler: int,
                          by_idx: bool) -> tuple[int, int, int]:
    """The original return address of ``ret`` when it is ``return_handler``: ``(ret, idx, entry)``.

    ``idx`` is the caller's ``*idx`` (0 starts at the top) and comes back as the
    kernel leaves it; ``entry`` is the index of the entry used, -1 when none was
    (``ret`` comes back unchanged, as in the kernel). ``by_idx`` selects the
    v6.11+ layout (:func:`fgraph_idx`), else v6.1's.
    """
    if ret != return_handler:
        return ret, idx, -1
    if by_idx:
        return ret_addr_from_shadow_stack(entries, idx, ret, retp, return_handler)
    return ret_addr_from_ret_stack(entries, idx, ret, retp)


# ftrace_graph_ret_addr() in v6.11+ kernel/trace/fgraph.c: the walk down the shadow stack
def ret_addr_from_shadow_stack(entries: Sequence[FgraphEntry], idx: int, ret: int, retp: int,
                               return_handler: int) -> tuple[int, int, int]:
    """``i = *idx ?: curr_ret_stack``, then down through ``get_ret_stack()``: the first entry keyed by
    ``retp`` whose ``ret`` is not ``return_handler`` (a tail call's); found, ``*idx`` is its place.

    The bottom entry sits at offset 0, so finding it makes the next search start at the top again,
    as in the kernel.
    """
    i = idx or len(entries)
    while i > 0:
        i -= 1  # get_ret_stack(task, i, &i): the entry below offset i
        rs = entries[i]
        if rs.retp == retp and rs.ret != return_handler:
            return rs.ret, i, i
    return ret, idx, -1


# ftrace_graph_ret_addr() in v6.1 kernel/trace/fgraph.c (HAVE_FUNCTION_GRAPH_RET_ADDR_PTR)
def ret_addr_from_ret_stack(entries: Sequence[FgraphEntry], idx: int, ret: int,
                            retp: int) -> tuple[int, int, int]:
    """``for (i = 0; i <= curr_ret_stack; i++)``: the first entry from the bottom keyed by ``retp``;
    ``*idx`` is not used."""
    for i, rs in enumerate(entries):
        if rs.retp == retp:
            return rs.ret, idx, i
    return ret, idx, -1
