"""Workloads the benchmarks time: real corpora, synthetic chains, ORC tables, the drgn peer.

Everything here is set-up: it builds what a bench times and checks that it
is real (a chain of N frames walks N frames), but it never times anything
itself. ``UNWIND_BENCH_QUICK=1`` shrinks every input so that the smoke test
can run each bench once in a few seconds.

Where an input is missing (no committed corpus, a backend that still raises
``NotImplementedError``, an arch with no synth builder yet, no ORC table, no
peer dump), the loader returns a :class:`Missing` with the reason, and the
bench skips with it; the report lists every skip.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pytest

from unwind.core.frame import Frame
from unwind.core.registry import ArchBackend
from unwind.session.replay import Session, load_session
from unwind.core.target import Options, Target, Task
from unwind.cli.corpus import paths_under
from unwind.core.walk import UnwindStop, kunwind_stack_walk

#: set to "1" for tiny inputs (the smoke test)
QUICK = os.environ.get("UNWIND_BENCH_QUICK") == "1"
REPO = Path(__file__).resolve().parent.parent
#: the committed corpora (override with $UNWIND_CORPORA)
CORPORA = Path(os.environ.get("UNWIND_CORPORA", REPO / "corpora"))
#: folder of peer pairs: ``NAME.vmcore`` (QEMU dump-guest-memory) beside ``NAME.bin[.xz]``
PEER_ENV = "UNWIND_PEER_DUMPS"
#: a debug vmlinux for the real ORC table when no slim image is committed
VMLINUX_ENV = "UNWIND_BENCH_VMLINUX"

ARCHES = ("arm64", "x86_64", "riscv")
#: synthetic chain depths (frames walked)
DEPTHS = (8, 64) if QUICK else (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: ORC table subsampling steps: every k-th entry
TABLE_STEPS = (64, 8) if QUICK else (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
#: batch sizes for ``orc_find_batch`` throughput
BATCH_SIZES = (1, 64, 4096) if QUICK else (1, 8, 64, 512, 4096, 32768, 262144, 1048576)
#: uniform random text ips looked up per round in the table-size scaling
SCALAR_LOOKUPS = 500 if QUICK else 20_000
BATCH_LOOKUPS = 2_000 if QUICK else 200_000
#: drgn loops on some arm64 stacks (real-kernels.md §6): tasks whose drgn trace is longer are left out
DRGN_MAX_FRAMES = 64


@dataclass(frozen=True)
class Missing:
    """Why a workload cannot be built here (the bench skips with this reason)."""

    reason: str


def need(value: Any) -> Any:
    """``value``, or skip the bench with the reason a :class:`Missing` carries."""
    if isinstance(value, Missing):
        pytest.skip(value.reason)
    return value


def measure(benchmark: Any, fn: Callable[..., int], *args: Any) -> int:
    """``benchmark(fn, *args)``; a call longer than 0.2 s gets 3 rounds of one call (keeps the suite short)."""
    t = time.perf_counter()
    fn(*args)
    if time.perf_counter() - t > 0.2:
        return int(benchmark.pedantic(fn, args, rounds=3, iterations=1))
    return int(benchmark(fn, *args))


def _true(_frame: Frame) -> bool:
    return True


def walk_count(backend: ArchBackend, target: Target, max_frames: int = 1 << 16) -> int:
    """Walk one task with the kernel loop and a consumer that keeps nothing; the frames walked."""
    return kunwind_stack_walk(backend.unwinder(target), _true, max_frames).frames


def walk_all(backend: ArchBackend, targets: list[Target]) -> int:
    """Walk every target (symbolisation off); the total frames."""
    n = 0
    for t in targets:
        n += kunwind_stack_walk(backend.unwinder(t), _true).frames
    return n


def walk_symbolize_all(backend: ArchBackend, targets: list[Target]) -> int:
    """Walk every target and symbolise each frame as ``unwind replay`` prints it; the total frames."""
    n = 0
    sym = backend.symbolize
    for t in targets:

        def consume(f: Frame, t: Target = t) -> bool:
            f.symbol = sym(f, t)
            return True

        n += kunwind_stack_walk(backend.unwinder(t), consume).frames
    return n


def setup_all(backend: ArchBackend, targets: list[Target]) -> int:
    """Set up each task's walk and take its first frame: the fixed cost a walk pays once; the tasks."""
    for t in targets:
        try:
            backend.unwinder(t).start()
        except UnwindStop:
            pass
    return len(targets)


def replay_all(items: list[tuple[Session, Task]]) -> int:
    """``Session.replay`` of every task, as the library user calls it; the total frames."""
    n = 0
    for s, task in items:
        n += len(s.replay(task).frames)
    return n


def read_all(groups: list[tuple[Callable[[int], int], list[int]]]) -> int:
    """``Memory.read_u64`` over each dump's addresses; the count."""
    n = 0
    for read_u64, addrs in groups:
        for a in addrs:
            read_u64(a)
        n += len(addrs)
    return n


def lookup_all(find: Callable[[int], Any], ips: list[int]) -> int:
    """A scalar lookup over ``ips``; the count."""
    for ip in ips:
        find(ip)
    return len(ips)


def lookup_groups(groups: list[tuple[Callable[[int], Any], list[int]]]) -> int:
    """:func:`lookup_all` over each table's ips; the count."""
    return sum(lookup_all(find, ips) for find, ips in groups)


def symbolize_all(backend: ArchBackend, pairs: list[tuple[Frame, Target]]) -> int:
    """Symbolise already-walked frames; the count."""
    sym = backend.symbolize
    for f, t in pairs:
        sym(f, t)
    return len(pairs)


# --- real corpora -----------------------------------------------------------------------------

