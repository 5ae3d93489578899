"""arm64: kunwind frame records (``arch/arm64/kernel/stacktrace.c``)."""

from unwind.core import registry

# the backend's modules are imported when a dump of this arch first asks for it
registry.register_lazy("arm64", ("aarch64",), "EM_AARCH64", "unwind.arch.arm64.backend:Arm64Backend", e_machine=183)
