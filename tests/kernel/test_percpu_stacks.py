"""The two ways arm64 and riscv keep per-CPU stacks, and each arch's list, over a reader whose per-CPU
memory is laid out by hand."""

from __future__ import annotations

from unwind.arch.arm64.kernel import percpu_stacks as arm64_percpu_stacks
from unwind.arch.riscv.kernel import percpu_stacks as riscv_percpu_stacks
from unwind.kernel.percpu_stacks import percpu_stack_array, percpu_stack_ptr

THREAD_SIZE = 0x4000
OFFSET = 0x10000  # __per_cpu_offset[1]


class Reader:
    """Symbols at fixed addresses, cpu1's copies at +OFFSET; words written by the test."""

    thread_size = THREAD_SIZE

    def __init__(self, symbols: dict[str, int], words: dict[int, int], sizes: dict[str, int]) -> None:
        self.symbols, self.words, self.sizes = symbols, words, sizes

    def symbol(self, name: str) -> int | None:
        return self.symbols.get(name)

    def var_size(self, name: str) -> int:
        return self.sizes.get(name, 0)

    def percpu_addr(self, name: str, cpu: int) -> int:
        return self.symbols[name] + OFFSET * cpu

    def read_u64(self, addr: int) -> int:
        return self.words.get(addr, 0)


def test_pointer_and_array():
    k = Reader({"irq_stack_ptr": 0x1000, "overflow_stack": 0x2000}, {0x1000 + OFFSET: 0x80000}, {})
    assert percpu_stack_ptr(k, "irq_stack_ptr", 1, "irq") == [("irq", 0x80000, 0x80000 + THREAD_SIZE)]
    assert percpu_stack_ptr(k, "irq_stack_ptr", 0, "irq") == []  # NULL: not allocated
    assert percpu_stack_array(k, "overflow_stack", 1, "overflow", 4096) == [("overflow", 0x12000, 0x13000)]
    k.sizes["overflow_stack"] = 0x2000  # BTF's VAR size wins over the default
    assert percpu_stack_array(k, "overflow_stack", 0, "overflow", 4096) == [("overflow", 0x2000, 0x4000)]
    assert percpu_stack_array(k, "no_such_stack", 0, "overflow", 4096) == []


def test_each_arch_lists_its_stacks():
    syms = {"irq_stack_ptr": 0x1000, "overflow_stack": 0x2000, "sdei_stack_critical_ptr": 0x3000}
    k = Reader(syms, {0x1000: 0x80000, 0x3000: 0x90000}, {})
    assert arm64_percpu_stacks(k, 0) == [("irq", 0x80000, 0x84000), ("overflow", 0x2000, 0x3000),
                                         ("sdei_critical", 0x90000, 0x94000)]
    assert riscv_percpu_stacks(k, 0) == [("irq", 0x80000, 0x84000), ("overflow", 0x2000, 0x3000)]
    del syms["irq_stack_ptr"]  # riscv without CONFIG_IRQ_STACKS
    assert riscv_percpu_stacks(k, 0) == [("overflow", 0x2000, 0x3000)]
