"""x86-64: the ORC unwinder (``arch/x86/kernel/unwind_orc.c``)."""

from unwind import registry

from .backend import X86_64Backend

registry.register(X86_64Backend())
