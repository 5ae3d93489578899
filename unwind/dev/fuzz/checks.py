"""What a fuzz case must not do, and the checks that find it.

A case must not raise but a one-line input error (:func:`one_line`), run over its CPU bound
(:func:`guarded`), read past a captured segment (:func:`instrument`), walk more than
:func:`unwind.core.walk.frame_limit` frames, give a frame value or provenance read that is not a
u64, or replay a task in a batch otherwise than alone (:func:`replay_all`).
"""

from __future__ import annotations

import json
import random
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from unwind.core.frame import Frame
from unwind.core.memory import Memory, MemoryFault, Segment
from unwind.core.target import Options
from unwind.core.walk import frame_limit
from unwind.formats.image import ImageError
from unwind.kernel.btf import Btf, BtfError
from unwind.session.replay import Session

from .seeds import BtfSeed

#: every frame value and provenance read is below it
U64 = 2**64
#: the modes every task is replayed in: their options, and whether the walk is the reliable one
MODES: dict[str, tuple[Options, bool]] = {
    "faithful": (Options(), False),
    "complete": (Options(complete=True), False),
    "explain": (Options(record=True), False),
    "reliable": (Options(), True),
}


class CaseTimeout(BaseException):
    """The case used more than its CPU bound (not an ``Exception``: code under test that catches every
    ``Exception`` does not swallow it)."""


#: set by the timer: its raise can land where Python drops it (a gc callback, a ``__del__``)
_bound_passed = False


class OutOfDump(Exception):
    """A read past a captured segment's bytes."""


class CheckedBytes(bytes):
    """A segment's bytes that refuse (and report) any slice or index past their end."""

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        n = len(self)
        if isinstance(key, slice):
            start, stop, _ = key.start, key.stop, key.step
            if (start is not None and not 0 <= start <= n) or (stop is not None and not 0 <= stop <= n) \
                    or (start is not None and stop is not None and stop < start):
                raise OutOfDump(f"slice [{start}:{stop}] of a {n}-byte segment")
        elif not 0 <= key < n:
            raise OutOfDump(f"index {key} of a {n}-byte segment")
        return super().__getitem__(key)


def instrument(mem: Memory) -> Memory:
    """The same memory (and holes) with every segment's bytes :class:`CheckedBytes`."""
    return Memory([Segment(s.start, CheckedBytes(s.data)) for s in mem.segments], mem.holes)


@dataclass
class Outcome:
    """What one case did: ``kind`` is ok, rejected (clean input error), traceback, hang, runaway,
    out-of-dump, bad-value or batch-differs; ``detail`` says where."""

    family: str
    kind: str
    detail: str = ""
    tasks: int = 0


def guarded(fam: str, label: str, run: Callable[[], Outcome], limit: float) -> Outcome:
    """``run()`` under a CPU bound of ``limit`` seconds, any exception turned into the outcome
    that names it."""
    global _bound_passed
    _bound_passed = False
    signal.signal(signal.SIGVTALRM, _on_timer)
    signal.setitimer(signal.ITIMER_VIRTUAL, limit)
    try:
        out = run()
    except CaseTimeout:
        return Outcome(fam, "hang", f"{label}: over {limit} s CPU")
    except OutOfDump as e:
        return Outcome(fam, "out-of-dump", f"{label}: {e}\n{_where()}")
    except Exception as e:  # noqa: BLE001 -- the fuzzer's job is to catch exactly these
        return Outcome(fam, "traceback", f"{label}: {type(e).__name__}: {e}\n{_where()}")
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    if _bound_passed:  # the timeout was dropped where it was raised, and the case ran on past its bound
        return Outcome(fam, "hang", f"{label}: over {limit} s CPU")
    return out


def replay_all(session: Session, tasks: list[Any]) -> tuple[str, str] | None:
    """Every task in every mode, as ``unwind replay --all`` walks them (``Session.replay_all``)
    and one by one (``Session.replay``); then every oracle compared. The first broken promise."""
    from unwind.cli.corpus import compare_oracle

    limits = [frame_limit(t.stacks, session.dump.task_memory(t), session.backend.min_frame_bytes) for t in tasks]
    for mode, (options, reliable) in MODES.items():
        try:
            # in lockstep whatever its size (a corpus dump has fewer tasks than MIN_TASKS)
            batch = session.replay_all(options, tasks, reliable=reliable, lockstep=True)
            for i, task in enumerate(tasks):
                bad = check_replay(session, task, mode, limits[i], batch[i])
                if bad is not None:
                    return bad
        except ImageError as e:  # x86 without its image: one line, as the CLI prints it
            out = one_line("", e)
            return None if out.kind == "rejected" else (out.kind, out.detail)
    for oracle in session.dump.oracles():
        compare_oracle(session, oracle)
    return None


