"""Helpers for kernel struct layouts declared with construct."""

from __future__ import annotations

from construct import Struct


def offsetof(struct: Struct, member: str) -> int:
    """``offsetof()``: the byte offset of a top-level member of a struct of fixed-size members."""
    off = 0
    for sub in struct.subcons:
        if sub.name == member:
            return off
        off += sub.sizeof()
    raise KeyError(f"no member {member!r}")
