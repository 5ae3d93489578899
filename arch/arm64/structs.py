"""Every arm64 kernel layout the unwinder reads, declared once with construct.

- ``struct frame_record`` (``asm/stacktrace/frame.h``, and the bare ``{fp, lr}``
  pair of v6.12): two words at x29.
- ``struct frame_record_meta`` (v6.13+): a record whose ``fp``/``lr`` are zero,
  plus a ``type`` word (``FRAME_META_TYPE_*``).
- ``struct pt_regs`` (``asm/ptrace.h``), three layouts:

  ========  =========================================  =====  ==========
  kernels   stackframe                                  size   source read
  ========  =========================================  =====  ==========
  ..6.12    ``u64 stackframe[2]`` at 304                336    6.1, 6.12 trees
  6.13..    ``struct frame_record_meta`` at 296         336    v6.17 tree
  6.18..    the same, ``lockdep_hardirqs``/``exit_rcu``  320    7.2 tree
            removed (generic entry)
  ========  =========================================  =====  ==========

These are the *table*: a walk takes the layout from the image's BTF, the
dump's ``offsets`` or the stacks first (:func:`unwind.kernel.layout.resolve_layout`). The 6.18 boundary is from
opentelemetry-ebpf-profiler PR #1094 (commit ee776d68ba47, v6.18-rc1); only
the 6.1, 6.12 and 7.2 trees were read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from construct import Array, Int32sl, Int32ul, Int64ul, Struct

from unwind.kernel.layout import StructLayout, offsetof, table_layout

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

# arch/arm64/include/uapi/asm/ptrace.h: struct user_pt_regs, the head of every struct pt_regs
user_pt_regs = Struct(*_user_pt_regs)
#: where ``sp`` follows ``regs[31]``: its offset from ``regs``
USER_PT_REGS_SP = offsetof(user_pt_regs, "sp") - offsetof(user_pt_regs, "regs")

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

_pt_regs_v6_13_head = (
    *_user_pt_regs,
    "orig_x0" / Int64ul,
    "syscallno" / Int32sl,
    "pmr" / Int32ul,
    "sdei_ttbr1" / Int64ul,
    "stackframe" / frame_record_meta,
)

# v6.13+ arch/arm64/include/asm/ptrace.h (c2c6b27b5aa1 "unwind exception boundaries")
pt_regs_v6_13 = Struct(
    *_pt_regs_v6_13_head,
    "lockdep_hardirqs" / Int64ul,
    "exit_rcu" / Int64ul,
)

# v6.18+ (7.2 arch/arm64/include/asm/ptrace.h): the generic entry code keeps the irq/RCU state elsewhere
pt_regs_v6_18 = Struct(*_pt_regs_v6_13_head)

#: PSR_MODE_MASK and PSR_MODE_EL0t (``asm/ptrace.h``): user_mode(regs)
PSR_MODE_MASK = 0xF
PSR_MODE_EL0T = 0x0
#: PSR_MODE32_BIT: an AArch32 (compat, hence user) context
PSR_MODE32_BIT = 0x10


#: the members of ``struct pt_regs`` the walk reads
PT_REGS_MEMBERS = ("regs", "pc", "pstate", "stackframe")


@dataclass(frozen=True, slots=True)
class PtRegsLayout:
    """Where the unwinder finds things in a ``struct pt_regs``, its size, and where that came from."""

    size: int
    regs: int
    pc: int
    pstate: int
    stackframe: int
    source: str

    def reg(self, n: int) -> int:
        """Offset of ``regs[n]``."""
        return self.regs + 8 * n

    def describe(self) -> str:
        """``struct pt_regs: 320 bytes, stackframe at 296, from btf: the image's .BTF``."""
        return f"struct pt_regs: {self.size} bytes, stackframe at {self.stackframe}, from {self.source}"

    @classmethod
    def of(cls, layout: StructLayout) -> "PtRegsLayout":
        """The hot-path form of a resolved :class:`~unwind.kernel.layout.StructLayout`."""
        return cls(size=layout.size, regs=layout["regs"], pc=layout["pc"], pstate=layout["pstate"],
                   stackframe=layout["stackframe"], source=f"{layout.source}: {layout.detail}")


#: the first kernel with frame_record_meta (c2c6b27b5aa1, v6.13)
META_RECORDS_SINCE = (6, 13)

#: (first kernel, pt_regs declaration, what it is), newest first
PT_REGS_TABLE: tuple[tuple[tuple[int, int], Struct, str], ...] = (
    ((6, 18), pt_regs_v6_18, "v6.18+ table (generic entry: 320 bytes)"),
    ((6, 13), pt_regs_v6_13, "v6.13-v6.17 table (frame_record_meta, 336 bytes)"),
    ((0, 0), pt_regs_v6_12, "v6.12 and older table (u64 stackframe[2], 336 bytes)"),
)


@lru_cache(maxsize=16)
def pt_regs_table(version: tuple[int, int] | None, meta_records: bool) -> StructLayout:
    """The table's ``struct pt_regs`` for a kernel version with (or without) meta records.

    The newest layout of that kind the version has reached; with no version
    (or one older than every layout of that kind), the oldest of that kind.
    """
    kind = [row for row in PT_REGS_TABLE if (row[0] >= META_RECORDS_SINCE) == meta_records]
    since, decl, what = next((row for row in kind if version is not None and version >= row[0]), kind[-1])
    return table_layout("pt_regs", decl, PT_REGS_MEMBERS, what)


FRAME_RECORD_SIZE = frame_record.sizeof()
FRAME_RECORD_META_SIZE = frame_record_meta.sizeof()
