"""``unwind fuzz --engine atheris``: the same checks as a campaign's, coverage-guided.

libFuzzer (through atheris, the ``[fuzz]`` extra) keeps every input that reaches new code of
the project. An input is a whole dump file; the first inputs are the corpus seeds written out.
Each new input is made from a kept one by one of the dump families of :mod:`unwind.dev.fuzz.mutators`
(stack, regs, json, vmcoreinfo, elf) when the kept one still opens, else by libFuzzer's own byte
mutations, so coverage steers a structure-aware search. Every input then goes through
:meth:`unwind.dev.fuzz.cases.Fuzzer.check` under the CPU bound (every task, every mode, batch and task
replay, reads instrumented, frames bounded, values u64); an input that breaks a promise is
written into ``--keep`` as a campaign's failing case is, and the search goes on.
"""

from __future__ import annotations

import gc
import hashlib
import random
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from unwind.formats.dump import Dump, DumpError
from .cases import Fuzzer
from .checks import Outcome, one_line
from .mutators import mutate_elf, mutate_json, mutate_regs, mutate_stack, mutate_vmcoreinfo
from .seeds import Seed, cut_seed

#: the dump families a structure-aware step picks from
STEPS: dict[str, Callable[[random.Random, Seed], Any]] = {
    "stack": mutate_stack, "regs": mutate_regs, "json": mutate_json, "vmcoreinfo": mutate_vmcoreinfo,
    "elf": mutate_elf,
}
#: the share of steps libFuzzer's byte mutator takes even when the input opens
BYTE_STEPS = 0.2


class Guided:
    """The fuzzer's seeds and checks as libFuzzer's target and custom mutator."""

    def __init__(self, fuzzer: Fuzzer, byte_mutate: Callable[[bytes, int], bytes]) -> None:
        self.fuzzer = fuzzer
        #: libFuzzer's own mutator (``atheris.Mutate``: usable only inside its run)
        self.byte_mutate = byte_mutate
        self.images = {}
        for s in fuzzer.seeds:
            image = fuzzer.image(s.image_path)
            if image is not None and image.build_id:
                self.images[image.build_id] = s.image_path
        self.outcomes: Counter[str] = Counter()
        self.steps: Counter[str] = Counter()
        #: where the counts are written every 256 inputs (libFuzzer ends the process itself)
        self.report: Path | None = None

    def initial_inputs(self, folder: Path) -> None:
        """Write every seed as a dump file into ``folder`` (libFuzzer's first inputs)."""
        folder.mkdir(parents=True, exist_ok=True)
        for s in self.fuzzer.seeds:
            data = s.writer().to_bytes()
            (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)

    def seed_of(self, data: bytes) -> Seed | None:
        """``data`` as a seed the dump families can mutate, or ``None`` when it does not open."""
        try:
            dump = Dump(data, "input")
            pids = [t.pid for t in dump.tasks()]
            return cut_seed(dump, "input", pids, self.images.get(dump.build_id or ""))
        except (DumpError, ValueError, KeyError, TypeError):  # a note the reader let through but cut_seed cannot
            return None

    def mutate(self, data: bytes, max_size: int, seed: int) -> bytes:
        """libFuzzer's custom mutator: a dump family's step on ``data``, or a byte mutation."""
        rng = random.Random(seed)
        s = self.seed_of(data) if rng.random() >= BYTE_STEPS else None
        if s is not None:
            name = rng.choice(list(STEPS))
            out = STEPS[name](rng, s)
            out = out if isinstance(out, bytes) else out.to_bytes()
            if len(out) <= max_size:
                self.steps[name] += 1
                return out
        self.steps["bytes"] += 1
        return self.byte_mutate(data, max_size)

    def check(self, data: bytes) -> Outcome:
        """The campaign's checks on one input (the image of its build-id, when a seed has it)."""
        try:
            build_id = Dump(data, "input").build_id
        except DumpError as e:
            return one_line("guided", e)
        return self.fuzzer.check(data, "input", self.images.get(build_id or ""), "guided")

    def one_input(self, data: bytes) -> None:
        """libFuzzer's target: check, count, keep a failing input."""
        out = self.fuzzer.guarded("guided", "input", lambda: self.check(data))
        self.outcomes[out.kind] += 1
        if self.report is not None and self.outcomes.total() % 256 == 0:
            self.report.write_text(self.summary() + "\n")
        if out.kind not in ("ok", "rejected"):
            print(f"unwind fuzz: {out.kind}: {out.detail}", file=sys.stderr, flush=True)
            if self.fuzzer.keep is not None:
                self.fuzzer.last = data
                self.fuzzer.keep_case(out, _INPUT, f"guided-{hashlib.sha1(data).hexdigest()[:16]}")
            if self.report is not None:
                self.report.write_text(self.summary() + "\n")

    def summary(self) -> str:
        """Outcomes and mutation steps so far, one line each."""
        return (f"inputs: {self.outcomes.total()}\noutcomes: {dict(sorted(self.outcomes.items()))}\n"
                f"steps: {dict(sorted(self.steps.items()))}")


#: what a kept input's ``.txt`` names as its seed (the input is a whole dump: no seed is needed)
_INPUT = Seed("input", "", [], [], "", {}, None)


def instrument_project(atheris: Any) -> int:
    """Give libFuzzer the coverage of the project's own code (every function of ``unwind.*`` loaded
    so far: the arch backends and what the checks call are loaded by the seeds); the libraries
    stay uninstrumented. Returns the number of functions."""
    funcs = [obj for obj in gc.get_objects()
             if isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith("unwind")]
    for func in funcs:
        atheris.instrument_func(func)
    print(f"unwind fuzz: coverage of {len(funcs)} functions of unwind.*", file=sys.stderr, flush=True)
    return len(funcs)


def run(fuzzer: Fuzzer, work: Path, max_time: int, runs: int | None, extra: list[str]) -> int:
    """Run libFuzzer over the seeds for ``max_time`` seconds (or ``runs`` inputs); libFuzzer ends
    the process (exit 0 when done; the counts are in ``work/summary.txt``)."""
    try:
        import atheris
    except ImportError:
        raise OSError("the atheris engine needs atheris: pip install -e '.[fuzz]'") from None
    guided = Guided(fuzzer, lambda data, max_size: atheris.Mutate(data, max_size))  # bound when Fuzz() runs
    inputs = work / "inputs"
    guided.initial_inputs(inputs)
    largest = max(p.stat().st_size for p in inputs.iterdir())
    argv = [sys.argv[0], str(inputs), f"-max_total_time={max_time}", f"-max_len={4 * largest}",
            f"-timeout={int(fuzzer.cpu_limit * 4) + 1}", "-rss_limit_mb=4096",
            f"-artifact_prefix={work}/", "-print_final_stats=1", *extra]
    if runs is not None:
        argv.append(f"-runs={runs}")
    guided.report = work / "summary.txt"
    for s in fuzzer.seeds:  # every module a check imports is loaded (and then instrumented)
        guided.one_input(s.writer().to_bytes())
    instrument_project(atheris)
    atheris.Setup(argv, guided.one_input, custom_mutator=guided.mutate)
    atheris.Fuzz()
    return 0
