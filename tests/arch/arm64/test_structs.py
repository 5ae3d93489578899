"""The arm64 layouts, per generation, and the dump's BTF offsets overriding them."""

from __future__ import annotations

from unwind.arch.arm64 import structs as S


def test_sizes_and_offsets_per_generation():
    assert S.FRAME_RECORD_SIZE == 16 and S.FRAME_RECORD_META_SIZE == 24
    old, new = S.pt_regs_layout(False), S.pt_regs_layout(True)
    assert (old.size, old.stackframe, old.pc, old.pstate, old.reg(29), old.reg(30)) == (336, 304, 256, 264, 232, 240)
    assert (new.size, new.stackframe) == (336, 296)
    raw = bytearray(336)
    raw[256:264] = (0xFFFF800080012345).to_bytes(8, "little")
    raw[312:320] = (S.FRAME_META_TYPE_PT_REGS).to_bytes(8, "little")
    regs = S.pt_regs_v6_13.parse(bytes(raw))
    assert regs.pc == 0xFFFF800080012345 and regs.stackframe.type == S.FRAME_META_TYPE_PT_REGS
    assert S.pt_regs_v6_12.parse(bytes(raw)).stackframe == [0, S.FRAME_META_TYPE_PT_REGS]


def test_dump_offsets_win_nested_or_flat():
    assert S.pt_regs_layout(True, {"pt_regs": {"stackframe": "0x130", "size": 352}}).stackframe == 0x130
    flat = S.pt_regs_layout(False, {"pt_regs.stackframe": 296, "sizeof(pt_regs)": "0x150"})
    assert (flat.stackframe, flat.size, flat.pc) == (296, 0x150, 256) and "dump offsets" in flat.source
    assert S.pt_regs_layout(True, {"task_struct.stack": 32}) == S.pt_regs_layout(True)
