"""VMCOREINFO: the kernel's ``KEY=VALUE`` note, read with every number bounded.

``kernel/vmcore_info.c`` writes ``OSRELEASE=``, ``PAGESIZE=``, ``SYMBOL(name)=%lx``,
``NUMBER(name)=%ld``, ``OFFSET(s.m)=%lu``, ``SIZE(s)=%lu``, ``LENGTH(a)=%lu``,
``KERNELOFFSET=%lx`` and per-arch lines (``NUMBER(KERNELPACMASK)=0x%llx``). Numbers
are read only through :func:`vmcoreinfo_number`; at open, a numeric entry that does not
parse within its bound is dropped with a warning, so a walk never sees it.
"""

from __future__ import annotations

from typing import Callable, Mapping

U64_MAX = 2**64 - 1
#: the kernel's VMCOREINFO_BYTES is one page; more than this is not a VMCOREINFO note
MAX_VMCOREINFO_BYTES = 64 * 1024
#: bounds of the VMCOREINFO numbers replay reads; any other numeric entry is an i64 or u64
VMCOREINFO_BOUNDS: dict[str, tuple[int, int]] = {
    "PAGESIZE": (4096, 65536),
    "NUMBER(VA_BITS)": (32, 64),
    "NUMBER(TCR_EL1_T1SZ)": (0, 64),
    "NUMBER(KERNELPACMASK)": (0, U64_MAX),
    "NUMBER(MODULES_VADDR)": (0, U64_MAX),
    "NUMBER(MODULES_END)": (0, U64_MAX),
    "NUMBER(VMALLOC_START)": (0, U64_MAX),
    "NUMBER(VMALLOC_END)": (0, U64_MAX),
    "NUMBER(VMEMMAP_START)": (0, U64_MAX),
    "NUMBER(VMEMMAP_END)": (0, U64_MAX),
    "NUMBER(PAGE_OFFSET)": (0, U64_MAX),
    "NUMBER(phys_ram_base)": (0, U64_MAX),
    "KERNELOFFSET": (0, U64_MAX),
}
_DEFAULT_BOUND = (-(2**63), U64_MAX)
#: entries the kernel prints in hex without ``0x`` (``SYMBOL(x)=%lx``, ``KERNELOFFSET=%lx``)
_BARE_HEX = ("SYMBOL(", "KERNELOFFSET", "PHYS_OFFSET")
_NUMERIC = ("NUMBER(", "SYMBOL(", "OFFSET(", "SIZE(", "LENGTH(", "PAGESIZE", "KERNELOFFSET", "PHYS_OFFSET")
#: longer than any 64-bit number in any base the kernel prints (guards int() against huge input)
_MAX_DIGITS = 24


def _bound_text(key: str) -> str:
    lo, hi = VMCOREINFO_BOUNDS.get(key, _DEFAULT_BOUND)
    return f"not a number in [{lo}, {hi:#x}]"


def vmcoreinfo_number(vmcoreinfo: Mapping[str, str], key: str) -> int | None:
    """The number VMCOREINFO holds under ``key`` (``NUMBER(VA_BITS)``, ``SYMBOL(x)``, ``PAGESIZE``),
    within its bound (:data:`VMCOREINFO_BOUNDS`); ``None`` when absent or malformed.

    ``NUMBER()``/``OFFSET()``/``SIZE()``/``LENGTH()`` are decimal (``%ld``/``%lu``) or ``0x`` hex;
    ``SYMBOL()`` and ``KERNELOFFSET`` are bare hex (``%lx``).
    """
    raw = vmcoreinfo.get(key)
    if raw is None:
        return None
    text = raw.strip()
    if not 0 < len(text) <= _MAX_DIGITS:
        return None
    try:
        if key.startswith(_BARE_HEX):
            value = int(text, 16)
        elif text.lower().lstrip("-").startswith("0x"):
            value = int(text, 16)
        else:
            value = int(text, 10)
    except ValueError:
        return None
    lo, hi = VMCOREINFO_BOUNDS.get(key, _DEFAULT_BOUND)
    return value if lo <= value <= hi else None


def vmcoreinfo_text(raw: bytes, warn: Callable[[str], None]) -> str:
    """The note's text, at most :data:`MAX_VMCOREINFO_BYTES` of it."""
    if len(raw) > MAX_VMCOREINFO_BYTES:
        warn(f"VMCOREINFO is {len(raw)} bytes: only the first {MAX_VMCOREINFO_BYTES} are read")
        raw = raw[:MAX_VMCOREINFO_BYTES]
    return raw.decode("ascii", "replace")


def parse_vmcoreinfo(text: str, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """``KEY=VALUE`` lines; a numeric entry that does not parse within its bound is dropped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().rstrip("\0")
    for key in [k for k in out if k.startswith(_NUMERIC)]:
        if vmcoreinfo_number(out, key) is None:
            if warn is not None:
                warn(f"VMCOREINFO {key}={out[key][:40]!r} dropped: {_bound_text(key)}")
            del out[key]
    return out
