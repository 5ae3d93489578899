"""``unwind bench``: run the benchmarks (``benches/``) and write the benchmark report.

``unwind bench --report OUT/`` runs ``pytest benches/`` with pytest-benchmark
(progress on stderr), saves its JSON as ``OUT/benchmark.json`` and writes
``OUT/report.md`` with PNG plots beside it; ``--from-json F`` writes the
report from a saved JSON instead of running anything. The plots need
matplotlib (the ``[report]`` extra); without it the report is written
without them and says so.

The report reads the benches by their ``extra_info["kind"]`` (see
``docs/benchmarks.md``), the x86-64 ORC lookup benches of
``benches/bench_orc.py`` included. Every figure is the median of
the rounds (``--stat min`` or ``mean`` picks another statistic). Targets
are fixed (:mod:`.figures`, :mod:`.speed`) and never adjusted: a missed
target is printed with the factor it is missed by.

:mod:`.suite` runs the benchmarks, :mod:`.results` reads their JSON,
:mod:`.figures` and :mod:`.speed` make the figures and targets, :mod:`.plots`
draws the plots, :mod:`.report` writes the report, :mod:`.cli` is the
command line.
"""
