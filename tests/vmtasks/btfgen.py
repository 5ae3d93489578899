"""The test BTF writer (``tests.btfbuild``) with the base types the synthetic kernels use added first."""

from __future__ import annotations

from tests import btfbuild


class BtfBuilder(btfbuild.BtfBuilder):
    """``long``, ``unsigned int``, ``char`` and ``void *`` come first, as attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.long = self.int("long", 8)
        self.u32 = self.int("unsigned int", 4)
        self.char = self.int("char", 1)
        self.voidp = self.ptr(0)
