"""The Cython class decorators the compiled modules use, for when Cython is not installed.

A compiled module (:data:`unwind.accel.MODULES`) imports ``cython``, which Cython reads at compile time;
interpreted, that is Cython's own ``cython`` module where Cython is installed, and this one where it is not.
Each decorator returns the class unchanged, as Cython's does in an interpreted module.
"""

from __future__ import annotations

from typing import TypeVar

_C = TypeVar("_C", bound=type)

#: ``cython.compiled``: ``True`` in a compiled module (Cython sets it), ``False`` interpreted
compiled = False


def cclass(cls: _C) -> _C:
    """``@cython.cclass``: an extension type when compiled (as the module's ``.pxd`` declares it too)."""
    return cls


def no_gc(cls: _C) -> _C:
    """``@cython.no_gc``: left to reference counting, untracked by the cyclic collector, when compiled."""
    return cls
