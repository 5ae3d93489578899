"""Per-CPU stacks kept the two ways arm64 and riscv keep them, read through a
:class:`~unwind.kernel.model.KernelReader`: a per-CPU pointer to a stack of THREAD_SIZE
(``irq_stack_ptr``, the SDEI stacks), and a per-CPU array that is the stack (``overflow_stack``).

Each arch's ``percpu_stacks()`` names its variables and sizes; each range is ``(kind, low, high)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unwind.kernel.model import KernelReader


# DECLARE_PER_CPU(unsigned long *, irq_stack_ptr): init_irq_stacks() allocates a THREAD_SIZE stack per CPU
def percpu_stack_ptr(k: "KernelReader", name: str, cpu: int, kind: str) -> list[tuple[str, int, int]]:
    """The stack ``per_cpu(name, cpu)`` points to, THREAD_SIZE long; none while the pointer is NULL."""
    p = k.read_u64(k.percpu_addr(name, cpu))
    return [(kind, p, p + k.thread_size)] if p else []


# DEFINE_PER_CPU(unsigned long [OVERFLOW_STACK_SIZE / sizeof(long)], overflow_stack)
def percpu_stack_array(k: "KernelReader", name: str, cpu: int, kind: str,
                       default_size: int) -> list[tuple[str, int, int]]:
    """``per_cpu(name, cpu)`` itself as a stack, its size from BTF (else ``default_size``); none when the
    kernel has no such variable."""
    if k.symbol(name) is None:
        return []
    base = k.percpu_addr(name, cpu)
    return [(kind, base, base + (k.var_size(name) or default_size))]
