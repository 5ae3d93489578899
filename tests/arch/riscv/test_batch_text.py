"""The lockstep walk's kernel text check (``kernel_text_lanes``, over the ranges as ``lane_row`` gives them) against
its definition: a pc is text when it lies in one of its lane's ranges, ``lo <= pc < hi``, compared here as Python
integers."""

from __future__ import annotations

import random

import numpy as np
import pytest

from unwind.arch.riscv.batch import kernel_text_lanes, lane_row

_TOP = (1 << 64) - 1


def _lanes(rng: random.Random, lanes: int, ranges: int) -> list[list[tuple[int, int]]]:
    """Per lane, ``ranges`` ranges (some empty or inverted, some at the ends of the address space)."""
    def one() -> tuple[int, int]:
        lo = rng.choice([0, _TOP - 0x100, rng.randrange(1 << 64)])
        return lo, rng.choice([lo, max(lo - 5, 0), min(lo + rng.randrange(1, 0x200), _TOP)])
    return [[one() for _ in range(ranges)] for _ in range(lanes)]


@pytest.mark.parametrize("ranges", [1, 2, 3])
@pytest.mark.parametrize("asked", [False, True])
def test_a_pc_is_text_when_a_range_of_its_lane_holds_it(ranges: int, asked: bool) -> None:
    rng = random.Random(ranges * 2 + asked)
    per_lane = _lanes(rng, 400, ranges)
    # pcs at, just inside and just outside the range ends of their own lane, and anywhere
    pcs = [rng.choice([lo, hi, hi - 1, lo - 1, lo + 1, rng.randrange(1 << 64)]) % (1 << 64)
           for lane in per_lane for lo, hi in [rng.choice(lane)]]
    among = [rng.random() < 0.7 for _ in per_lane]
    want = [(a or not asked) and any(lo <= pc < hi for lo, hi in lane) for pc, lane, a in zip(pcs, per_lane, among)]
    assert any(want) and not all(want)
    rows = np.array([lane_row(lane, (0, 0), 0, 0) for lane in per_lane], np.uint64).T
    lo, span = rows[:ranges], rows[ranges:2 * ranges]
    got = kernel_text_lanes(np.array(pcs, np.uint64), lo, span, np.array(among) if asked else None)
    assert got.tolist() == want
