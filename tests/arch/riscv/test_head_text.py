"""A real riscv 7.2 dump whose frame chain reaches head.S's ``_start_kernel``, as the boot hart's idle task's does.

``_start_kernel`` (``arch/riscv/kernel/head.S``) calls ``start_kernel()`` from ``.head.text``, which the linker
script puts before ``_stext``. ``walk_stackframe()`` tests each pc first, ``if (!__kernel_text_address(pc))
break;``, and ``__kernel_text_address()`` counts only ``[_stext, _etext)``, init text and modules: the walk
ends at that return address without printing it, as at any end of a chain. The dump is a committed capture
with one return address changed to one inside ``_start_kernel``.
"""

from __future__ import annotations

import lzma
from pathlib import Path


from tests.elf_offsets import file_offset
from unwind import Options, Session
from unwind.cli.main import main
from unwind.core.walk import StopReason

ROOT = Path(__file__).resolve().parents[3]
DUMP = ROOT / "corpora" / "riscv" / "7.2.13+deb14-riscv64" / "stop-000-random.bin.xz"
IMAGE = next(DUMP.parent.glob("vmlinux-*.slim.xz"))
PID = 2  # kthreadd, blocked in schedule()


def test_chain_into_head_text_ends_cleanly_unprinted(tmp_path, capsys) -> None:
    plain = tmp_path / "plain.bin"
    plain.write_bytes(lzma.decompress(DUMP.read_bytes()))
    s = Session.load(plain, vmlinux=IMAGE)
    task = next(t for t in s.select(every=True) if t.pid == PID)
    frames = s.replay(task, Options()).frames
    start, stext, entry = (s.symbols.address(n) for n in ("_start", "_stext", "_start_kernel"))
    assert start is not None and stext is not None and entry is not None and start <= entry < stext
    ret = entry + 0x100  # a return address in _start_kernel, below _stext
    # frames[2]'s pc is the ra of the record {fp, ra} at frames[1]'s fp - 16
    raw = bytearray(plain.read_bytes())
    at = file_offset(plain, frames[1].fp - 8)
    assert int.from_bytes(raw[at:at + 8], "little") == frames[2].pc
    raw[at:at + 8] = ret.to_bytes(8, "little")
    bad = tmp_path / "head.bin"
    bad.write_bytes(bytes(raw))
    s2 = Session.load(bad, vmlinux=IMAGE)
    r = s2.replay(next(t for t in s2.select(every=True) if t.pid == PID), Options())
    assert [f.pc for f in r.frames] == [f.pc for f in frames[:2]]
    assert r.stop.reason is StopReason.END_OF_STACK and r.stop.clean and not r.stop.truncated
    assert f"{ret:#x} (_start_kernel+0x100)" in r.stop.detail and ".head.text" in r.stop.detail
    capsys.readouterr()
    assert main(["replay", "--task", str(PID), "--vmlinux", str(IMAGE), str(bad)]) == 0
    out = capsys.readouterr().out
    assert "_start_kernel" not in out.split("-- stop:")[0]


VMCORE = ROOT / "corpora" / "riscv" / "6.12.117+deb13-riscv64" / "vmcore" / "stop-001-random.elf.xz"
VMCORE_IMAGE = next(VMCORE.parent.parent.glob("vmlinux-*.slim.xz"))


def test_idle_tasks_of_a_real_vmcore_end_in_head_text(capsys) -> None:
    """The 6.12 vmcore's idle tasks: the boot hart's chain ends in _start_kernel (it called start_kernel()),
    a secondary hart's in secondary_start_sbi (smp_callin() was called from .head.text): both unprinted,
    clean ends; the last line each prints is the C function head.S called."""
    s = Session.load(VMCORE, vmlinux=VMCORE_IMAGE)
    start, stext = s.symbols.address("_start"), s.symbols.address("_stext")
    assert start is not None and stext is not None
    idle = {t.comm: t for t in s.select(every=True) if t.pid == 0}
    for comm, last, entry in (("swapper/0", "start_kernel", "_start_kernel"),
                              ("swapper/1", "smp_callin", "secondary_start_sbi")):
        r = s.replay(idle[comm], Options())
        assert r.frames[-1].symbol.startswith(last + "+")
        assert r.stop.reason is StopReason.END_OF_STACK and r.stop.clean
        ret = int(r.stop.detail.split()[0], 16)
        assert start <= ret < stext and f"({entry}+" in r.stop.detail
    capsys.readouterr()
    assert main(["replay", "--all", "--vmlinux", str(VMCORE_IMAGE), str(VMCORE)]) == 0
    assert "(ERROR)" not in capsys.readouterr().out
