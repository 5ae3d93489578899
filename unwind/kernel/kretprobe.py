"""kretprobe and rethook return-address recovery: ``kernel/kprobes.c``, ``kernel/trace/rethook.c``.

A kretprobe (or any rethook user) replaces a probed function's return address
with a trampoline and keeps the original in an instance on a per-task list,
newest first, keyed by a frame the arch chooses at the hijack (``ri->fp`` /
``rhn->frame``: the caller's frame pointer on arm64 and riscv, the stack slot
on x86-64). An unwinder meeting the trampoline asks for the original by that
frame, resuming after the instance it found last (``*cur``).

Which function the kernel calls depends on its configuration, not on the
search: ``kretprobe_find_ret_addr()`` walks ``task->kretprobe_instances``, and
with ``CONFIG_KRETPROBE_ON_RETHOOK`` (x86-64 from v5.19, arm64 and riscv where
the rethook trampoline is built) it is ``rethook_find_ret_addr()`` over
``task->rethooks``: the same walk.

``instances`` are the task's instances as the dump stores them, newest first
(:class:`~unwind.core.target.KretprobeInstance`); ``cur`` is the index of the
list node ``*cur`` points at, -1 for ``NULL`` (start at the list's head).
"""

from __future__ import annotations

from typing import Sequence

from unwind.core.target import KretprobeInstance


# __kretprobe_find_ret_addr() in kernel/kprobes.c (__rethook_find_ret_addr() in kernel/trace/rethook.c)
def __kretprobe_find_ret_addr(instances: Sequence[KretprobeInstance], cur: int,
                              trampoline: int) -> tuple[int, int]:
    """The next instance after ``cur`` whose ``ret_addr`` is not the trampoline: ``(ret, cur)``;
    ``(0, cur)`` when none is left (``*cur`` unchanged)."""
    node = cur + 1
    while node < len(instances):
        ret = instances[node].ret
        if ret != trampoline:
            return ret, node
        node += 1
    return 0, cur


# kretprobe_find_ret_addr() in kernel/kprobes.c
def kretprobe_find_ret_addr(instances: Sequence[KretprobeInstance], fp: int, cur: int,
                            trampoline: int) -> tuple[int, int]:
    """The original return address of the instance keyed by ``fp``: ``(ret, cur)``, ``ret`` 0 when none is.

    Every instance passed on the way moves ``cur``, as ``*cur`` moves in the kernel.
    """
    while True:
        ret, cur = __kretprobe_find_ret_addr(instances, cur, trampoline)
        if not ret or instances[cur].fp == fp:
            return ret, cur


# rethook_find_ret_addr() in kernel/trace/rethook.c
def rethook_find_ret_addr(nodes: Sequence[KretprobeInstance], frame: int, cur: int,
                          trampoline: int) -> tuple[int, int]:
    """The original return address of the rethook node keyed by ``frame``: ``(ret, cur)``, ``ret`` 0 when
    none is. The walk is :func:`kretprobe_find_ret_addr`'s, over ``task->rethooks``."""
    return kretprobe_find_ret_addr(nodes, frame, cur, trampoline)
