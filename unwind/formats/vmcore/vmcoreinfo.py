"""The VMCOREINFO note: ``KEY=VALUE`` lines the kernel writes for dump readers.

``kernel/vmcore_info.c`` (``kernel/crash_core.c`` before 6.8) and each arch's
``arch_crash_save_vmcoreinfo()`` print the lines. ``SYMBOL(x)`` and
``KERNELOFFSET`` are hex without ``0x``; ``NUMBER(x)`` is signed decimal from
``VMCOREINFO_NUMBER`` but arch code often prints ``0x%lx``; both are accepted.

Every number is parsed with a bound: a bad value is one :class:`DumpError`
line, never a ``ValueError`` or an unbounded integer reaching a shift.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from unwind.core.errors import DumpError

#: ``VMCOREINFO_BYTES`` is one page; 64 KiB pages bound it from above
MAX_TEXT = 1 << 16
#: the longest number a 64-bit kernel prints: 16 hex digits or 20 decimal ones, a sign and ``0x``
_MAX_DIGITS = 24
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]{1,16}")
_DEC = re.compile(r"-?[0-9]{1,20}")
_ELF_NOTE_NAME = b"VMCOREINFO\0"
_U64_MAX = (1 << 64) - 1
#: bounds of the numbers replay reads (:meth:`VmcoreInfo.bounded`); any other number is an i64 or u64
BOUNDS: dict[str, tuple[int, int]] = {
    "PAGESIZE": (4096, 65536),
    "NUMBER(VA_BITS)": (32, 64),
    "NUMBER(TCR_EL1_T1SZ)": (0, 64),
    "NUMBER(KERNELPACMASK)": (0, _U64_MAX),
    "NUMBER(MODULES_VADDR)": (0, _U64_MAX),
    "NUMBER(MODULES_END)": (0, _U64_MAX),
    "NUMBER(VMALLOC_START)": (0, _U64_MAX),
    "NUMBER(VMALLOC_END)": (0, _U64_MAX),
    "NUMBER(VMEMMAP_START)": (0, _U64_MAX),
    "NUMBER(VMEMMAP_END)": (0, _U64_MAX),
    "NUMBER(PAGE_OFFSET)": (0, _U64_MAX),
    "NUMBER(phys_ram_base)": (0, _U64_MAX),
}
_DEFAULT_BOUND = (-(1 << 63), _U64_MAX)
#: keys the kernel prints as bare hex (``SYMBOL(x)=%lx``, ``KERNELOFFSET=%lx``)
_HEX_KEYS = ("SYMBOL(", "KERNELOFFSET")
#: keys whose value is a number (the rest, ``OSRELEASE``, ``BUILD-ID``, ``CRASHTIME``..., are text)
_NUMBER_KEYS = ("NUMBER(", "OFFSET(", "SIZE(", "LENGTH(", "PAGESIZE", *_HEX_KEYS)
#: the text entries a dump is found and named by, in the form the kernel prints them:
#: ``OSRELEASE=%s`` of utsname's release (at most __NEW_UTS_LEN, 64, characters) and
#: ``BUILD-ID=%20phN`` (VMCOREINFO_BUILD_ID(): 20 bytes as 40 lower-case hex digits)
_TEXT_FORMATS = {"OSRELEASE": re.compile(r".{1,64}"), "BUILD-ID": re.compile(r"[0-9a-f]{40}")}


class VmcoreInfo(Mapping[str, str]):
    """The note's lines as a read-only mapping, with bounded number getters.

    Two of them are equal when their entries are. Those parsed from the same text the same way
    (:attr:`source`) are equal without comparing their entries: the dumps of one kernel carry the same
    note, and the batch compares theirs once per dump (:func:`unwind.session.batch.dump_inputs`)."""

    def __init__(self, entries: dict[str, str], source: tuple[str, bool] | None = None) -> None:
        self._entries = entries
        #: the text the entries were parsed from, and whether :meth:`checked` was applied (``None``: made
        #: from entries)
        self.source = source

    @classmethod
    def parse(cls, text: "str | bytes") -> "VmcoreInfo":
        """Parse the note's desc; a line without ``=`` is ignored, as makedumpfile does."""
        if isinstance(text, bytes):
            text = text.split(b"\0", 1)[0].decode("ascii", "replace")
        if len(text) > MAX_TEXT:
            raise DumpError(f"VMCOREINFO is {len(text)} bytes, more than the {MAX_TEXT} a kernel writes")
        entries: dict[str, str] = {}
        for line in text.splitlines():
            key, eq, value = line.partition("=")
            if eq and key:
                entries.setdefault(key.strip(), value.strip())
        return cls(entries, (text, False))

    def checked(self, warn: Callable[[str], None]) -> "VmcoreInfo":
        """A copy without the numeric entries that do not parse within their bound, nor the release
        and build-id when not in the kernel's form, each one reported through ``warn``: what is
        left never makes :meth:`bounded` fail."""
        kept: dict[str, str] = {}
        for key, value in self._entries.items():
            form = _TEXT_FORMATS.get(key)
            if form is not None and not form.fullmatch(value):
                shown = value if len(value) <= 2 * _MAX_DIGITS else value[:2 * _MAX_DIGITS] + "..."
                warn(f"VMCOREINFO {key}={shown!r} is not in the form the kernel prints: dropped")
                continue
            if key.startswith(_NUMBER_KEYS):
                try:
                    self._bounded(key)
                except DumpError as e:
                    warn(f"{e}: dropped")
                    continue
            kept[key] = value
        return VmcoreInfo(kept, None if self.source is None else (self.source[0], True))

    def _bounded(self, key: str) -> int | None:
        if key.startswith(_HEX_KEYS):
            return self.hex(key)
        return self.number(key, *BOUNDS.get(key, _DEFAULT_BOUND))

    def bounded(self, key: str) -> int | None:
        """The number under ``key`` in its syntax and within its bound (:data:`BOUNDS`);
        ``None`` when absent or malformed."""
        try:
            return self._bounded(key)
        except DumpError:
            return None

    def __getitem__(self, key: str) -> str:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, VmcoreInfo):
            return (self.source is not None and self.source == other.source) or self._entries == other._entries
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # as Mapping's

    def hex(self, key: str, bits: int = 64) -> int | None:
        """The hex value of ``key`` (``SYMBOL()``, ``KERNELOFFSET``), below ``1 << bits``; ``None`` if absent."""
        value = self._entries.get(key)
        if value is None:
            return None
        if not _HEX.fullmatch(value):
            raise DumpError(f"VMCOREINFO {key}={value[:_MAX_DIGITS]!r} is not a hex number")
        n = int(value, 16)
        if n >> bits:
            raise DumpError(f"VMCOREINFO {key}={value} does not fit in {bits} bits")
        return n

    def number(self, key: str, lo: int = -(1 << 63), hi: int = (1 << 64) - 1) -> int | None:
        """``NUMBER(x)`` and friends, decimal or ``0x`` hex, within ``[lo, hi]``; ``None`` if absent."""
        value = self._entries.get(key)
        if value is None:
            return None
        if value[:2] in ("0x", "0X") and _HEX.fullmatch(value):
            n = int(value, 16)
        elif _DEC.fullmatch(value):
            n = int(value)
        else:
            raise DumpError(f"VMCOREINFO {key}={value[:_MAX_DIGITS]!r} is not a number")
        if not lo <= n <= hi:
            raise DumpError(f"VMCOREINFO {key}={value} is outside [{lo:#x}, {hi:#x}]")
        return n

    def word(self, key: str) -> int | None:
        """A 64-bit kernel word printed either way: a negative decimal is taken modulo ``1 << 64``."""
        n = self.number(key)
        return None if n is None else n & ((1 << 64) - 1)

    def symbol(self, name: str) -> int | None:
        """``SYMBOL(name)``: the runtime address (KASLR applied), or ``None``."""
        return self.hex(f"SYMBOL({name})")


