"""Every x86-64 kernel layout the ORC unwinder reads, declared once with construct.

- ``orc_entry`` for each format generation (``arch/x86/include/asm/orc_types.h``
  over its generations): 6 bytes, ``s16 sp_offset; s16 bp_offset;``
  then a little-endian ``u16`` of bitfields numbered from the least
  significant bit.
- ``struct pt_regs`` (``arch/x86/include/asm/ptrace.h``), 168 bytes.
- ``struct inactive_task_frame`` (``arch/x86/include/asm/switch_to.h``), 56 bytes.

Code asks these declarations for sizes, offsets and bit positions
(:func:`~unwind.kernel.layout.offsetof`, :func:`flag_bits`) instead of repeating numbers.
"""

from __future__ import annotations

from construct import BitsInteger, BitStruct, ByteSwapped, Construct, Flag, Int16sl, Int64ul, Padding, Struct

from unwind.kernel.layout import offsetof, table_layout

# The u16 of bitfields: construct's BitStruct reads most significant bit
# first, so the little-endian u16 is byte-swapped and the fields are listed
# from bit 15 down to bit 0.

#: v1, v4.14 (ee9f8fce9964) .. v6.2: sp_reg:4 bp_reg:4 type:2 end:1 (bit 11 unused)
ORC_FLAGS_V1 = ByteSwapped(BitStruct(
    Padding(4, pattern=b"\0"),
    "unused" / BitsInteger(1),
    "end" / Flag,
    "type" / BitsInteger(2),
    "bp_reg" / BitsInteger(4),
    "sp_reg" / BitsInteger(4),
))

#: v2, v6.3 (ffb1b4a41016 "Add 'signal' field"): sp_reg:4 bp_reg:4 type:2 signal:1 end:1
ORC_FLAGS_V2 = ByteSwapped(BitStruct(
    Padding(4, pattern=b"\0"),
    "end" / Flag,
    "signal" / Flag,
    "type" / BitsInteger(2),
    "bp_reg" / BitsInteger(4),
    "sp_reg" / BitsInteger(4),
))

#: v3, v6.4 (fb799447ae29) .. v7.0, and v4 (v7.1, registers renumbered): sp_reg:4 bp_reg:4 type:3 signal:1
ORC_FLAGS_V3 = ByteSwapped(BitStruct(
    Padding(4, pattern=b"\0"),
    "signal" / Flag,
    "type" / BitsInteger(3),
    "bp_reg" / BitsInteger(4),
    "sp_reg" / BitsInteger(4),
))

#: the flags layout of each generation (v4 shares v3's bits)
ORC_FLAGS: dict[int, Construct] = {1: ORC_FLAGS_V1, 2: ORC_FLAGS_V2, 3: ORC_FLAGS_V3, 4: ORC_FLAGS_V3}


def orc_entry(version: int) -> Struct:
    """``struct orc_entry`` of format generation ``version`` (1..4)."""
    return Struct("sp_offset" / Int16sl, "bp_offset" / Int16sl, "flags" / ORC_FLAGS[version])


ORC_ENTRY_SIZE = orc_entry(3).sizeof()  # 6


def flag_bits(version: int, name: str) -> tuple[int, int]:
    """``(shift, mask)`` of bitfield ``name`` in the flags ``u16`` of ``version``.

    Found by building a flags word with only that field at its maximum, so
    the numpy decoder follows the construct declaration and nothing else.
    """
    layout = ORC_FLAGS[version]
    subcons = [sub for sub in layout.subcon.subcon.subcons if sub.name]
    probe: dict[str, int] = {sub.name: 0 for sub in subcons}
    sub = next(s for s in subcons if s.name == name)
    probe[name] = 1 if sub.subcon is Flag else (1 << sub.subcon.length) - 1
    word = int.from_bytes(layout.build(probe), "little")
    shift = (word & -word).bit_length() - 1
    return shift, word >> shift


PT_REGS = Struct(
    "r15" / Int64ul, "r14" / Int64ul, "r13" / Int64ul, "r12" / Int64ul, "bp" / Int64ul, "bx" / Int64ul,
    "r11" / Int64ul, "r10" / Int64ul, "r9" / Int64ul, "r8" / Int64ul, "ax" / Int64ul, "cx" / Int64ul,
    "dx" / Int64ul, "si" / Int64ul, "di" / Int64ul, "orig_ax" / Int64ul,
    # the IRET frame starts here (IRET_FRAME_OFFSET)
    "ip" / Int64ul, "cs" / Int64ul, "flags" / Int64ul, "sp" / Int64ul, "ss" / Int64ul,
)

INACTIVE_TASK_FRAME = Struct(
    "r15" / Int64ul, "r14" / Int64ul, "r13" / Int64ul, "r12" / Int64ul, "bx" / Int64ul, "bp" / Int64ul,
    "ret_addr" / Int64ul,
)


#: the members of ``struct pt_regs`` and ``struct inactive_task_frame`` the walk reads
PT_REGS_MEMBERS = ("r10", "r13", "di", "dx", "ax", "bp", "ip", "cs", "sp")
INACTIVE_TASK_FRAME_MEMBERS = ("bp", "ret_addr")
#: the tables (both structs are the same in the 6.1, 6.12 and 7.2 trees; 6.12+ wraps cs/ss in unions)
PT_REGS_TABLE = table_layout("pt_regs", PT_REGS, PT_REGS_MEMBERS, "6.1-7.2 table (168 bytes)")
INACTIVE_TASK_FRAME_TABLE = table_layout("inactive_task_frame", INACTIVE_TASK_FRAME, INACTIVE_TASK_FRAME_MEMBERS,
                                         "6.1-7.2 table (56 bytes)")

#: every member of ``struct inactive_task_frame`` (``--regs``), and their table
INACTIVE_TASK_FRAME_ALL = tuple(sub.name for sub in INACTIVE_TASK_FRAME.subcons)
INACTIVE_TASK_FRAME_FULL_TABLE = table_layout("inactive_task_frame", INACTIVE_TASK_FRAME, INACTIVE_TASK_FRAME_ALL,
                                              "6.1-7.2 table (56 bytes)")

PT_REGS_SIZE = PT_REGS.sizeof()                                  # 168
IRET_FRAME_OFFSET = offsetof(PT_REGS, "ip")                  # 128, unwind.h
IRET_FRAME_SIZE = PT_REGS_SIZE - IRET_FRAME_OFFSET               # 40
INACTIVE_TASK_FRAME_SIZE = INACTIVE_TASK_FRAME.sizeof()          # 56
