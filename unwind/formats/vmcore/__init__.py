"""Real crash dumps (vmcores): physical memory, VMCOREINFO, and kernel virtual memory over them.

Physical memory and notes come out of every format drgn and crash open.

:func:`open_vmcore` detects the format by magic and returns a
:class:`PhysicalMemory`:

- ELF (kdump ``/proc/vmcore``, QEMU ``dump-guest-memory`` with or without ``-p``, ``makedumpfile -E``);
- kdump-compressed (makedumpfile ``-c/-l/-p/-z``, QEMU ``-z/-l/-s``), codecs zlib, lzo, snappy, zstd;
- the flattened form of either (``makedumpfile -F``, QEMU 7.2 ``-z``), read in place;
- any of these xz-compressed (decompressed once at open, see :class:`~.source.XzSource`).

Opening reads headers, notes and (for kdump-compressed files) the bitmaps;
pages are read when asked for. A file cut short is read for what it holds
(``PhysicalMemory.damage`` says what it lacks; a read past the cut raises
:class:`~.errors.TruncatedFault`). Kernel virtual memory over it is
:class:`unwind.formats.vmcore.virtual.VirtualMemory`. See ``docs/vmcore.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unwind.lazy import lazy_exports

if TYPE_CHECKING:
    from .diskdump import DiskDump
    from .elf import ElfVmcore
    from .errors import CorruptPageFault, ExcludedPageFault, TruncatedFault, VmcoreError
    from .notes import Note, PrStatus
    from .opening import detect_format, is_vmcore, open_vmcore
    from .physmem import Damage, PhysicalMemory, PhysRange, VirtualLoad

__all__ = [
    "open_vmcore", "detect_format", "is_vmcore", "PhysicalMemory", "PhysRange", "VirtualLoad", "Note",
    "PrStatus", "VmcoreError", "ExcludedPageFault", "CorruptPageFault", "TruncatedFault", "Damage", "ElfVmcore",
    "DiskDump",
]
#: each public name and the module that defines it: imported on first use (PEP 562), so that what
#: needs only :mod:`.vmcoreinfo` or :mod:`.virtual` (a dump's replay) does not load the file readers
_FROM = {
    "opening": ("open_vmcore", "detect_format", "is_vmcore"),
    "physmem": ("PhysicalMemory", "PhysRange", "VirtualLoad", "Damage"),
    "notes": ("Note", "PrStatus"),
    "errors": ("VmcoreError", "ExcludedPageFault", "CorruptPageFault", "TruncatedFault"),
    "elf": ("ElfVmcore",),
    "diskdump": ("DiskDump",),
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _FROM)
