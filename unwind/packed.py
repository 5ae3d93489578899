"""A construct declaration of fixed-size fields as a ``struct.Struct``, for records read entry by entry.

Program-header tables, page descriptors and BTF records are read thousands of times; the
``struct`` format is derived from the one construct declaration, so the
layout is still written once.
"""

from __future__ import annotations

import struct

from construct import FormatField, Renamed, Struct


def packed(decl: Struct) -> struct.Struct:
    """The ``struct`` format of a construct ``Struct`` made only of integer fields of one byte order."""
    orders, codes = set(), []
    for sub in decl.subcons:
        field = sub.subcon if isinstance(sub, Renamed) else sub
        if not isinstance(field, FormatField) or field.fmtstr[0] not in "<>":
            raise TypeError(f"{sub.name}: not a fixed-size integer field")
        orders.add(field.fmtstr[0])
        codes.append(field.fmtstr[1:])
    if len(orders) > 1:
        raise TypeError("fields of both byte orders")
    return struct.Struct(orders.pop() + "".join(codes))
