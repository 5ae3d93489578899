"""Which kernel's code a walk follows: the version ``--generation`` or the dump's release names.

Each arch's walk subclasses :class:`KernelGeneration` with what changes in its
own code between the trees it follows; what generic kernel code changes
(``kernel/trace/fgraph.c``'s return stack) is here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from unwind.core.target import Target, kernel_version


#: the oldest kernel whose unwinders the arch walks follow (the trees read: 6.1, 6.12, 7.x)
OLDEST_FOLLOWED = (6, 1)


def kernel_generation(target: Target) -> tuple[tuple[int, int] | None, str]:
    """``(major, minor)`` the walk follows and where it came from.

    ``target.options.generation`` (``--generation``) wins over the dump's
    kernel release; ``None`` when neither parses.
    """
    for value, origin in ((target.options.generation, "--generation"), (target.release, "kernel release")):
        version = kernel_version(value)
        if version is not None:
            return version, f"{origin} {value}"
    return None, "no kernel release"


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelGeneration:
    """The kernel a walk follows, and why."""

    #: the kernel version followed, when one is known
    version: tuple[int, int] | None
    #: v6.11+: ftrace_graph_ret_addr() walks the shadow stack down from ``*idx``; before, it scans
    #: ``ret_stack[]`` up from the bottom (:func:`unwind.kernel.fgraph.fgraph_idx`)
    fgraph_idx: bool
    why: str
