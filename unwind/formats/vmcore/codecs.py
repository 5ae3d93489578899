"""Page codecs of kdump-compressed files (makedumpfile ``diskdump_mod.h`` DUMP_DH_COMPRESSED_*).

zlib is the standard library's; lzo1x comes from ``lzokay``, raw snappy and
zstd frames from ``cramjam`` (pure wheels, no C library needed; see
``docs/vmcore.md``). Every decoder returns exactly the page or raises
:class:`CodecError`.
"""

from __future__ import annotations

import zlib
from typing import Callable

DUMP_DH_COMPRESSED_ZLIB = 0x1
DUMP_DH_COMPRESSED_LZO = 0x2
DUMP_DH_COMPRESSED_SNAPPY = 0x4
DUMP_DH_COMPRESSED_INCOMPLETE = 0x8
DUMP_DH_EXCLUDED_VMEMMAP = 0x10
DUMP_DH_COMPRESSED_ZSTD = 0x20

#: codec flag -> name, in the order makedumpfile tests them
CODEC_NAMES = {
    DUMP_DH_COMPRESSED_ZLIB: "zlib",
    DUMP_DH_COMPRESSED_LZO: "lzo",
    DUMP_DH_COMPRESSED_SNAPPY: "snappy",
    DUMP_DH_COMPRESSED_ZSTD: "zstd",
}
CODEC_MASK = sum(CODEC_NAMES)


class CodecError(ValueError):
    """The stored bytes do not decode to one page."""


def _zlib(data: bytes, size: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(data, size)
    if not d.eof:
        raise CodecError("zlib stream does not end within one page")
    return out


def _lzo(data: bytes, size: int) -> bytes:
    import lzokay

    return bytes(lzokay.decompress(data, size))


def _snappy(data: bytes, size: int) -> bytes:
    import cramjam

    if cramjam.snappy.decompress_raw_len(data) != size:
        raise CodecError("snappy length is not one page")
    return bytes(cramjam.snappy.decompress_raw(data))


def _zstd(data: bytes, size: int) -> bytes:
    import cramjam

    out = bytearray(size)  # a fixed buffer: a frame that decodes to more fails
    n = cramjam.zstd.decompress_into(data, out)
    return bytes(out[:n])


_DECODERS: dict[int, Callable[[bytes, int], bytes]] = {
    DUMP_DH_COMPRESSED_ZLIB: _zlib,
    DUMP_DH_COMPRESSED_LZO: _lzo,
    DUMP_DH_COMPRESSED_SNAPPY: _snappy,
    DUMP_DH_COMPRESSED_ZSTD: _zstd,
}


def decompress_page(flag: int, data: bytes, size: int) -> bytes:
    """The page of ``size`` bytes that codec ``flag`` stored as ``data``."""
    try:
        decode = _DECODERS[flag]
    except KeyError:
        raise CodecError(f"unknown compression flags {flag:#x}") from None
    try:
        out = decode(data, size)
    except CodecError:
        raise
    except ImportError as e:
        raise CodecError(f"{CODEC_NAMES[flag]} pages need the {e.name} package") from None
    except Exception as e:  # each library raises its own types: zlib.error, lzokay's, cramjam's
        raise CodecError(f"{CODEC_NAMES[flag]}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if len(out) != size:
        raise CodecError(f"{CODEC_NAMES[flag]} page decodes to {len(out)} bytes, not {size}")
    return out
