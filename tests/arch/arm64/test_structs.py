"""The arm64 layouts, per generation, and the dump's BTF offsets overriding them."""

from __future__ import annotations

from unwind.arch.arm64 import structs as S


def test_sizes_and_offsets_per_generation():
    assert S.FRAME_RECORD_SIZE == 16 and S.FRAME_RECORD_META_SIZE == 24
    old, new = S.PtRegsLayout.of(S.pt_regs_table((6, 12), False)), S.PtRegsLayout.of(S.pt_regs_table((6, 13), True))
    assert (old.size, old.stackframe, old.pc, old.pstate, old.reg(29), old.reg(30)) == (336, 304, 256, 264, 232, 240)
    assert (new.size, new.stackframe) == (336, 296)
    raw = bytearray(336)
    raw[256:264] = (0xFFFF800080012345).to_bytes(8, "little")
    raw[312:320] = (S.FRAME_META_TYPE_PT_REGS).to_bytes(8, "little")
    regs = S.pt_regs_v6_13.parse(bytes(raw))
    assert regs.pc == 0xFFFF800080012345 and regs.stackframe.type == S.FRAME_META_TYPE_PT_REGS
    assert S.pt_regs_v6_12.parse(bytes(raw)).stackframe == [0, S.FRAME_META_TYPE_PT_REGS]


def test_the_table_per_version():
    def size(version, meta):
        return S.pt_regs_table(version, meta).size

    assert size((6, 1), False) == size((6, 12), False) == 336
    assert size((6, 13), True) == size((6, 17), True) == 336
    assert size((6, 18), True) == size((7, 2), True) == 320  # 7.2 asm/ptrace.h: ends at stackframe
    assert S.pt_regs_table((7, 2), True)["stackframe"] == 296 == S.pt_regs_v6_18.sizeof() - 24
    assert size((6, 12), True) == 336 and size(None, True) == 336 and size((7, 2), False) == 336
