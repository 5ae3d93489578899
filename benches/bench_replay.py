"""Replay per frame, per arch, on the committed real corpora.

One round walks every task of every committed dump of the arch
(``corpora/<arch>/<release>/*.bin*``); the report divides by the frames
walked (``extra_info["frames"]``). Modes:

- ``walk``: the kernel loop (``kunwind_stack_walk``), symbolisation and
  provenance off: the figure the 3 µs/frame target is about;
- ``walk+symbols``: each frame symbolised as ``unwind replay`` prints it;
- ``walk+provenance``: ``Options(record=True)``, every read recorded;
- ``replay``: ``Session.replay`` as a library user calls it (symbols and the
  call-site check).

The breakdown times the parts of ``walk`` alone over the same inputs:
``setup`` is each task's unwinder set up and its first frame (the fixed
cost of a walk), ``reads`` is ``Memory.read_u64`` over every address the
walks read (taken from their provenance), ``lookup`` is ``orc_find`` over
every ip the x86-64 walks looked up (arm64 and RISC-V walk frame records: no
metadata lookup), and ``symbols`` is symbolisation of the walked frames. The
report derives recovery (the unwinder's own logic per step) as
``walk - setup - lookup - reads``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from benchkit import (ARCHES, Corpus, load_corpus, lookup_groups, measure, need, read_all, replay_all, setup_all,
                      symbolize_all, walk_all, walk_symbolize_all)

MODES: dict[str, Callable[[Corpus], tuple[Callable[..., int], tuple[Any, ...]]]] = {
    "walk": lambda c: (walk_all, (c.backend, c.targets)),
    "walk+symbols": lambda c: (walk_symbolize_all, (c.backend, c.targets)),
    "walk+provenance": lambda c: (walk_all, (c.backend, c.targets_record)),
    "replay": lambda c: (replay_all, (c.items,)),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arch", ARCHES)
def test_replay(benchmark: Any, arch: str, mode: str) -> None:
    """Every task of the arch's corpus, walked in ``mode``."""
    corpus: Corpus = need(load_corpus(arch))
    fn, args = MODES[mode](corpus)
    benchmark.group = f"replay: {arch}"
    benchmark.extra_info.update(kind="replay", mode=mode, **corpus.info())
    benchmark.extra_info["frames"] = measure(benchmark, fn, *args)


@pytest.mark.parametrize("phase", ["setup", "reads", "lookup", "symbols"])
@pytest.mark.parametrize("arch", ARCHES)
def test_phase(benchmark: Any, arch: str, phase: str) -> None:
    """One part of the walk alone, over the inputs the walks of the corpus used."""
    corpus: Corpus = need(load_corpus(arch))
    fn: Callable[..., int]
    if phase == "setup":
        fn, args = setup_all, (corpus.backend, corpus.targets)
    elif phase == "reads":
        fn, args = read_all, (corpus.reads,)
    elif phase == "lookup":
        if not corpus.lookups:
            pytest.skip(f"{arch} walks frame records: no metadata lookup to time")
        fn, args = lookup_groups, (corpus.lookups,)
    else:
        fn, args = symbolize_all, (corpus.backend, corpus.walked)
    benchmark.group = f"replay: {arch}"
    benchmark.extra_info.update(kind="phase", phase=phase, **corpus.info())
    benchmark.extra_info["count"] = measure(benchmark, fn, *args)