def check_replay(session: Session, task: Any, mode: str, limit: int, batched: Any) -> tuple[str, str] | None:
    """One task's replay in one mode, and the batch's replay of it: bounded, u64, the same."""
    from unwind.session.output import replay_json, replay_text

    options, reliable = MODES[mode]
    r = session.replay(task, options, reliable=reliable)
    for got, how in ((r, ""), (batched, " (batch)")):
        if len(got.frames) > limit:
            return "runaway", f"{task.describe()} {mode}{how}: {len(got.frames)} frames > limit {limit}"
        bad = _bad_value(got.frames)
        if bad:
            return "bad-value", f"{task.describe()} {mode}{how}: {bad}"
    if _replay_key(batched) != _replay_key(r):
        return "batch-differs", (f"{task.describe()} {mode}: the batch gave {len(batched.frames)} frames, "
                                 f"{batched.stop.reason.name}; replay {len(r.frames)}, {r.stop.reason.name}")
    if not reliable:  # reliable: the same frames as faithful, only the verdict is new
        "\n".join(replay_text(session, r, explain=options.record)).encode()  # as printed: UTF-8
        if mode == "explain":
            json.dumps(replay_json(session, r, True))
    return None


def _replay_key(r: Any) -> tuple[Any, ...]:
    """What ``unwind replay`` prints of a replay (text, ``--explain``, ``--json``)."""
    frames = [(f.pc, f.sp, f.fp, f.source, f.stack, f.flags, f.symbol, f.provenance, f.extra) for f in r.frames]
    reliable = None if r.reliable is None else (r.reliable.ok, r.reliable.reason, r.reliable.stop)
    return frames, (r.stop.reason, r.stop.detail, r.stop.frames), reliable, r.basis


def _on_timer(signum: int, frame: Any) -> None:
    global _bound_passed
    _bound_passed = True
    raise CaseTimeout()


def _where() -> str:
    tb = traceback.extract_tb(sys.exc_info()[2])
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(tb[-4:]))


def one_line(fam: str, e: Exception) -> Outcome:
    """The input error ``e`` as a rejection, or as a traceback when it is not one line."""
    text = str(e)
    if not text or "\n" in text:
        return Outcome(fam, "traceback", f"input error is not one line: {type(e).__name__}: {text[:200]!r}")
    return Outcome(fam, "rejected", text[:200])


def _bad_value(frames: list[Frame]) -> str | None:
    for f in frames:
        for name in ("pc", "sp", "fp"):
            v = getattr(f, name)
            if v is not None and not (isinstance(v, int) and 0 <= v < U64):
                return f"frame {name} {v!r} is not a u64"
        if f.provenance is not None:
            for rd in f.provenance.reads:
                if not (0 <= rd.addr < U64 and 0 <= rd.value < U64):
                    return f"provenance read {rd.addr!r}={rd.value!r} is not a u64"
    return None


def query_btf(rng: random.Random, btf: Btf, seed: BtfSeed) -> None:
    """The queries the kernel reader and the layouts make, on names the blob held before mutation."""
    for name in rng.sample(seed.structs, min(4, len(seed.structs))):
        try:
            btf.sizeof(name)
            members = btf.members(name)
            for mname, m in members[:6]:
                if mname:
                    btf.offsetof(name, mname)
                    btf.has_member(name, f"{mname}.x[1]")
                kind = btf.kind(m.type_id)
                if kind == "ptr":
                    btf.type_name(btf.pointee(m.type_id))
                elif kind == "array":
                    btf.array(m.type_id)
                btf.type_name(m.type_id)
        except BtfError:
            pass
    for name in rng.sample(seed.enums, min(2, len(seed.enums))):
        try:
            for k in list(btf.enumerators(name))[:3]:
                btf.enum_value(k)
        except BtfError:
            pass


#: pages one vmcore case reads at most
VMCORE_PAGES = 64


def read_vmcore(path: Path) -> Exception | None:
    """Open ``path`` and read its notes and up to :data:`VMCORE_PAGES` pages of its ranges;
    the ``VmcoreError`` that refused the file, if one did."""
    from unwind.formats.vmcore import VmcoreError, open_vmcore

    try:
        vm = open_vmcore(path)
    except VmcoreError as e:
        return e
    with vm:
        vm.prstatus, vm.vmcoreinfo_dict, vm.page_size, vm.notes  # noqa: B018 -- read, not kept
        page = vm.page_size
        pages = 0
        for r in vm.ranges[:16]:
            for addr in range(r.start, min(r.end, r.start + VMCORE_PAGES * page), page):
                try:
                    vm.read_phys(addr, min(page, r.end - addr))
                except MemoryFault as e:
                    if "\n" in str(e):
                        raise AssertionError(f"fault is not one line: {str(e)[:200]!r}") from None
                pages += 1
                if pages >= VMCORE_PAGES:
                    return None
    return None
