"""The note and NT_PRSTATUS readers a dump's open uses, on notes built so their contents are known."""

from __future__ import annotations

import struct

import pytest

from unwind.formats import elfcore
from unwind.formats.vmcore.notes import NoteError, parse_notes


def test_notes_read_back_with_their_padding():
    # names and descriptors of every length modulo 4, so each pads differently
    made = [("CORE", elfcore.NT_PRSTATUS, b"\x01\x02\x03"), ("VMCOREINFO", 0, b"OSRELEASE=6.12\n\0"),
            ("UNWIND", 0x554e5744, b'{"a":1}'), ("X", 7, b"")]
    data = b"".join(elfcore.note(n, t, d) for n, t, d in made)
    notes = parse_notes(data + bytes(12) + elfcore.note("AFTER", 1, b"z"))  # an all-zero header ends the segment
    assert [(n.name, n.type, n.desc) for n in notes] == made


def test_a_note_past_its_segment_is_refused():
    data = elfcore.note("CORE", elfcore.NT_PRSTATUS, b"12345")  # 5 bytes of descriptor, padded to 8
    assert parse_notes(data)[0].desc == b"12345"
    for cut in (len(data) - 1, len(data) - 4, 12 + 3):
        with pytest.raises(NoteError, match="runs past its segment"):
            parse_notes(data[:cut])


def test_pr_reg_sits_at_112_bytes_on_lp64():
    # include/linux/elfcore.h: elf_siginfo (3 ints, 12) + pr_cursig (2) + pad (2) + pr_sigpend, pr_sighold (16)
    # + pr_pid, pr_ppid, pr_pgrp, pr_sid (16) + four struct __kernel_old_timeval (64) = 112
    regs = [0x1111 * (i + 1) for i in range(27)]
    raw = elfcore.prstatus_bytes(len(regs), regs, pid=42)
    offset, fmt = elfcore.prstatus_regs_format(len(regs))
    assert offset == 112
    assert list(fmt.unpack_from(raw, offset)) == regs
    assert struct.unpack_from("<I", raw, 32)[0] == 42  # pr_pid after the 32 bytes before it