@dataclass
class Corpus:
    """The committed dumps of one arch, opened, with every task's walk prepared and traced once."""

    arch: str
    backend: ArchBackend
    label: str
    dumps: list[str]
    targets: list[Target]
    targets_record: list[Target]
    items: list[tuple[Session, Task]]
    frames: int
    walked: list[tuple[Frame, Target]]
    #: per dump, its ``Memory.read_u64`` and every address the walks read there (from provenance), in walk order
    reads: list[tuple[Callable[[int], int], list[int]]]
    #: per ORC table (x86-64), its ``orc_find`` and every ip the walks looked up in it
    lookups: list[tuple[Callable[[int], Any], list[int]]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        """What a bench stores in ``extra_info`` about the corpus."""
        return {"arch": self.arch, "corpus": self.label, "dumps": self.dumps, "tasks": len(self.targets),
                "frames": self.frames, "reads": sum(len(a) for _, a in self.reads),
                "lookups": sum(len(i) for _, i in self.lookups), "tasks_failed": len(self.failed)}


@contextmanager
def recording_orc_lookups(arch: str) -> Iterator[list[tuple[Any, int]]]:
    """While active, every ``OrcTable.orc_find(ip)`` call is logged as ``(table, ip)`` (x86-64 only)."""
    log: list[tuple[Any, int]] = []
    if arch != "x86_64":
        yield log
        return
    from unwind.arch.x86_64.orc import OrcTable

    original = OrcTable.orc_find

    def orc_find(self: OrcTable, ip: int) -> Any:
        log.append((self, ip))
        return original(self, ip)

    OrcTable.orc_find = orc_find  # type: ignore[method-assign]
    try:
        yield log
    finally:
        OrcTable.orc_find = original  # type: ignore[method-assign]


def corpus_dumps(arch: str) -> list[str]:
    """The committed dumps of ``arch``: ``corpora/<arch>/<release>/*.bin*``."""
    root = CORPORA / arch
    return paths_under(root) if root.is_dir() else []


@lru_cache(maxsize=None)
def load_corpus(arch: str) -> Corpus | Missing:
    """Open every committed dump of ``arch`` and prepare each task's walk (cached per process)."""
    dumps = corpus_dumps(arch)
    if not dumps:
        return Missing(f"no committed {arch} corpus under {CORPORA / arch}")
    if QUICK:
        dumps = dumps[:1]
    targets: list[Target] = []
    items: list[tuple[Session, Task]] = []
    failed: list[str] = []
    backend: ArchBackend | None = None
    releases: set[str] = set()
    for path in dumps:
        s = load_session(path)
        backend = s.backend
        releases.add(s.dump.release or "?")
        for task in s.select(every=True):
            items.append((s, task))
            targets.append(s.target(task, Options()))
    if backend is None or not targets:
        return Missing(f"the {arch} corpus has no tasks")
    if QUICK:
        items, targets = items[:4], targets[:4]
    kept_t: list[Target] = []
    kept_i: list[tuple[Session, Task]] = []
    walked: list[tuple[Frame, Target]] = []
    reads: dict[int, tuple[Callable[[int], int], list[int]]] = {}
    with recording_orc_lookups(arch) as log:
        for item, t in zip(items, targets):
            rec = t.replace(options=replace(t.options, record=True))
            try:
                frames: list[Frame] = []
                kunwind_stack_walk(backend.unwinder(rec), lambda f: frames.append(f) is None)
            except NotImplementedError as e:
                return Missing(f"{arch} backend not ready: {e}")
            except Exception as e:  # a backend still being written: leave the task out, say so
                failed.append(f"{item[1].describe()}: {type(e).__name__}: {e}")
                continue
            kept_t.append(t)
            kept_i.append(item)
            addrs = reads.setdefault(id(t.mem), (t.mem.read_u64, []))[1]
            for f in frames:
                walked.append((f, t))
                if f.provenance is not None:
                    addrs.extend(r.addr for r in f.provenance.reads if r.size == 8)
    if not kept_t:
        return Missing(f"every {arch} task failed to walk: {failed[0] if failed else '?'}")
    frames_total = walk_all(backend, kept_t)
    if not any(addrs for _, addrs in reads.values()):
        return Missing(f"the {arch} backend records no reads in its provenance")
    tables: dict[int, tuple[Callable[[int], Any], list[int]]] = {}
    for table, ip in log:
        tables.setdefault(id(table), (table.orc_find, []))[1].append(ip)
    root = CORPORA / arch
    label = f"{root.relative_to(REPO) if root.is_relative_to(REPO) else root}/{'+'.join(sorted(releases))}"
    return Corpus(arch=arch, backend=backend, label=label, dumps=[Path(d).name for d in dumps],
                  targets=kept_t, targets_record=[t.replace(options=replace(t.options, record=True)) for t in kept_t],
                  items=kept_i, frames=frames_total, walked=walked, reads=list(reads.values()),
                  lookups=list(tables.values()), failed=failed)


# --- synthetic chains -------------------------------------------------------------------------

@dataclass
class Chain:
    """One synthetic task ``depth`` frames deep, ready to walk."""

    arch: str
    depth: int
    backend: ArchBackend
    target: Target


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def _arm64_chain(depth: int) -> Session:
    from unwind.arch.arm64.synth import TEXT, Arm64Synth

    s = Arm64Synth("6.12")
    frame = 0x20
    size = _pow2_at_least((depth + 8) * frame + s.layout.size + 0x200)
    st = s.task_stack(pid=100, low=0xFFFF800082000000, size=size)
    final = s.final_fp(st)
    fps = [final - (depth - 1 - i) * frame for i in range(depth - 1)]
    lrs = [TEXT + 0x1000 + (i % 997) * 0x40 + 0x24 for i in range(depth - 1)]
    s.chain(st, fps, lrs, last_fp=final)
    s.blocked(100, "kworker/0:1", fp=fps[0], pc=TEXT + 0x1000 + 5 * 0x40 + 0x10, sp=fps[0] - 0x40)
    syms = [(TEXT + 0x1000 + k * 0x40, f"fn_{k:04d}") for k in range(997)]
    return s.session(syms)


def _riscv_chain(depth: int) -> Session:
    from unwind.arch.riscv.structs import PT_SIZE
    from unwind.arch.riscv.synth import TASK_BASE, RiscvSynth

    names = tuple(f"fn_{k:03d}" for k in range(64))
    s = RiscvSynth(extra_functions=names)
    frame = 0x20
    size = _pow2_at_least((depth + 8) * frame + PT_SIZE + 0x200)
    low = (TASK_BASE + size - 1) & ~(size - 1)
    st = s.sd.stack("task", low, size, pid=100)
    funcs = [names[i % len(names)] for i in range(depth - 2)] + ["kthread"]
    bottom = st.high - PT_SIZE - 0x40
    fps = [bottom - (len(funcs) - 1 - i) * frame for i in range(len(funcs))]
    ras = [s.at(funcs[i + 1], 0x40 + (i % 7) * 4) for i in range(len(funcs) - 1)] + [s.at("ret_from_fork", 0xE)]
    for i, fp in enumerate(fps):
        s.record(st, fp, fps[i + 1] if i + 1 < len(fps) else s.at("kthread"), ras[i])
    s.sd.blocked_task(100, "kworker/0:1", {"ra": s.at("__schedule", 0x3A6), "sp": fps[0] - frame, "s0": fps[0]})
    return s.session()


def _x86_64_chain(depth: int) -> Session:
    from unwind.arch.x86_64.structs import INACTIVE_TASK_FRAME, INACTIVE_TASK_FRAME_SIZE
    from unwind.arch.x86_64.synth import END_OF_STACK, OrcBuilder, call, session
    from unwind.kernel.layout import offsetof
    from unwind.dev.synth import SynthDump

    b = OrcBuilder()
    frame = 0x20  # after each prologue: CFA = sp + 0x20, the return address at CFA - 8
    funcs = [b.func(f"fn_{k:03d}", 0x80, (0, call(8)), (0x10, call(frame))) for k in range(64)]
    bottom = b.func("kernel_thread_base", 0x40, (0, END_OF_STACK))
    ips = [funcs[i % len(funcs)] + 0x41 for i in range(depth - 1)] + [bottom + 0x11]
    sd = SynthDump("x86_64")
    size = _pow2_at_least((depth + 8) * frame + INACTIVE_TASK_FRAME_SIZE + 0x200)
    low = (0xFFFFC90000100000 + size - 1) & ~(size - 1)
    st = sd.stack("task", low, size, pid=100)
    tsp = low + 0x100
    st.put(tsp + offsetof(INACTIVE_TASK_FRAME, "bp"), 0)
    st.put(tsp + offsetof(INACTIVE_TASK_FRAME, "ret_addr"), ips[0])
    sp = tsp + INACTIVE_TASK_FRAME_SIZE
    for ip in ips[1:]:
        sp += frame
        st.put(sp - 8, ip)
    sd.blocked_task(100, "kworker/0:1", {"sp": tsp})
    return session(sd, b.image())


_CHAIN_BUILDERS: dict[str, Callable[[int], Session]] = {
    "arm64": _arm64_chain, "riscv": _riscv_chain, "x86_64": _x86_64_chain,
}


@lru_cache(maxsize=None)
def synthetic_chain(arch: str, depth: int) -> Chain | Missing:
    """A blocked task ``depth`` frames deep built with the arch's own synth builders, checked by walking it."""
    try:
        session = _CHAIN_BUILDERS[arch](depth)
    except ModuleNotFoundError as e:
        if e.name != f"unwind.arch.{arch}.synth":
            raise  # a builder that no longer fits its arch's API is a bug, not a skip
        return Missing(f"no {arch} synth builders yet (arch/{arch}/synth.py)")
    task = session.select(every=True)[0]
    target = session.target(task, Options())
    try:
        got = walk_count(session.backend, target)
    except NotImplementedError as e:
        return Missing(f"{arch} backend not ready: {e}")
    if got != depth:
        raise AssertionError(f"the synthetic {arch} chain of {depth} frames walked {got}")
    return Chain(arch, depth, session.backend, target)


# --- ORC tables -------------------------------------------------------------------------------

@dataclass
class OrcSource:
    """The real x86-64 ORC table and where it came from."""

    table: Any
    label: str


@lru_cache(maxsize=None)
def real_orc_table() -> OrcSource | Missing:
    """The ORC table of a real x86-64 kernel: the committed slim image, else ``$UNWIND_BENCH_VMLINUX``,
    else the lab's fetched kernel. Quick mode uses a small random table instead (seconds matter there)."""
    from unwind.formats.image import Image, ImageError

    try:
        from unwind.arch.x86_64.orc import load_orc
    except ImportError as e:
        return Missing(f"no x86-64 ORC module: {e}")
    if QUICK:
        return OrcSource(_quick_table(), "random 20,000-entry ORC table (quick mode, not a kernel's)")
    cands: list[tuple[Path, str | None]] = []
    for slim in sorted((CORPORA / "x86_64").glob("*/vmlinux-*.slim*")):
        cands.append((slim, slim.parent.name))
    if os.environ.get(VMLINUX_ENV):
        cands.append((Path(os.environ[VMLINUX_ENV]), None))
    try:
        from unwind.lab.fetch import FetchError, find_kernel

        k = find_kernel("x86_64")
        cands.append((k.root / "vmlinux", k.release))
    except (ImportError, FetchError):
        pass
    for path, release in cands:
        if not path.exists():
            continue
        try:
            table = load_orc(Image(path), release)
        except ImageError:
            continue
        rel = f"{release} " if release else ""
        where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        return OrcSource(table, f"{rel}ORC table, {len(table):,} entries ({where})")
    return Missing("no x86-64 kernel image with ORC tables (commit corpora/x86_64/*/vmlinux-*.slim.xz "
                   f"or set ${VMLINUX_ENV})")


def _quick_table() -> Any:
    """A random 20,000-entry table over 4 MiB of text, for quick mode only."""
    from unwind.arch.x86_64.orc import ORC_REG_SP, ORC_REG_UNDEFINED, ORC_TYPE_CALL, OrcTable

    n, stext = 20_000, 0xFFFFFFFF81000000
    rng = np.random.default_rng(3)
    ips = np.sort(rng.integers(stext, stext + (4 << 20), size=n, dtype=np.uint64))
    cols = {"sp_offset": np.full(n, 8, np.int16), "bp_offset": np.zeros(n, np.int16),
            "sp_reg": np.full(n, ORC_REG_SP, np.uint8), "bp_reg": np.full(n, ORC_REG_UNDEFINED, np.uint8),
            "type": np.full(n, ORC_TYPE_CALL, np.uint8), "signal": np.zeros(n, bool)}
    return OrcTable(ips, cols, stext=stext, etext=stext + (4 << 20), version=4, how="quick")


@lru_cache(maxsize=None)
def subsampled_table(step: int) -> Any:
    """The real table keeping every ``step``-th entry (same text range), or :class:`Missing`."""
    src = real_orc_table()
    if isinstance(src, Missing):
        return src
    t = src.table
    if step == 1:
        return t
    cols = {name: getattr(t, name)[::step] for name in
            ("sp_offset", "bp_offset", "sp_reg", "bp_reg", "type", "signal")}
    return type(t)(t.ips[::step], cols, stext=t.stext, etext=t.etext, inittext=t.inittext,
                   version=t.version, how=f"every {step}th entry of {t.how}")


def uniform_text_ips(table: Any, n: int, seed: int = 7) -> np.ndarray:
    """``n`` uniformly random ips in ``[_stext, _etext)`` of ``table`` (fixed seed)."""
    rng = np.random.default_rng(seed)
    return rng.integers(table.stext, table.etext, size=n, dtype=np.uint64)


# --- the drgn peer ----------------------------------------------------------------------------

@dataclass
class PeerPair:
    """One stopped kernel twice: our dump and QEMU's full memory dump, with the debug vmlinux.

    ``image`` is what our replay reads: the committed slim image of the same build-id when there is
    one (as for the corpora), else the debug vmlinux.
    """

    arch: str
    dump: Path
    vmcore: Path
    vmlinux: Path
    image: Path


def peer_pairs() -> list[PeerPair] | Missing:
    """Pairs under ``$UNWIND_PEER_DUMPS``: ``NAME.vmcore`` + ``NAME.bin[.xz]`` (+ ``NAME.vmlinux`` or the
    lab's fetched kernel of the dump's release)."""
    folder = os.environ.get(PEER_ENV)
    if not folder:
        return Missing(f"no full memory dumps for the peer: set ${PEER_ENV} (see docs/benchmarks.md)")
    try:
        import drgn  # noqa: F401
    except ImportError:
        return Missing("drgn is not installed (pip install drgn)")
    from unwind.formats.dump import Dump

    pairs = []
    for core in sorted(Path(folder).glob("*.vmcore")):
        stem = core.name[:-len(".vmcore")]
        dumps = sorted(core.parent.glob(f"{stem}.bin*"))
        if not dumps:
            continue
        d = Dump.open(dumps[0])
        vmlinux = core.parent / f"{stem}.vmlinux"
        if not vmlinux.exists():
            try:
                from unwind.lab.fetch import FetchError, find_kernel

                vmlinux = find_kernel(d.arch, d.release).root / "vmlinux"
            except (ImportError, FetchError):
                continue
        slims = sorted((CORPORA / d.arch).glob(f"*/vmlinux-{d.build_id}.slim*")) if d.build_id else []
        pairs.append(PeerPair(d.arch, dumps[0], core, vmlinux, slims[0] if slims else vmlinux))
    return pairs or Missing(f"no NAME.vmcore + NAME.bin[.xz] pair with a vmlinux under {folder}")


@dataclass
class PeerWorkload:
    """The same tasks walked by us and by drgn."""

    arch: str
    label: str
    ours: list[Target]
    backend: ArchBackend
    ours_frames: int
    drgn_tasks: list[Any]
    drgn_trace: Callable[[Any], Any]
    drgn_frames: int
    left_out: int


@lru_cache(maxsize=None)
def peer_workload(arch: str) -> PeerWorkload | Missing:
    """Open the first pair of ``arch`` in both tools and pick the tasks both can walk."""
    pairs = peer_pairs()
    if isinstance(pairs, Missing):
        return pairs
    mine = [p for p in pairs if p.arch == arch]
    if not mine:
        return Missing(f"no {arch} peer pair under ${PEER_ENV}")
    pair = mine[0]
    import drgn
    from drgn.helpers.linux.pid import find_task
    from drgn.helpers.linux.sched import cpu_curr

    prog = drgn.Program()
    prog.set_core_dump(str(pair.vmcore))
    try:
        prog.load_debug_info([str(pair.vmlinux)])
    except drgn.MissingDebugInfoError:
        pass  # modules without debug info (qemu_fw_cfg): the kernel's own was loaded
    s = load_session(pair.dump, vmlinux=pair.image)
    tasks = s.select(every=True)
    if QUICK:
        tasks = tasks[:4]
    ours: list[Target] = []
    theirs: list[Any] = []
    left_out = 0
    for task in tasks:
        try:
            if task.running and task.cpu is not None:
                obj = cpu_curr(prog, task.cpu)
            elif task.pid:
                obj = find_task(prog, task.pid)
            else:
                left_out += 1  # an idle task that is not running: drgn cannot name it by pid
                continue
            if not obj:
                left_out += 1
                continue
            n = len(prog.stack_trace(obj))
        except (drgn.FaultError, ValueError, LookupError, NotImplementedError):
            left_out += 1
            continue
        if n > DRGN_MAX_FRAMES:
            left_out += 1
            continue
        theirs.append(obj)
        ours.append(s.target(task, Options()))
    if not ours:
        return Missing(f"drgn walked none of the {arch} tasks of {pair.vmcore.name}")
    try:
        mine_frames = walk_all(s.backend, ours)
    except NotImplementedError as e:
        return Missing(f"{arch} backend not ready: {e}")
    drgn_frames = drgn_all(prog.stack_trace, theirs)
    return PeerWorkload(arch, f"{pair.dump.name} + {pair.vmcore.name}", ours, s.backend, mine_frames, theirs,
                        prog.stack_trace, drgn_frames, left_out)


def drgn_all(trace: Callable[[Any], Any], tasks: list[Any]) -> int:
    """drgn's ``stack_trace`` of every task, reading each frame's pc; the total frames.

    drgn lists an inlined call as a frame of its own at the same pc; only the real frames (one per
    return address, as the kernel counts them) are counted.
    """
    n = 0
    for t in tasks:
        for frame in trace(t):
            frame.pc  # noqa: B018 - a user of the trace reads each pc
            n += not frame.is_inline
    return n


# --- the drgn peer in child processes (benches/speed_peer.py, replay_speed.py, batch_replay.py) --------------------

#: a child's preamble: ``unwind`` (and ``unwind.arch`` from ``arch/``) is imported from the checkout in ``argv[1]``
IMPORT_ROOT = r"""
import importlib.machinery, importlib.util, sys
ROOT = sys.argv[1]
class _Checkout:
    PLACES = {"unwind": ROOT + "/unwind", "unwind.arch": ROOT + "/arch"}
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        where = cls.PLACES.get(name)
        if where is None:
            return None
        return importlib.util.spec_from_file_location(name, where + "/__init__.py",
                                                      submodule_search_locations=[where])
sys.meta_path.insert(0, _Checkout)
import unwind
assert unwind.__file__.startswith(ROOT), unwind.__file__
"""

#: ``timed(fn, passes)``: the fastest of ``passes`` calls, CPU (``process_time``) and wall, each after ``gc.collect()``
TIMED = r"""
import gc, time
def timed(fn, passes):
    best_cpu = best_wall = 1e9
    for _ in range(passes):
        gc.collect()  # garbage of earlier work is not this call's cost
        c, w = time.process_time(), time.perf_counter()
        fn()
        best_cpu, best_wall = min(best_cpu, time.process_time() - c), min(best_wall, time.perf_counter() - w)
    return best_cpu, best_wall
"""

#: how both sides count a task's frames: those before its first pc outside the kernel half of the address
#: space (drgn walks on into the user frames of a task that entered from user space; those follow)
KERNEL_FRAMES = r"""
def kernel_part(pcs):
    for i, pc in enumerate(pcs):
        if not pc >> 63:
            return pcs[:i]
    return pcs
"""

#: ``walk_sets(walk, items, kernel_only, passes)``: the figures of a child, for every task and for the
#: kernel-only tasks (``kernel_only[i]`` true: no side walked a user frame of task ``i``)
WALK_SETS = r"""
def walk_sets(walk, items, pcs, kernel_only, passes):
    k_items = [t for t, k in zip(items, kernel_only) if k]
    out = {"tasks": len(items), "frames": sum(map(len, pcs)), "k_tasks": len(k_items),
           "k_frames": sum(len(p) for p, k in zip(pcs, kernel_only) if k)}
    out["warm"], out["warm_wall"] = timed(lambda: walk(items), passes)
    out["k_warm"], out["k_warm_wall"] = timed(lambda: walk(k_items), passes)
    return out
"""

#: drgn's ``stack_trace`` of the tasks of a vmcore, warm; run with a Python that has drgn.
#:
#: ``argv``: MODE VMCORE VMLINUX IMAGE PASSES WANT. The task list comes from a program with the full debug
#: ``VMLINUX`` (drgn finds tasks through DWARF types); IMAGE is the file MODE walks with (:func:`drgn_args`).
#: The modes, the drgn configurations of the peer table (:data:`DRGN_MODES`):
#:
#: - ``regs``, drgn's bare unwinder: a second program whose only kernel file is the slim image (ELF symbols,
#:   ORC on x86-64, no CFI and no DWARF: :func:`drgn_image`) walks ``stack_trace`` of a ``struct pt_regs``
#:   value built from the registers drgn itself starts each task with (frame 0 of the first program's trace);
#:   the ``pt_regs`` type is made with ``struct_type`` (its size, no members): no type lookups at all. Per
#:   frame: ORC on x86-64, the frame record on arm64; nothing looked up in DWARF.
#: - ``types``: a second program with the debug vmlinux whose CFI sections are hidden (:func:`hide_cfi`)
#:   walks the task itself: its layouts come from ``.debug_info`` in drgn's C, and it unwinds as ``regs``
#:   does (ORC on x86-64, frame pointers on arm64), plus, on every frame, the inline scopes of its pc
#:   looked up in ``.debug_info`` (drgn does that for each frame of a module with DWARF).
#: - ``orc``: the first program, as a user runs it, with ``DRGN_PREFER_ORC_UNWINDER=1`` (x86-64 only; arm64
#:   has no ORC): ORC, and every frame's inline scopes.
#: - ``dwarf``: the first program, drgn's default: DWARF CFI from ``.debug_frame``, and every frame's inline
#:   scopes.
#:
#: WANT is a JSON list of ``[pid, cpu or null, kernel_only]`` (empty: every task drgn walks). Everything
#: before the timed passes is set-up: both programs, the task list, the ``pt_regs`` values, one untimed
#: walk of every task (drgn parses its ORC and finds each pc's module on first use). A pass is every
#: task's ``stack_trace`` with each frame's ``pc`` read; drgn's inline frames are not counted.
DRGN_CHILD = TIMED + KERNEL_FRAMES + WALK_SETS + r"""
import json, os, struct, sys
mode, core, vmlinux, image, passes, want = sys.argv[1:7]
if mode != "dwarf":
    os.environ["DRGN_PREFER_ORC_UNWINDER"] = "1"  # ORC wherever there is ORC (regs and types have no CFI anyway)
import drgn
from drgn import Object
from drgn.helpers.linux.pid import for_each_task
from drgn.helpers.linux.sched import task_cpu
c0 = time.process_time()
def program(path):
    prog = drgn.Program()
    prog.set_core_dump(core)
    try:
        prog.load_debug_info([path])
    except drgn.MissingDebugInfoError:
        pass  # modules without debug info (qemu_fw_cfg): the kernel's own file was loaded
    return prog
full = program(vmlinux)
prog = program(image) if mode in ("regs", "types") else full
x86 = full.platform.arch == drgn.Architecture.X86_64
if mode == "regs":
    # struct pt_regs member -> drgn's register name; the offsets are the debug vmlinux's
    fields = ({m: "r" + m for m in ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip")}
              | {f"r{i}": f"r{i}" for i in range(8, 16)}) if x86 else {"sp": "sp", "pc": "pc"}
    pt = full.type("struct pt_regs")
    offsets = {name: drgn.offsetof(pt, m) for m, name in fields.items()}
    if not x86:
        offsets |= {f"x{i}": 8 * i for i in range(31)}  # regs[31] at the start of the arm64 pt_regs
    pt_regs = prog.struct_type("pt_regs", pt.size, ())
    def regs_object(frame):
        # frame 0's registers, and its pc (arm64 lists no pc register of a blocked task's frame)
        regs = {**frame.registers(), ("rip" if x86 else "pc"): frame.pc}
        buf = bytearray(pt.size)
        for name, value in regs.items():
            name = {"fp": "x29", "lr": "x30"}.get(name, name)
            if name in offsets:
                struct.pack_into("<Q", buf, offsets[name], value)
        return Object.from_bytes_(prog, pt_regs, bytes(buf))
elif mode == "types":
    task_ptr = prog.type("struct task_struct *")
wanted = {(k[0], k[1]): k[2] for k in json.loads(want)} if want else None
tasks, keys, failed = [], [], 0
for t in for_each_task(full):
    on_cpu = bool(t.on_cpu.value_()) if t.type_.type.has_member("on_cpu") else False
    key = (t.pid.value_(), task_cpu(t) if on_cpu else None)
    if wanted is not None and key not in wanted:
        continue
    try:
        if mode == "regs":
            obj = regs_object(full.stack_trace(t)[0])
        elif mode == "types":
            obj = Object(prog, task_ptr, t.value_())
        else:
            obj = t
        [f.pc for f in prog.stack_trace(obj)]
    except Exception:
        failed += 1  # drgn cannot walk it: left out of every side
        continue
    tasks.append(obj)
    keys.append(key)
set_up = time.process_time() - c0
pcs, user, names = [], [], {}
for t in tasks:
    frames = [f for f in prog.stack_trace(t) if not f.is_inline]
    pcs.append(kernel_part([f.pc for f in frames]))
    user.append(len(frames) - len(pcs[-1]))
    for f in frames[:len(pcs[-1])]:
        try:
            sym = f.symbol()
        except LookupError:
            continue
        names[f.pc] = f"{sym.name}+{f.pc - sym.address:#x}"
def walk(items):
    for t in items:
        for f in prog.stack_trace(t):
            f.pc
kernel_only = [wanted[k] for k in keys] if wanted else [not u for u in user]
out = walk_sets(walk, tasks, pcs, kernel_only, int(passes))
out.update({"mode": mode, "user_frames": sum(user), "failed": failed, "set_up": set_up, "keys": keys, "pcs": pcs,
            "user": user, "names": {f"{pc:#x}": n for pc, n in names.items()}})
print(json.dumps(out))
"""

#: the drgn configurations of the peer table, in the order a round runs them (``regs`` first: the bare unwinder)
DRGN_MODES = ("regs", "types", "orc", "dwarf")


def drgn_modes(arch: str) -> tuple[str, ...]:
    """The :data:`DRGN_MODES` of ``arch``: arm64 has no ORC, so ``orc`` would be ``dwarf`` again."""
    return DRGN_MODES if arch == "x86_64" else tuple(m for m in DRGN_MODES if m != "orc")


def drgn_args(mode: str, pc: PeerCore, passes: int, keys: str) -> tuple[str, ...]:
    """The ``argv`` of :data:`DRGN_CHILD` in ``mode`` on the peer vmcore ``pc``."""
    image = {"regs": pc.drgn_image, "types": pc.nocfi}.get(mode, pc.vmlinux)
    return (mode, str(pc.core), str(pc.vmlinux), str(image), str(passes), keys)
#: ``Session.replay(task, Options(), symbolize=False)`` of the tasks of a vmcore drgn walked, fresh and warm.
#:
#: ``argv``: ROOT ARCH VMCORE IMAGE PASSES WANT (as in :data:`DRGN_CHILD`); frames counted as there.
#: ``k_fresh``: the first pass over the kernel-only tasks in the Session just loaded (what a first replay
#: pays on top of the warm walk: the image's call-site verdicts, caches filled); then the warm passes.
OURS_PEER_CHILD = IMPORT_ROOT + TIMED + KERNEL_FRAMES + WALK_SETS + r"""
import json
from unwind.session.replay import Options, Session
s = Session.load(sys.argv[3], vmlinux=sys.argv[4])
wanted = {(k[0], k[1]): (i, k[2]) for i, k in enumerate(json.loads(sys.argv[6]))}
def key(t):
    return (t.pid, t.cpu if t.running else None)
todo = sorted((t for t in s.select(every=True) if key(t) in wanted), key=lambda t: wanted[key(t)][0])
c, w = time.process_time(), time.perf_counter()
for t in todo:
    if wanted[key(t)][1]:
        s.replay(t, Options(), symbolize=False)
k_fresh, k_fresh_wall = time.process_time() - c, time.perf_counter() - w
pcs, names = [], {}
for t in todo:
    frames = s.replay(t, Options()).frames
    pcs.append(kernel_part([f.pc for f in frames]))
    names.update((f"{f.pc:#x}", f.symbol) for f in frames if f.symbol)
def walk(items):
    for t in items:
        s.replay(t, Options(), symbolize=False)
out = walk_sets(walk, todo, pcs, [wanted[key(t)][1] for t in todo], int(sys.argv[5]))
out.update({"keys": [key(t) for t in todo], "pcs": pcs, "names": names, "k_fresh": k_fresh,
            "k_fresh_wall": k_fresh_wall})
print(json.dumps(out))
"""


#: the environment of a child of each build of ours (``unwind.accel``): the interpreted modules, or the
#: compiled build of this checkout's sources (made first with :func:`compiled_build`)
BUILD_ENV: dict[str, dict[str, str]] = {"pure": {"UNWIND_PURE": "1"}, "compiled": {"UNWIND_PURE": "0"}}


def compiled_build() -> str | None:
    """Make the compiled build of this checkout (``unwind accel build``) unless made; ``None`` when it is
    there, else why it cannot be (said on stderr by the caller)."""
    r = subprocess.run([sys.executable, "-c", IMPORT_ROOT + "from unwind import accel\naccel.build(jobs=2)\n",
                        str(REPO)], capture_output=True, text=True, env={**os.environ, "UNWIND_PURE": "0"})
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["failed"])[-1]


