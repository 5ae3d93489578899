"""How cost grows: walk cost against depth, lookup cost against ORC table size and batch size.

- ``test_depth``: one blocked task ``depth`` frames deep (8 .. 4096), built
  with each arch's own synth builders and checked to walk exactly ``depth``
  frames. A frame-pointer walk and an ORC walk both do constant work per
  frame, so the time should be linear in depth.
- ``test_table_size``: the real x86-64 ORC table subsampled to every k-th
  entry (same text range), looked up at the same uniform random text ips:
  ``orc_find`` (the kernel's block-narrowed search), ``orc_find_batch``,
  a plain ``bisect`` over the whole table and ``numpy.searchsorted``. A
  binary search costs O(log n) per lookup.
- ``test_batch_size``: ``orc_find_batch`` throughput against the number of
  ips per call, on the full table.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

import numpy as np
import pytest

from benchkit import (ARCHES, BATCH_LOOKUPS, BATCH_SIZES, DEPTHS, SCALAR_LOOKUPS, TABLE_STEPS, Chain, lookup_all,
                      need, real_orc_table, subsampled_table, synthetic_chain, uniform_text_ips, walk_count)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("arch", ARCHES)
def test_depth(benchmark: Any, arch: str, depth: int) -> None:
    """One walk of a synthetic chain ``depth`` frames deep."""
    chain: Chain = need(synthetic_chain(arch, depth))
    benchmark.group = f"depth: {arch}"
    benchmark.extra_info.update(kind="depth", arch=arch, depth=depth, frames=depth)
    benchmark(walk_count, chain.backend, chain.target)


def _bisect_all(ips_list: list[int], queries: list[int]) -> int:
    """``__orc_find`` as plain Python: the rightmost entry ``<= ip`` by ``bisect`` over the whole table."""
    right = bisect.bisect_right
    for ip in queries:
        right(ips_list, ip)
    return len(queries)


def _searchsorted(ips: np.ndarray, queries: np.ndarray) -> int:
    np.searchsorted(ips, queries, side="right")
    return len(queries)


def _batch(find_batch: Callable[[np.ndarray], np.ndarray], queries: np.ndarray) -> int:
    find_batch(queries)
    return len(queries)


LOOKUPS = ("orc_find", "orc_find_batch", "bisect", "searchsorted")


@pytest.mark.parametrize("how", LOOKUPS)
@pytest.mark.parametrize("step", TABLE_STEPS)
def test_table_size(benchmark: Any, step: int, how: str) -> None:
    """Lookups at fixed uniform text ips in the table subsampled to every ``step``-th entry."""
    src = need(real_orc_table())
    table = subsampled_table(step)
    scalar = uniform_text_ips(table, SCALAR_LOOKUPS)
    fn: Callable[..., int]
    if how == "orc_find":
        fn, args = lookup_all, (table.orc_find, scalar.tolist())
    elif how == "bisect":
        fn, args = _bisect_all, (table.ips.tolist(), scalar.tolist())
    elif how == "searchsorted":
        fn, args = _searchsorted, (table.ips, uniform_text_ips(table, BATCH_LOOKUPS))
    else:
        fn, args = _batch, (table.orc_find_batch, uniform_text_ips(table, BATCH_LOOKUPS))
    benchmark.group = f"table size: {how}"
    benchmark.extra_info.update(kind="table_size", how=how, entries=len(table), step=step, table=src.label)
    benchmark.extra_info["lookups"] = benchmark(fn, *args)


@pytest.mark.parametrize("size", BATCH_SIZES)
def test_batch_size(benchmark: Any, size: int) -> None:
    """``orc_find_batch`` over ``size`` uniform text ips per call, on the full table."""
    src = need(real_orc_table())
    queries = uniform_text_ips(src.table, size)
    benchmark.group = "batch size: orc_find_batch"
    benchmark.extra_info.update(kind="batch_size", batch=size, entries=len(src.table), table=src.label)
    benchmark.extra_info["lookups"] = benchmark(_batch, src.table.orc_find_batch, queries)
