"""A real arm64 dump whose frame record holds a garbage return address above ``_end``.

The kernel's ``%pS`` prints such an address bare: ``is_ksym_addr()`` is false past ``_end``, so
``kallsyms_lookup()`` finds no symbol. The dump is a committed capture with one word changed.
"""

from __future__ import annotations

import lzma
from pathlib import Path


from tests.elf_offsets import file_offset
from unwind import Options, Session

ROOT = Path(__file__).resolve().parents[3]
DUMP = ROOT / "corpora" / "arm64" / "6.12.117+deb13-arm64" / "stop-002-irq-arch_timer_handler_virt.bin.xz"
GARBAGE = 0xFFFF8FFFFFFFF3C0  # a kernel address far above _end


def test_return_address_past_end_prints_bare(tmp_path) -> None:
    plain = tmp_path / "plain.bin"
    plain.write_bytes(lzma.decompress(DUMP.read_bytes()))
    s = Session.load(plain, vmlinux=next(DUMP.parent.glob("vmlinux-*.slim.xz")))
    task = next(t for t in s.select(every=True) if not t.running)
    frames = s.replay(task, Options()).frames
    # frames[2]'s pc is the return address stored at frames[1]'s fp + 8 (the frame record's lr)
    slot = frames[1].fp + 8
    end = s.symbols.address("_end")
    assert end is not None and GARBAGE > end
    raw = bytearray(plain.read_bytes())
    at = file_offset(plain, slot)
    raw[at:at + 8] = GARBAGE.to_bytes(8, "little")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw))
    s2 = Session.load(bad, vmlinux=next(DUMP.parent.glob("vmlinux-*.slim.xz")))
    task2 = next(t for t in s2.select(every=True) if t.pid == task.pid)
    got = s2.replay(task2, Options()).frames
    assert [f.pc for f in got[:2]] == [f.pc for f in frames[:2]]
    assert got[2].pc == GARBAGE and got[2].symbol == hex(GARBAGE)
