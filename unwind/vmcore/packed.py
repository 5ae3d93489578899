"""A construct declaration of fixed-size fields as a ``struct.Struct``, for tables read entry by entry.

Program-header tables and page descriptors are read thousands of times; the
``struct`` format is derived from the one construct declaration, so the
layout is still written once.
"""

from __future__ import annotations

import struct

from construct import FormatField, Renamed, Struct


def packed(decl: Struct) -> struct.Struct:
    """The ``struct`` format of a construct ``Struct`` made only of little-endian integer fields."""
    codes = []
    for sub in decl.subcons:
        field = sub.subcon if isinstance(sub, Renamed) else sub
        if not isinstance(field, FormatField) or not field.fmtstr.startswith("<"):
            raise TypeError(f"{sub.name}: not a little-endian integer field")
        codes.append(field.fmtstr[1:])
    return struct.Struct("<" + "".join(codes))
