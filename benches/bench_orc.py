"""ORC lookup on the real x86-64 6.12 table (450,712 entries), every method in the same run.

- ``orc_find``: the scalar lookup the unwinder makes per frame (the kernel's
  ``.orc_lookup`` 256-byte blocks, then ``bisect`` inside the block);
- ``orc_find_batch``: 1 M uniformly random ``[_stext, _etext)`` ips in one call
  (the block table refined to 32-byte sub-blocks: a popcount per ip);
- ``searchsorted``: plain ``numpy.searchsorted`` over the whole table;
- ``bisect``: plain Python ``bisect`` over the whole table;
- ``c_bsearch``: the compiled floor, the same plain binary search in C, built
  here with the system ``cc`` (skipped with a note when there is none).

``test_orc_lookup_trace_ips`` repeats the batch methods on the ips the walks of
the committed x86-64 corpus really looked up (``ip - 1`` after a call, ``ip``
for a pt_regs frame), drawn to the same count: real traces hit few, hot blocks.

Each round resolves the same ips; ``extra_info["lookups"]`` lets the report
turn times into lookups per second and ratios. Targets: batch at
least 30 M lookups/s and faster than ``c_bsearch``.
"""

from __future__ import annotations

import bisect
import ctypes
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from benchkit import CORPORA, QUICK, Missing, need, real_orc_table, uniform_text_ips

#: ips per batch round, and per scalar round (Python loops are slow: fewer, same distribution)
BATCH_N = 20_000 if QUICK else 1_000_000
SCALAR_N = 2_000 if QUICK else 100_000

C_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
/* the rightmost entry with ips[i] <= q (0 when none): __orc_find() over the whole table */
void bsearch_all(const uint64_t *ips, size_t n, const uint64_t *q, size_t m, int64_t *out)
{
    for (size_t k = 0; k < m; k++) {
        size_t lo = 0, hi = n;
        uint64_t ip = q[k];
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (ips[mid] <= ip)
                lo = mid + 1;
            else
                hi = mid;
        }
        out[k] = lo ? (int64_t)lo - 1 : 0;
    }
}
"""


@lru_cache(maxsize=None)
def c_bsearch() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None] | Missing:
    """The C helper, compiled once per run with ``cc -O2``; :class:`Missing` without a compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return Missing("no C compiler (cc/gcc/clang): the compiled floor is not measured")
    tmp = Path(tempfile.mkdtemp(prefix="unwind-bench-orc-"))
    (tmp / "bs.c").write_text(C_SOURCE)
    try:
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp / "bs.so"), str(tmp / "bs.c")],
                       check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return Missing(f"{cc} could not build the C helper: {e}")
    fn = ctypes.CDLL(str(tmp / "bs.so")).bsearch_all
    fn.restype = None
    u64p, i64p = np.ctypeslib.ndpointer(np.uint64, flags="C"), np.ctypeslib.ndpointer(np.int64, flags="C")
    fn.argtypes = [u64p, ctypes.c_size_t, u64p, ctypes.c_size_t, i64p]
    return lambda ips, q, out: fn(ips, len(ips), q, len(q), out)


def _scalar(find: Callable[[int], Any], queries: list[int]) -> int:
    for ip in queries:
        find(ip)
    return len(queries)


def _bisect(ips: list[int], queries: list[int]) -> int:
    right = bisect.bisect_right
    for ip in queries:
        right(ips, ip)
    return len(queries)


def _batch(find_batch: Callable[[np.ndarray], np.ndarray], queries: np.ndarray) -> int:
    find_batch(queries)
    return len(queries)


def _searchsorted(ips: np.ndarray, queries: np.ndarray) -> int:
    np.searchsorted(ips, queries, side="right")
    return len(queries)


def _c(fn: Callable[[np.ndarray, np.ndarray, np.ndarray], None], ips: np.ndarray, queries: np.ndarray,
       out: np.ndarray) -> int:
    fn(ips, queries, out)
    return len(queries)


METHODS = ("orc_find", "orc_find_batch", "searchsorted", "bisect", "c_bsearch")


def _batch_method(method: str, table: Any, batch: np.ndarray) -> tuple[Callable[..., int], tuple[Any, ...]]:
    """The function and arguments of a method that resolves a whole array of ips at once."""
    if method == "orc_find_batch":
        return _batch, (table.orc_find_batch, batch)
    if method == "searchsorted":
        return _searchsorted, (table.ips, batch)
    cfn = need(c_bsearch())
    return _c, (cfn, np.ascontiguousarray(table.ips), batch, np.empty(len(batch), np.int64))


@pytest.mark.parametrize("method", METHODS)
def test_orc_lookup(benchmark: Any, method: str) -> None:
    """Uniform random kernel-text ips resolved by ``method`` on the real table."""
    src = need(real_orc_table())
    table = src.table
    batch = uniform_text_ips(table, BATCH_N)
    scalar = batch[:SCALAR_N].tolist()
    fn: Callable[..., int]
    if method == "orc_find":
        fn, args = _scalar, (table.orc_find, scalar)
    elif method == "bisect":
        fn, args = _bisect, (table.ips.tolist(), scalar)
    else:
        fn, args = _batch_method(method, table, batch)
        if method == "c_bsearch":
            cfn, ips, _, out = args
            cfn(ips, batch, out)
            assert np.array_equal(out, table.orc_find_batch(batch)), "the C helper disagrees with orc_find_batch"
    benchmark.group = "orc lookup"
    benchmark.extra_info.update(kind="orc_lookup", method=method, entries=len(table), table=src.label)
    benchmark.extra_info["lookups"] = benchmark(fn, *args)


@lru_cache(maxsize=None)
def trace_ips(n: int) -> np.ndarray | Missing:
    """``n`` lookup addresses drawn from the replays of the committed x86-64 dumps (fixed seed)."""
    from unwind.core.frame import Flag
    from unwind.session.replay import ReplayError, load_session
    from unwind.core.target import Options

    dumps = sorted((CORPORA / "x86_64").glob("*/stop-*.bin.xz"))[: 3 if QUICK else None]
    seen: list[int] = []
    for d in dumps:
        try:
            session = load_session(d)
        except ReplayError as e:
            return Missing(f"{d.name}: {e}")
        for task in session.dump.tasks():
            r = session.replay(task, Options(), symbolize=False)
            seen += [f.pc if f.flags & Flag.BOUNDARY else f.pc - 1 for f in r.frames]
    if not seen:
        return Missing(f"no x86-64 dumps under {CORPORA}")
    return np.random.default_rng(11).choice(np.array(seen, dtype=np.uint64), size=n)


@pytest.mark.parametrize("method", ("orc_find_batch", "searchsorted", "c_bsearch"))
def test_orc_lookup_trace_ips(benchmark: Any, method: str) -> None:
    """The batch methods over ips taken from real traces."""
    src = need(real_orc_table())
    table = src.table
    batch = need(trace_ips(BATCH_N))
    fn, args = _batch_method(method, table, batch)
    benchmark.group = "orc lookup, ips from real traces"
    benchmark.extra_info.update(kind="orc_lookup_traces", method=method, entries=len(table), table=src.label)
    benchmark.extra_info["lookups"] = benchmark(fn, *args)
