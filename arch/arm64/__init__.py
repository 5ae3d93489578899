"""arm64: kunwind frame records (``arch/arm64/kernel/stacktrace.c``)."""

from unwind import registry

from .backend import Arm64Backend

registry.register(Arm64Backend())
