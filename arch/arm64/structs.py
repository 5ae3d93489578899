"""Every arm64 kernel layout the unwinder reads, declared once with construct.

- ``struct frame_record`` (``asm/stacktrace/frame.h``, and the bare ``{fp, lr}``
  pair of v6.12): two words at x29.
- ``struct frame_record_meta`` (v6.13+): a record whose ``fp``/``lr`` are zero,
  plus a ``type`` word (``FRAME_META_TYPE_*``).
- ``struct pt_regs`` (``asm/ptrace.h``): v6.12 keeps ``u64 stackframe[2]`` at
  304; v6.13+ keeps a ``frame_record_meta`` at 296. Both are 336 bytes.

Code asks :class:`PtRegsLayout` for offsets and sizes; a dump may override
them (``meta["offsets"]``, taken from the guest's BTF by the capture), since
later kernels add and remove members (``por_el1``, ``lockdep_hardirqs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from construct import Array, Int32sl, Int32ul, Int64ul, Struct

from unwind.layout import offsetof

# asm/stacktrace/frame.h
FRAME_META_TYPE_NONE = 0
FRAME_META_TYPE_FINAL = 1
FRAME_META_TYPE_PT_REGS = 2

frame_record = Struct(
    "fp" / Int64ul,
    "lr" / Int64ul,
)

frame_record_meta = Struct(
    "record" / frame_record,
    "type" / Int64ul,
)

_user_pt_regs = (
    "regs" / Array(31, Int64ul),
    "sp" / Int64ul,
    "pc" / Int64ul,
    "pstate" / Int64ul,
)

# v6.12 arch/arm64/include/asm/ptrace.h (little-endian)
pt_regs_v6_12 = Struct(
    *_user_pt_regs,
    "orig_x0" / Int64ul,
    "syscallno" / Int32sl,
    "unused2" / Int32ul,
    "sdei_ttbr1" / Int64ul,
    "pmr_save" / Int64ul,
    "stackframe" / Array(2, Int64ul),
    "lockdep_hardirqs" / Int64ul,
    "exit_rcu" / Int64ul,
)

# v6.13+ arch/arm64/include/asm/ptrace.h (c2c6b27b5aa1 "unwind exception boundaries")
pt_regs_v6_13 = Struct(
    *_user_pt_regs,
    "orig_x0" / Int64ul,
    "syscallno" / Int32sl,
    "pmr" / Int32ul,
    "sdei_ttbr1" / Int64ul,
    "stackframe" / frame_record_meta,
    "lockdep_hardirqs" / Int64ul,
    "exit_rcu" / Int64ul,
)

#: PSR_MODE_MASK and PSR_MODE_EL0t (``asm/ptrace.h``): user_mode(regs)
PSR_MODE_MASK = 0xF
PSR_MODE_EL0T = 0x0
#: PSR_MODE32_BIT: an AArch32 (compat, hence user) context
PSR_MODE32_BIT = 0x10


@dataclass(frozen=True, slots=True)
class PtRegsLayout:
    """Where the unwinder finds things in a ``struct pt_regs``, and its size."""

    size: int
    regs: int
    pc: int
    pstate: int
    stackframe: int
    source: str

    def reg(self, n: int) -> int:
        """Offset of ``regs[n]``."""
        return self.regs + 8 * n


@lru_cache(maxsize=2)
def _defaults(meta_records: bool) -> PtRegsLayout:
    layout = pt_regs_v6_13 if meta_records else pt_regs_v6_12
    return PtRegsLayout(size=layout.sizeof(), regs=offsetof(layout, "regs"), pc=offsetof(layout, "pc"),
                        pstate=offsetof(layout, "pstate"), stackframe=offsetof(layout, "stackframe"),
                        source="v6.13+ defaults" if meta_records else "v6.12 defaults")


def _num(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


def pt_regs_layout(meta_records: bool, offsets: Mapping[str, Any] | None = None) -> PtRegsLayout:
    """The ``pt_regs`` layout of a generation, overridden by the dump's offsets.

    ``offsets`` (the dump's ``meta["offsets"]``) may be nested,
    ``{"pt_regs": {"stackframe": 296, "size": 336, ...}}``, or flat,
    ``{"pt_regs.stackframe": 296, "sizeof(pt_regs)": 336}``; values are ints
    or hex strings. Missing members keep the generation's default.
    """
    base = _defaults(meta_records)
    if not offsets:
        return base
    nested = offsets.get("pt_regs") if isinstance(offsets.get("pt_regs"), Mapping) else {}

    def pick(field: str, *flat: str) -> int | None:
        for key in (field, f"__{field}__"):
            got = _num(nested.get(key)) if nested else None
            if got is not None:
                return got
        for key in flat:
            got = _num(offsets.get(key))
            if got is not None:
                return got
        return None

    values = {
        "size": pick("size", "sizeof(pt_regs)", "pt_regs.size", "pt_regs.__size__"),
        "regs": pick("regs", "pt_regs.regs"),
        "pc": pick("pc", "pt_regs.pc"),
        "pstate": pick("pstate", "pt_regs.pstate"),
        "stackframe": pick("stackframe", "pt_regs.stackframe"),
    }
    found = {k: v for k, v in values.items() if v is not None}
    if not found:
        return base
    return PtRegsLayout(
        size=found.get("size", base.size), regs=found.get("regs", base.regs), pc=found.get("pc", base.pc),
        pstate=found.get("pstate", base.pstate), stackframe=found.get("stackframe", base.stackframe),
        source=f"dump offsets ({', '.join(sorted(found))}), else {base.source}")


FRAME_RECORD_SIZE = frame_record.sizeof()
FRAME_RECORD_META_SIZE = frame_record_meta.sizeof()
