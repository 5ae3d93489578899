"""RISC-V: the s0 frame-pointer walk (``arch/riscv/kernel/stacktrace.c``)."""

from unwind import registry

from .backend import RiscvBackend

registry.register(RiscvBackend())
