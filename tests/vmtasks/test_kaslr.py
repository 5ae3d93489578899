"""A KASLR kernel: the image seen at runtime addresses walks and prints as the unrelocated one does."""

from __future__ import annotations

from unwind import Options, StopReason
from unwind.arch.x86_64.synth import END_OF_STACK, OrcBuilder, call
from unwind.kernel.kaslr import RelocatedImage, relocate_symbols
from unwind.session.replay import Session
from unwind.dev.synth import SynthDump
from unwind.core.walk import collect

TASK_LO, STACK = 0xFFFFC90000010000, 0x4000
SLIDE = 0x2A00000


def _kernel() -> OrcBuilder:
    b = OrcBuilder()
    b.func("__schedule", 0x200, (0, call(16)))
    b.func("schedule", 0x40, (0, call(8)))
    b.func("kthread", 0x100, (0, call(8)))
    b.func("ret_from_fork", 0x40, (0, call(8)))
    b.func("ret_from_fork_asm", 0x20, (0, END_OF_STACK))
    return b


def _session(b: OrcBuilder, slide: int) -> Session:
    sd = SynthDump("x86_64", "6.12.0-synthetic")
    st = sd.stack("task", TASK_LO, STACK, pid=7)
    tsp = TASK_LO + 0x3000
    st.put(tsp, 15, 14, 13, 12, 11, 0xB0B0, b.addr["__schedule"] + 0x50 + slide)  # inactive_task_frame
    sp = tsp + 56
    for size, ret in [(16, b.addr["schedule"] + 0x10), (8, b.addr["kthread"] + 0x30),
                      (8, b.addr["ret_from_fork"] + 0x10), (8, b.addr["ret_from_fork_asm"] + 0x8)]:
        st.put(sp + size - 8, ret + slide)
        sp += size
    sd.blocked_task(7, "worker", {"sp": tsp})
    image = b.image(3)
    if slide:
        return Session(sd.dump(), RelocatedImage(image, slide), relocate_symbols(image.symbols, slide))  # type: ignore[arg-type]
    return Session(sd.dump(), image, image.symbols)  # type: ignore[arg-type]


def test_the_relocated_image_walks_the_runtime_addresses() -> None:
    b = _kernel()
    plain, moved = _session(b, 0), _session(b, SLIDE)
    r0 = plain.replay(plain.select(pid=7)[0])
    r1 = moved.replay(moved.select(pid=7)[0])
    assert [f.pc for f in r1.frames] == [f.pc + SLIDE for f in r0.frames] and len(r0.frames) == 5
    assert [f.symbol for f in r1.frames] == [f.symbol for f in r0.frames]
    assert r0.stop.reason is r1.stop.reason is StopReason.END_OF_STACK
    assert all(f.reliable for f in r1.frames)


def test_without_relocation_the_runtime_addresses_find_no_orc() -> None:
    b = _kernel()
    wrong = _session(b, SLIDE)
    wrong = Session(wrong.dump, wrong.image.image, wrong.image.image.symbols)  # type: ignore[union-attr]
    frames, stop = collect(wrong.backend.unwinder(wrong.target(wrong.select(pid=7)[0], Options())))
    assert len(frames) < 5 or not all(f.reliable for f in frames)