def vmcoreinfo_number(info: Mapping[str, str], key: str) -> int | None:
    """:meth:`VmcoreInfo.bounded` for any mapping of VMCOREINFO lines (a walk's ``Target.vmcoreinfo``)."""
    return (info if isinstance(info, VmcoreInfo) else VmcoreInfo(dict(info))).bounded(key)


def parse_vmcoreinfo_note(note: bytes) -> VmcoreInfo:
    """Parse a whole ELF note as ``vmcoreinfo_note`` holds it: header, ``"VMCOREINFO"``, desc.

    This is the layout ``append_elf_note()`` writes (``kernel/vmcore_info.c``):
    ``n_namesz``, ``n_descsz``, ``n_type`` as u32, the name padded to 4 bytes,
    then the desc.
    """
    if len(note) < 12 + 12:
        raise DumpError("the kernel's vmcoreinfo_note is truncated")
    namesz = int.from_bytes(note[0:4], "little")
    descsz = int.from_bytes(note[4:8], "little")
    if namesz != len(_ELF_NOTE_NAME) or note[12:12 + namesz] != _ELF_NOTE_NAME:
        raise DumpError("the kernel's vmcoreinfo_note does not hold a VMCOREINFO note")
    start = 12 + ((namesz + 3) & ~3)
    if descsz > MAX_TEXT or start + descsz > len(note):
        raise DumpError(f"the kernel's vmcoreinfo_note claims {descsz} bytes of text, more than it holds")
    return VmcoreInfo.parse(note[start:start + descsz])
