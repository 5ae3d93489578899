"""RISC-V: the s0 frame-pointer walk (``arch/riscv/kernel/stacktrace.c``)."""

from unwind.core import registry

# the backend's modules are imported when a dump of this arch first asks for it
registry.register_lazy("riscv", ("riscv64",), "EM_RISCV", "unwind.arch.riscv.backend:RiscvBackend", e_machine=243)
