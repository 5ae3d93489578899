"""The live-LR proof on real prologues: the Debian 6.12.117 arm64 slim image committed under corpora/."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.arch.arm64.complete import LrAnalyser
from unwind.formats.image import Image
from unwind.core.memory import Memory
from unwind.core.target import Target, Task

#: the 6.12 folder: the proofs below name its offsets (the 6.1/7.2 samples carry no text)
SLIM = sorted((Path(__file__).resolve().parents[3] / "corpora" / "arm64").glob("6.12.*/vmlinux-*.slim*"))


@pytest.fixture(scope="module")
def analyser():
    if not SLIM:
        pytest.skip("no arm64 slim image under corpora/arm64")
    image = Image(SLIM[0])
    if not image.has_text:
        pytest.skip(f"{SLIM[0].name} carries no text")
    return LrAnalyser(Target("arm64", Memory([]), Task(1, "x"), symbols=image.symbols, image=image)), image.symbols


@pytest.mark.parametrize("name,off,live", [
    ("rcu_all_qs", 0x0, True),       # patchable-entry nops
    ("rcu_all_qs", 0x8, True),       # paciasp
    ("rcu_all_qs", 0x10, True),      # stp x29, x30 done, mov x29, sp (at +0x18) not yet: x29 is the caller's
    ("rcu_all_qs", 0x1c, False),     # after mov x29, sp
    ("ksys_read", 0x18, True),       # sub sp / stp x29, x30, [sp, #0x10] done, add x29 not yet
    ("ksys_read", 0x1c, False),      # after add x29, sp, #0x10
    ("__cond_resched", 0x10, True),  # at mov x29, sp
    ("__cond_resched", 0x14, False),
    ("__ptep_set_access_flags", 0x94, True),   # a leaf fast path; the frame is built out of line
    ("__ptep_set_access_flags", 0xe8, False),  # after the out-of-line bl
])
def test_real_prologues(analyser, name, off, live):
    lr, symbols = analyser
    proof = lr.prove(symbols.address(name) + off)
    assert proof.live is live, proof.reason


def test_every_instruction_of_many_real_functions_gets_a_verdict(analyser):
    """Every pc of 150 random real functions gets a verdict with a reason; some are live, most are not."""
    import random

    lr, symbols = analyser
    rng = random.Random(7)
    picks = rng.sample(range(len(symbols.addrs) - 1), 150)
    live = total = 0
    for i in picks:
        start, end = symbols.addrs[i], symbols.ends[i]
        if not 0 < end - start <= 0x400:
            continue
        for pc in range(start, end, 4):
            proof = lr.prove(pc)
            total += 1
            live += proof.live
            assert proof.reason
    assert total > 1000 and 0 < live < total
