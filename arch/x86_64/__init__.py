"""x86-64: the ORC unwinder (``arch/x86/kernel/unwind_orc.c``)."""

from unwind.core import registry

# the backend's modules are imported when a dump of this arch first asks for it
registry.register_lazy("x86_64", ("x86", "x86-64", "amd64"), "EM_X86_64", "unwind.arch.x86_64.backend:X86_64Backend",
                       e_machine=62)