def run_child(python: str, code: str, *args: str, build: str | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh ``python`` with ``args`` (ours with ``build``'s :data:`BUILD_ENV`); the JSON
    object it printed last."""
    env = {**os.environ, **BUILD_ENV[build]} if build else os.environ
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"child failed ({python} {' '.join(args[:4])}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def unxz(src: Path, dst: Path) -> Path:
    """``src`` decompressed to ``dst`` (once)."""
    if not dst.exists():
        with lzma.open(src) as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
    return dst


def build_id(path: Path) -> str | None:
    """The GNU build-id note of an ELF file."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        for sec in ELFFile(f).iter_sections():
            if sec.header.sh_type == "SHT_NOTE":
                for note in sec.iter_notes():
                    if note.n_type == "NT_GNU_BUILD_ID":
                        return str(note.n_desc)
    return None


def drgn_image(slim: Path, out: Path) -> Path | None:
    """The slim image as drgn takes it for the kernel: the same ELF with an empty DWARF.

    drgn loads a file for the kernel only when it has ``.debug_info`` and ``.debug_abbrev``; the slim
    image's are emptied (NOBITS), so they are replaced by one zero byte each (no compilation unit: no
    types, no inline scopes). ``objcopy``'s generic ELF target writes ``e_machine`` 0, which drgn would
    not take for the dump's platform, so the input's ``e_machine`` and ``e_flags`` are copied back.
    ``None`` (said on stderr) without ``objcopy``.
    """
    if out.exists():
        return out
    zero = out.with_suffix(".zero")
    zero.write_bytes(b"\0")
    try:
        r = subprocess.run(["objcopy", "-I", "elf64-little", "-O", "elf64-little", "--remove-section=.debug_*",
                            f"--add-section=.debug_info={zero}", f"--add-section=.debug_abbrev={zero}",
                            str(slim), str(out)], capture_output=True, text=True)
    except FileNotFoundError:
        print("drgn's image needs objcopy (binutils): the drgn rows are not measured", file=sys.stderr)
        return None
    if r.returncode:
        print(f"objcopy failed on {slim}: {r.stderr.strip()}", file=sys.stderr)
        return None
    header = slim.read_bytes()[:64]
    with open(out, "r+b") as f:  # ELF64: e_machine at 18 (2 bytes), e_flags at 48 (4 bytes)
        f.seek(18)
        f.write(header[18:20])
        f.seek(48)
        f.write(header[48:52])
    return out


#: the sections drgn reads CFI from, and same-length names it does not look for
CFI_SECTIONS = {b".debug_frame": b".nocfi_frame", b".eh_frame": b".no_frame"}


def hide_cfi(vmlinux: Path, out: Path) -> Path | None:
    """A copy of the debug ``vmlinux`` whose CFI sections drgn does not find: ``.debug_frame`` and
    ``.eh_frame`` (``.eh_frame_hdr`` with it) renamed in place in the section-name table, everything else
    (``.debug_info``, the ORC tables, the symbols) as it was. ``None`` (said on stderr) when the copy has no
    section-name table to patch."""
    from elftools.elf.elffile import ELFFile

    if out.exists():
        return out
    with open(vmlinux, "rb") as f:
        elf = ELFFile(f)
        names = elf.get_section(elf.header["e_shstrndx"])
        start, size = names["sh_offset"], names["sh_size"]
    if not size:
        print(f"{vmlinux} has no section names: the drgn types row is not measured", file=sys.stderr)
        return None
    part = out.with_suffix(".part")
    shutil.copyfile(vmlinux, part)
    with open(part, "r+b") as f:
        f.seek(start)
        table = f.read(size)
        for name, hidden in CFI_SECTIONS.items():
            table = table.replace(name, hidden)
        f.seek(start)
        f.write(table)
    part.replace(out)
    return out


@dataclass(frozen=True)
class PeerCore:
    """One vmcore both sides read: ours with the slim image; drgn with ``drgn_image`` (mode ``regs``), the
    debug vmlinux with its CFI hidden (``nocfi``, mode ``types``) or the debug ``vmlinux`` itself."""

    arch: str
    name: str
    core: Path
    slim: Path
    vmlinux: Path
    drgn_image: Path
    nocfi: Path


def peer_cores(tmp: Path, arches: Iterable[str], vmlinux_dir: Path, vmcores: Path | None = None,
               corpora: Path = CORPORA) -> dict[str, list[PeerCore]]:
    """Per arch, the committed vmcores (``corpora/<arch>/<release>/vmcore/*.elf.xz``) whose release has a slim
    image and a debug vmlinux of the same build-id (``vmlinux_dir/<release>/vmlinux``, the lab's fetched
    kernels); drgn has no riscv unwinder. A committed vmcore is a slice of the lab's, cut to the pages our
    walk and drgn's task list read; where the lab's full vmcore of the same stop is at hand
    (``vmcores/<arch>/<stop>.elf``) both sides read that one: on a slice drgn's walk on into user frames
    reads pages the slice left out."""
    found: dict[str, list[PeerCore]] = {}
    for arch in arches:
        if arch == "riscv":
            continue
        for xz in sorted((corpora / arch).glob("*/vmcore/*.elf.xz")):
            release = xz.parent.parent
            slims = sorted(release.glob("vmlinux-*.slim*"))
            vmlinux = vmlinux_dir / release.name / "vmlinux"
            if not slims or not vmlinux.exists():
                continue
            slim = unxz(slims[0], tmp / f"{release.name}.slim") if slims[0].suffix == ".xz" else slims[0]
            if build_id(slim) != build_id(vmlinux):
                continue
            image = drgn_image(slim, tmp / f"{release.name}.drgn-image")
            nocfi = hide_cfi(vmlinux, tmp / f"{release.name}.nocfi")
            if image is None or nocfi is None:
                continue
            stop = xz.name[:-len(".xz")]
            whole = vmcores / arch / stop if vmcores else None
            core = whole if whole is not None and whole.exists() else unxz(xz, tmp / f"{release.name}-{stop}")
            found.setdefault(arch, []).append(PeerCore(arch, f"{release.name}/{stop}", core, slim, vmlinux, image,
                                                          nocfi))
    return found


def peer_keys(drgn_python: str, pc: PeerCore) -> tuple[list[list[Any]], dict[str, int]] | None:
    """The tasks every side walks, as ``[pid, cpu or None, kernel_only]``: those drgn walks in every mode of
    :func:`drgn_modes` with at most :data:`DRGN_MAX_FRAMES` kernel frames (drgn's DWARF unwinder loops on
    some arm64 stacks); ``kernel_only`` when no mode walked on into user frames. Also how many were left
    out, and why; ``None`` (said on stderr) when drgn cannot list the vmcore's tasks (a kdump slice)."""
    runs = []
    for mode in drgn_modes(pc.arch):
        try:
            runs.append(run_child(drgn_python, DRGN_CHILD, *drgn_args(mode, pc, 0, "")))
        except SystemExit as e:
            print(f"drgn left out {pc.name}: {str(e).strip().splitlines()[-1]}", file=sys.stderr)
            return None
    seen = [{tuple(k): (len(p), u) for k, p, u in zip(r["keys"], r["pcs"], r["user"])} for r in runs]
    every = [k for k in seen[0] if all(k in s for s in seen[1:])]
    keys = [[*k, not any(s[k][1] for s in seen)] for k in every
            if max(s[k][0] for s in seen) <= DRGN_MAX_FRAMES]
    return keys, {"drgn failed": sum(r["failed"] for r in runs),
                  "walked by some drgn modes only": len(set().union(*seen)) - len(every),
                  f"drgn past {DRGN_MAX_FRAMES} kernel frames": len(every) - len(keys)}


def same_pcs(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, int, list[tuple[Any, list[int], list[int]]]]:
    """Of the tasks two children both walked: how many have the same kernel pcs, how many were compared, and
    the tasks that differ (key, pcs of ``a``, pcs of ``b``)."""
    theirs = {tuple(k): p for k, p in zip(b["keys"], b["pcs"])}
    same, compared, differ = 0, 0, []
    for k, p in zip(a["keys"], a["pcs"]):
        q = theirs.get(tuple(k))
        if q is None:
            continue
        compared += 1
        if p == q:
            same += 1
        else:
            differ.append((k, p, q))
    return same, compared, differ
