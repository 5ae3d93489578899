"""Opening a vmcore: its format detected by magic, every parser's exception made one :class:`VmcoreError`."""

from __future__ import annotations

import zlib
from pathlib import Path

from construct import ConstructError
from elftools.common.exceptions import ELFError

from unwind.core.errors import DumpError
from .diskdump import DISKDUMP_SIGNATURE, KDUMP_SIGNATURE, DiskDump
from .elf import ElfVmcore
from .errors import VmcoreError
from .flattened import MDF_SIGNATURE, FlatError, FlatSource, is_flattened
from .notes import NoteError
from .physmem import DEFAULT_CACHE_BYTES, PhysicalMemory
from .source import XZ_MAGIC, FileSource, Source, SourceTruncated, XzError, XzSource

ELF_MAGIC = b"\x7fELF"
_MAGICS = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2",
           b"\x04\x22\x4d\x18": "lz4"}


#: what each format's first bytes are
_SIGNATURES = (ELF_MAGIC, KDUMP_SIGNATURE, MDF_SIGNATURE + bytes(4))


def _kind(head: bytes) -> str | None:
    if head.startswith(ELF_MAGIC):
        return "elf"
    if head.startswith(KDUMP_SIGNATURE):
        return "kdump"
    return None


def _sniff(path: str) -> tuple[str, Source]:
    """The format and a source over the (reassembled) file."""
    try:
        src: Source = FileSource(path)
    except OSError as e:
        raise VmcoreError(f"cannot read {path}: {e.strerror or e}") from None
    head = src.pread(0, min(src.size, 16))
    if head.startswith(XZ_MAGIC):  # decompressed once, then read as the file inside (docs/vmcore.md)
        src.close()
        try:
            src = XzSource(path)
        except XzError as e:
            raise VmcoreError(f"{path}: xz-compressed: {e}") from None
        except OSError as e:
            raise VmcoreError(f"cannot read {path}: {e.strerror or e}") from None
        head = src.pread(0, min(src.size, 16))
        if not is_flattened(head) and _kind(head) is None:
            src.close()
            raise VmcoreError(f"{path}: xz-compressed, but what it holds is not a vmcore "
                              f"(magic {head[:8].hex() or 'none'})")
    if is_flattened(head):
        src = FlatSource(src)  # type: ignore[arg-type]
        inner = _kind(src.pread(0, min(src.size, 8)))
        if inner is None:
            raise VmcoreError(f"{path}: flattened file whose content is neither ELF nor kdump-compressed")
        return f"flattened-{inner}", src
    kind = _kind(head)
    if kind is not None:
        return kind, src
    src.close()
    if head.startswith(DISKDUMP_SIGNATURE):
        raise VmcoreError(f"{path}: an old DISKDUMP file (pre-kdump diskdump); only KDUMP files are read")
    for magic, name in _MAGICS.items():
        if head.startswith(magic):
            raise VmcoreError(f"{path}: the file is {name}-compressed; decompress it first")
    if len(head) < 16 and any(sig.startswith(head) or head.startswith(sig) for sig in _SIGNATURES):
        raise VmcoreError(f"{path}: truncated: {len(head)} bytes, too short for any vmcore header")
    raise VmcoreError(f"{path}: not a vmcore (unknown magic {head[:8].hex()})")


def detect_format(path: str | Path) -> str:
    """``"elf"``, ``"kdump"``, ``"flattened-elf"`` or ``"flattened-kdump"``; :class:`VmcoreError` otherwise."""
    fmt, src = _guarded(str(path), _sniff)
    src.close()
    return fmt


def open_vmcore(path: str | Path, cache_bytes: int = DEFAULT_CACHE_BYTES) -> PhysicalMemory:
    """Open a vmcore of any supported format; every problem with the file is one :class:`VmcoreError`."""
    p = str(path)

    def build(p: str) -> PhysicalMemory:
        fmt, src = _sniff(p)
        try:
            if fmt.endswith("elf"):
                return ElfVmcore(p, src, fmt, cache_bytes)
            return DiskDump(p, src, fmt, cache_bytes)
        except BaseException:
            src.close()
            raise

    return _guarded(p, build)


def is_vmcore(path: str | Path) -> bool:
    """True for a vmcore this package reads, False for anything else (the project's own dumps included).

    The project's dumps are ELF cores too; their ``UNWIND`` note tells them apart.
    """
    try:
        with open_vmcore(path, cache_bytes=0) as vm:
            return not any(n.name == "UNWIND" for n in vm.notes)
    except VmcoreError:
        return False


def _guarded(path: str, fn):  # type: ignore[no-untyped-def]
    """Run ``fn(path)``, turning every parser's exception into one :class:`VmcoreError` line."""
    try:
        return fn(path)
    except VmcoreError:
        raise
    except DumpError as e:  # VMCOREINFO's own checks name no file
        raise VmcoreError(f"{path}: {e}") from None
    except SourceTruncated as e:
        raise VmcoreError(f"{path}: truncated: {e}") from None
    except (FlatError, NoteError) as e:
        raise VmcoreError(f"{path}: {e}") from None
    except (ELFError, ConstructError, zlib.error, ValueError, KeyError, TypeError, UnicodeDecodeError,
            OverflowError, MemoryError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise VmcoreError(f"{path}: malformed vmcore: {msg}") from None
    except OSError as e:
        raise VmcoreError(f"{path}: read error: {e.strerror or e}") from None
