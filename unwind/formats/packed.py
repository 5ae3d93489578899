"""A construct declaration of fixed-size fields as a ``struct.Struct``, for records read entry by entry.

Program-header tables, page descriptors and BTF records are read thousands of times; the
``struct`` format is derived from the one construct declaration, so the
layout is still written once.
"""

from __future__ import annotations

import struct

from construct import Bytes, Const, FormatField, Renamed, Struct


def packed(decl: Struct) -> struct.Struct:
    """The ``struct`` format of a construct ``Struct`` made only of integer fields of one byte order (and
    constant byte strings of a fixed length, such as an ELF header's ``e_ident``: read as bytes, unchecked)."""
    orders, codes = set(), []
    for sub in decl.subcons:
        field = sub.subcon if isinstance(sub, Renamed) else sub
        if isinstance(field, Const) and isinstance(field.subcon, Bytes) and isinstance(field.subcon.length, int):
            codes.append(f"{field.subcon.length}s")
            continue
        if not isinstance(field, FormatField) or field.fmtstr[0] not in "<>":
            raise TypeError(f"{sub.name}: not a fixed-size integer field")
        orders.add(field.fmtstr[0])
        codes.append(field.fmtstr[1:])
    if len(orders) > 1:
        raise TypeError("fields of both byte orders")
    return struct.Struct(orders.pop() + "".join(codes))
