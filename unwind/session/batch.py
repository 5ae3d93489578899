"""Batch replay: every task of one or many dumps walked at once, in numpy lockstep.

The scalar walk (:meth:`unwind.session.replay.Session.replay`) is the rule. A backend's
batch walk (``arch/<arch>/batch.py``, reached through
:meth:`unwind.core.registry.ArchBackend.batch_walk`) takes only its unwinder's one
plain step (arm64: ``unwind_next_frame_record()``), over all lanes at once, with
the same helpers and constants the scalar step uses, and the walk's natural
ends (riscv and x86-64: user-mode registers too). The moment anything else
applies to a lane (another exception boundary, a return-address recovery, a
stack transition, a read outside the lane's captured segment, an end it does
not recognise) it hands the lane back, and that task is walked by
``Session.replay``: a batch replay is the scalar replay, task for task.

Tasks that need a mode the batch does not take (``complete``, ``record``,
``user``, the reliable walk) are walked by the scalar path from the start.

A batch walk reports frames and stops as arrays; :class:`BatchReplay` builds
each task's :class:`~unwind.session.result.Replay` (frames, stop, basis, call-site flags)
when it is read.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, overload
import weakref
from array import array
from itertools import chain, compress
from weakref import WeakKeyDictionary

import numpy as np

try:
    import cython  # cython.compiled: whether this module runs compiled (Cython's stand-in when interpreted)
except ImportError:
    from unwind.core import nocython as cython

from unwind.formats.dump import Dump
from unwind.core.dumpinfo import DumpInfo
from unwind.core.frame import Flag, Frame, Source
from unwind.core.memory import Memory
from .result import Replay
from unwind.core.target import Options, Task
from unwind.core.walk import Stop, StopReason

if TYPE_CHECKING:
    from unwind.core.callsite import CallSiteChecker
    from .replay import Session

#: the options a batch walk takes; any other one set sends every task to the scalar path
BATCH_OPTIONS = frozenset({"generation", "orc_version"})

_U64 = np.uint64
#: the array typecode of a 64-bit unsigned word: ``L`` where it is 64 bits (CPython converts a large int to an
#: unsigned long in half the time it takes for an unsigned long long), else ``Q``
_WORD = "L" if array("L").itemsize == 8 else "Q"
_BOUNDARY = Flag.BOUNDARY.value
_FLAGS = tuple(Flag(value) for value in range(max(f.value for f in Flag) << 1))


def batch_options(options: Options) -> bool:
    """Does a batch walk take ``options``? Only the defaults and the generation overrides."""
    return not (options.complete or options.record or options.user)


@dataclass(slots=True)
class Job:
    """One dump's share of a batch: its session, the tasks to walk, the options."""

    session: "Session"
    tasks: list[Task]
    options: Options


#: the most words a batch step reads from one address: arm64's frame_record_meta {fp, lr, type}
READ_WORDS = 3


class FlatMemory:
    """The captured segments a batch's lanes read, as one array of little-endian words.

    Every segment of the memories given is in one table (``seg_mem``: each segment's memory, an index into
    those given; ``starts``, ``ends``), and each lane is given the segment of its memory that holds its first
    address (:meth:`holding`). A lane reads only from the one segment it was given, and checks ``[start,
    end)`` (:attr:`lane_segments`) before every read: nothing is read outside a segment.

    Each segment is placed so that an 8-aligned address is a whole word: the word of address ``a`` in a
    lane's segment is ``base + (a - origin) // 8``. Where every segment is in one chunk of the
    :class:`~unwind.core.memory.SegmentArena` (as a dump's and a vmcore's are when read), :attr:`words` are that
    chunk's, each segment where the arena put it: nothing is copied. Otherwise only the segments lanes start in
    are copied into :attr:`words` (in the corpora a fifth to a quarter of the bytes are in others: the stacks of
    running tasks, which the scalar walk takes, and the per-CPU stacks), in one pass over the segments (numpy
    calls per memory would cost more than the copy).
    """

    def __init__(self, memories: Sequence[Memory], mem: np.ndarray, addr: np.ndarray) -> None:
        held = {id(memory.chunk): memory.chunk for memory in memories if memory.segments}
        chunk = next(iter(held.values())) if len(held) == 1 else None
        table = array("Q")
        for memory in memories:  # each memory's packed segment table (Memory.table), end to end
            table += memory.table
        self.seg_mem = np.repeat(np.arange(len(memories), dtype=np.int64),
                                 [len(memory.segments) for memory in memories])
        self.starts, self.ends, places = np.frombuffer(table, _U64).reshape(-1, 3).T.copy()
        seg = self.holding(mem, addr)
        found = seg >= 0
        lanes_of = np.bincount(seg[found], minlength=len(self.starts))
        used = np.flatnonzero(lanes_of)  # the segments lanes start in, in table order
        seg_start, seg_end = self.starts.take(used), self.ends.take(used)
        if chunk is not None:  # the arena placed each segment at an offset congruent to its start modulo 8
            self.words = np.frombuffer(chunk, "<u8")
            origins = seg_start & ~_U64(7)
            bases = (places.take(used) - (seg_start & _U64(7))).view(np.int64) >> 3
        else:
            pieces = [piece.data for memory in memories for piece in memory.segments]
            self.words, origins, bases = self.copied([pieces[s] for s in used.tolist()], seg_start, seg_end)
        # per lane: its segment's place among the words; a lane in no segment gets the empty segment [0, 0)
        if not len(used):
            n = len(addr)
            self.lane_segments = (np.zeros(n, _U64), np.zeros(n, _U64), np.zeros(n, _U64), np.zeros(n, np.int64))
        else:
            at = (np.cumsum(lanes_of != 0) - 1).take(seg, mode="clip")
            zero = _U64(0)
            self.lane_segments = (np.where(found, seg_start.take(at), zero), np.where(found, seg_end.take(at), zero),
                                  np.where(found, origins.take(at), zero), np.where(found, bases.take(at), 0))

    @staticmethod
    def copied(pieces: list[bytes], seg_start: np.ndarray, seg_end: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The segments' bytes ``pieces`` (at ``[seg_start, seg_end)``) copied into one array of words, each padded
        to whole words: ``(words, origins, bases)``."""
        sizes = seg_end - seg_start
        if not ((seg_start | sizes) & _U64(7)).any():  # the usual case: stacks are captured in whole words
            origins = seg_start
            words = (sizes >> _U64(3)).astype(np.int64)
            bases = np.cumsum(words) - words
        else:
            padded: list[bytes] = []
            base_list, total = [], 0
            for start, data in zip(seg_start.tolist(), pieces):
                pad = start & 7
                tail = -(pad + len(data)) & 7
                padded += [bytes(pad), data, bytes(tail)]
                base_list.append(total)
                total += (pad + len(data) + tail) >> 3
            pieces = padded
            origins = seg_start & ~_U64(7)
            bases = np.array(base_list, np.int64)
        # never empty: a refused lane reads (and drops) a word somewhere in it (:func:`word_index`)
        pieces.append(bytes(8 * READ_WORDS))
        return np.frombuffer(b"".join(pieces), "<u8"), origins, bases

    @staticmethod
    def word_delta(origin: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Per lane, what turns an 8-aligned address of its segment into its word's index: the word of
        ``a`` is ``(a >> 3) - delta`` (as int64; :func:`word_index`)."""
        return (origin >> _U64(3)).view(np.int64) - base

    @classmethod
    def of(cls, memories: list[Memory], mem: np.ndarray, addr: np.ndarray) -> "FlatMemory":
        """The flat memory of ``memories`` for lanes starting at ``addr`` of memory ``mem``: the last batch's
        again when its lanes started at the same places of the same memories (a dump's memory does not
        change), else a new one."""
        global _LAST_FLAT
        last = _LAST_FLAT
        if (last is not None and len(last[0]) == len(memories) and all(ref() is m for ref, m in zip(last[0], memories))
                and np.array_equal(last[1], mem) and np.array_equal(last[2], addr)):
            return last[3]
        _LAST_FLAT = last = None  # its words freed first: the allocator can give their pages to the new ones
        flat = cls(memories, mem, addr)
        _LAST_FLAT = ([weakref.ref(m) for m in memories], mem.copy(), addr.copy(), flat)
        return flat

    def holding(self, mem: np.ndarray, addr: np.ndarray) -> np.ndarray:
        """The segment (an index into the table) of memory ``mem[k]`` (an index into the memories given) holding
        ``addr[k]``, for each lane ``k``; -1 for an address in no segment of its memory."""
        n, nseg = len(addr), len(self.starts)
        if not nseg:
            return np.full(n, -1, np.int64)
        # (memory, address) as one sorted key: the memory's number, then the address's rank among all the segment
        # starts (how many are at or below it: an address ranks below a start above it, not below one at or
        # below it); the segments' keys rise through the table, memory after memory
        ranks = np.sort(self.starts)
        scale = nseg + 1
        seg_key = self.seg_mem * scale + ranks.searchsorted(self.starts, "right")
        # the last segment at or below each address: the one holding it, when it is of the lane's memory
        cand = seg_key.searchsorted(mem * scale + ranks.searchsorted(addr, "right"), "right") - 1
        found = ((cand >= 0) & (self.seg_mem.take(cand, mode="clip") == mem)
                 & (addr < self.ends.take(cand, mode="clip")))
        return np.where(found, cand, -1)


def word_index(addr: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """The word index of each lane's 8-aligned ``addr`` (:meth:`FlatMemory.word_delta`). A lane whose read
    is refused gets some index, which ``words.take(index, mode="clip")`` keeps inside the words: its value is
    dropped."""
    return (addr >> _U64(3)).view(np.int64) - delta


#: the memories of the last batch (weakly), each lane's memory and first address, and their flat memory
_LAST_FLAT: "tuple[list[weakref.ref[Memory]], np.ndarray, np.ndarray, FlatMemory] | None" = None


def locate_lanes(jobs: Sequence[Job], lane_job: np.ndarray, lane_tasks: Sequence[Task], addr: np.ndarray
                 ) -> tuple[FlatMemory, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The memory each lane's walk reads (``Session.task_memory(task)``, what its scalar walk reads: all of
    the dump's unless the dump gives each task its own, :meth:`~unwind.formats.dump.Dump.task_memory`) as one
    :class:`FlatMemory`, and per lane the segment holding ``addr``: ``(flat, start, end, origin, base)``
    (:attr:`FlatMemory.lane_segments`).

    ``lane_job`` and ``lane_tasks`` are each lane's job index and task, grouped by job.
    """
    memories: list[Memory] = []
    index: dict[int, int] = {}
    mem_of = array("q")
    lo = 0
    for job, count in zip(jobs, np.bincount(lane_job, minlength=len(jobs)).tolist()):
        if not count:
            continue
        dump = job.session.dump
        if getattr(dump.task_memory, "__func__", None) is Dump.task_memory:  # the dump's one memory, every task's
            mems = [dump.memory]
        else:  # a vmcore's task snapshots (made once per task and kept with the session), or a caller's memories
            mems = list(map(job.session.task_memory, lane_tasks[lo:lo + count]))
        ids = list(map(id, mems))
        if ids.count(ids[0]) != len(ids):
            for key, mem in zip(ids, mems):
                if key not in index:
                    index[key] = len(memories)
                    memories.append(mem)
                mem_of.append(index[key])
        else:  # one memory serves all the job's tasks
            if ids[0] not in index:
                index[ids[0]] = len(memories)
                memories.append(mems[0])
            mem_of.extend(array("q", [index[ids[0]]]) * count)
        lo += count
    flat = FlatMemory.of(memories, np.frombuffer(mem_of, np.int64), addr)
    return (flat, *flat.lane_segments)


#: what a stop code stands for: the reason, and the detail made from the task's target, the dump's
#: constants (:meth:`Recorder.dump`) and the lane's stop arguments (up to :data:`STOP_ARGS` words)
StopKind = tuple[StopReason, Callable[..., str]]
STOP_ARGS = 3


class Recorder:
    """What an arch's batch walk reports: frames step by step, then each lane's stop or hand-back.

    ``sources`` and ``stops`` are the arch's tables; frames and stops refer to them by index.
    Stack labels are interned here (:meth:`label`).
    """

    def __init__(self, lanes: int, sources: Sequence[Source], stops: Sequence[StopKind]) -> None:
        self.lanes = lanes
        self.sources = tuple(sources)
        self.stop_kinds = tuple(stops)
        self.labels: list[str | None] = []
        self._label_index: dict[str | None, int] = {}
        self._parts: list[tuple] = []
        self._stops: list[tuple[np.ndarray, int, tuple[np.ndarray, ...]]] = []
        self._extras: list[tuple[np.ndarray, str, np.ndarray]] = []
        self.stop_code = np.full(lanes, -1, np.int64)  # -1: walked by the scalar path
        self.stop_args = np.zeros((lanes, STOP_ARGS), _U64)
        self.constants: dict[int, DumpConstants] = {}

    def label(self, text: str | None) -> int:
        """The index of stack label ``text`` (``None``: no stack known)."""
        i = self._label_index.get(text)
        if i is None:
            i = self._label_index[text] = len(self.labels)
            self.labels.append(text)
        return i

    def frames(self, index: int, lanes: np.ndarray, go: np.ndarray, pc: np.ndarray, *, sp: np.ndarray | None = None,
               fp: np.ndarray | None = None, flags: np.ndarray | int = 0, source: np.ndarray | int = 0,
               stack: np.ndarray | int = 0) -> None:
        """Frame ``index`` (each lane's first is 0) of each of ``lanes`` where ``go``: a lockstep step, in
        which every lane walked so far has as many frames. ``sp``/``fp`` are ``None`` where the unwinder
        does not know them.

        The arrays are kept as they are, to be read at :meth:`finish`: a walk makes new ones each step
        (it never writes into one it gave here). A row of a larger array keeps that array whole until then, so
        a walk hands its lane numbers as an array of their own, not as a row of its state.
        """
        self._parts.append((go, index, lanes, pc, 0 if sp is None else sp, sp is not None, 0 if fp is None else fp,
                            fp is not None, flags, source, stack))

    def stop(self, lanes: np.ndarray, code: int, *args: np.ndarray) -> None:
        """The walk of ``lanes`` ended: stop kind ``code`` (an index into ``stops``), whose detail is made
        from the task's target and ``args`` (one word per lane each). Kept as given: :meth:`finish` writes
        every stop into :attr:`stop_code` and :attr:`stop_args` at once (a lane's walk ends once)."""
        self._stops.append((lanes, code, args))

    def last_frame_extra(self, lanes: np.ndarray, key: str, values: np.ndarray) -> None:
        """The last frame reported of each of ``lanes`` (whose walk ends there) carries ``{key: value}`` in its
        ``extra``, as the scalar walk adds it to the frame before its stop (x86-64: ``user_regs``)."""
        self._extras.append((lanes, key, values))

    def _write_stops(self) -> None:
        """Each stopped lane's code and arguments, from the stops reported (an argument a stop kind does not
        have is 0)."""
        stops = self._stops
        if not stops:
            return
        reported = [lanes for lanes, _, _ in stops]
        sizes = list(map(len, reported))
        lanes = np.concatenate(reported)
        self.stop_code[lanes] = np.repeat(np.array([code for _, code, _ in stops], np.int64), sizes)
        for i in range(max(len(args) for _, _, args in stops)):
            self.stop_args[lanes, i] = np.concatenate(
                [args[i] if i < len(args) else np.zeros(n, _U64) for (_, _, args), n in zip(stops, sizes)],
                dtype=_U64, casting="unsafe")

    def dump(self, job: int, constants: "DumpConstants") -> None:
        """The arch's per-dump constants of ``job``'s tasks: each stop detail is handed them, and each replay
        reads what the walks followed from them (:attr:`DumpConstants.basis`)."""
        self.constants[job] = constants

    def finish(self) -> "Walked":
        """The frames of every step, each lane's count, and the pcs and flags the call-site check reads;
        the frames are put in task order when the replays are read (:meth:`Walked.lists`)."""
        self._write_stops()
        parts = self._parts
        sizes = [len(part[0]) for part in parts]
        # every part's field end to end (one array per field, not one per part), the frames of every part
        # selected at once
        go = np.flatnonzero(_joined([part[0] for part in parts], sizes, bool))
        lane = _joined([part[2] for part in parts], sizes, np.int64).take(go)
        counts = np.bincount(lane, minlength=self.lanes)
        offsets = np.zeros(self.lanes + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return Walked(self, sizes, go, lane, self.field(3, _U64, go, sizes),
                      self.field(8, np.int64, go, sizes), counts, offsets)

    def field(self, k: int, dtype: type, go: np.ndarray, sizes: list[int]) -> np.ndarray:
        """Field ``k`` of the frames reported (the parts' ``k``-th item, ``go`` selecting), in step order."""
        values = [part[k] for part in self._parts]
        if values and all(not isinstance(v, np.ndarray) and v == values[0] for v in values):
            return np.full(len(go), values[0], dtype)  # one value for every frame: nothing to join or select
        return _joined(values, sizes, dtype).take(go)


def _joined(values: list[np.ndarray | int | bool], sizes: list[int], dtype: type) -> np.ndarray:
    """``values`` (an array, or one value for all, per part of ``sizes`` lanes) end to end."""
    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values, dtype=dtype, casting="unsafe") if values else np.zeros(0, dtype)
    out = np.repeat(np.array([0 if isinstance(v, np.ndarray) else v for v in values], dtype), sizes)
    pos = 0
    for v, n in zip(values, sizes):
        if isinstance(v, np.ndarray):
            out[pos:pos + n] = v
        pos += n
    return out


class DumpConstants:
    """What every batch walk of one dump shares (an arch subclasses it with its own fields and
    :meth:`read`); :meth:`of` reads them once per session and option key."""

    __slots__ = ("basis_of", "_basis")

    #: the scalar unwinder's :meth:`~unwind.core.walk.Unwinder.basis` (of the dump's first task): what every walk
    #: of the dump followed
    basis_of: Callable[[], dict[str, str]]

    @property
    def basis(self) -> dict[str, str]:
        """What the walks followed, made when a replay first reads it (x86-64 names a ``pt_regs`` derived
        from the dump's stacks, which the lockstep walk itself never reads)."""
        try:
            return self._basis
        except AttributeError:
            self._basis = self.basis_of()
            return self._basis

    @classmethod
    def of(cls, job: Job) -> "DumpConstants | None":
        """The constants of ``job``'s dump under its options (kept with the session, and with the image for
        the dumps that read alike: :meth:`inputs`); ``None``: the batch cannot take the dump, all its tasks go
        to the scalar walk."""
        known = _CONSTANTS.setdefault(job.session, {})
        key = (cls, cls.key(job.options))
        if key not in known:
            known[key] = cls._shared(job)
        return known[key]

    @classmethod
    def _shared(cls, job: Job) -> "DumpConstants | None":
        """:meth:`read` once per image and :meth:`inputs`: the constants of an earlier dump whose inputs are equal."""
        inputs = cls.inputs(job) if job.session.image is not None else None
        if inputs is None:
            return cls.read(job)
        seen = _SHARED.setdefault(job.session.image, [])
        for other, constants in seen:
            if other == inputs:
                return constants
        constants = cls.read(job)
        if len(seen) < _SHARED_PER_IMAGE and cls.shareable(constants):
            seen.append((inputs, constants))
        return constants

    @staticmethod
    def key(options: Options) -> object:
        """What of ``options`` the constants depend on."""
        return options.generation

    @classmethod
    def inputs(cls, job: Job) -> object | None:
        """Everything :meth:`read` reads of ``job`` besides its image, compared by equality: dumps of one
        image with equal inputs share their constants. ``None`` (the default): read per dump (the constants
        read the dump's stacks or memory, or an object of the session's own)."""
        return None

    @staticmethod
    def shareable(constants: "DumpConstants | None") -> bool:
        """Do ``constants``, read for one dump, hold for every dump with its inputs (``False`` where what was read
        came from the dump's own stacks after all)?"""
        return True

    @classmethod
    def read(cls, job: Job) -> "DumpConstants | None":
        """The constants, read from a scalar unwinder of ``job``'s first task. Constants shared between dumps
        (:meth:`inputs`) hold nothing of the session's: no target, no unwinder."""
        raise NotImplementedError


_CONSTANTS: "WeakKeyDictionary[Session, dict[tuple, DumpConstants | None]]" = WeakKeyDictionary()

#: the dump's facts that constants may read: :class:`~unwind.core.dumpinfo.DumpInfo` up to what the note says
#: of its CPUs, stacks and blocked tasks (its last fields, which a walk reads per task)
_DUMP_FACTS = slice(DumpInfo._fields.index("cpus"))


def dump_inputs(cls: type[DumpConstants], job: Job) -> object | None:
    """The inputs (:meth:`DumpConstants.inputs`) of constants read from the :class:`~unwind.core.target.Target`
    fields ``Session.target()`` fills, less the task, its memory and the note's per-task facts: the options'
    key, VMCOREINFO and the dump's facts (release, pinned generation, symbol hints, offsets, modules); the
    symbols must be the image's own (``None`` otherwise: a System.map, or the symbols of the dump's modules)."""
    session = job.session
    if session.image is None or session.symbols is not session.image.symbols:
        return None
    dump = session.dump
    return cls, cls.key(job.options), dump.vmcoreinfo, dump.info[_DUMP_FACTS]


#: per image: the inputs (:meth:`DumpConstants.inputs`) and constants of the dumps read so far
_SHARED: "WeakKeyDictionary[object, list[tuple[object, DumpConstants | None]]]" = WeakKeyDictionary()
#: the most kinds of inputs kept per image (dumps of one kernel differ in few: their VMCOREINFO, the options)
_SHARED_PER_IMAGE = 16


class Lanes(NamedTuple):
    """The tasks of a batch an arch's plain step takes (:func:`gather_lanes`)."""

    recorder: Recorder
    #: each job's per-dump constants (``None``: all its tasks go to the scalar walk)
    constants: list[Any]
    #: the lanes' words (:meth:`LaneReader.lane`) as ``uint64``, one row per word; ``None``: no lane
    columns: np.ndarray | None
    #: each lane's number (its task's place in the batch) and its job
    lanes: np.ndarray
    job_of: np.ndarray
    #: the tasks the lanes walk, in lane order
    tasks: list[Task]

    def per_lane(self, values: Callable[[Any], object], dtype: type = _U64) -> np.ndarray:
        """``values(constants)`` of each lane's job, as one array over the lanes."""
        return np.array([values(c) if c is not None else 0 for c in self.constants], dtype).take(self.job_of)

    def of_numbers(self, numbers: np.ndarray, per_job: np.ndarray, rows: Sequence[np.ndarray]) -> np.ndarray:
        """The values of the lanes numbered ``numbers`` (``int64``: lanes a lockstep has narrowed carry their
        numbers), one column a lane: ``per_job``'s row of each lane's job (one row per job) as rows, then ``rows``
        (values over the lanes, along their last axis)."""
        at = self.lanes.searchsorted(numbers)
        return np.vstack([per_job.take(self.job_of.take(at), axis=0).T, *(row.take(at, axis=-1) for row in rows)])


class LaneReader:
    """How an arch's plain step reads the tasks it takes (:func:`gather_lanes`): :attr:`width` words a lane,
    written by :meth:`lane`."""

    #: the words of one lane
    width = 0

    def lane(self, task: Task, words: MutableSequence[int], at: int) -> bool:
        """Does the plain step take ``task``? If so its words are written to ``words[at:at + width]``."""
        raise NotImplementedError


def read_lanes(reader: LaneReader, tasks: Sequence[Task], words: MutableSequence[int], taken: bytearray,
               first: int) -> None:
    """``reader.lane()`` of each of ``tasks``, the first at lane ``first``: ``taken[n]`` says whether the plain
    step takes the task of lane ``n``. A word that is no u64 (the note allows none) leaves its task no lane:
    the scalar walk says what it is."""
    width = reader.width
    n = first
    for task in tasks:
        try:
            taken[n] = reader.lane(task, words, n * width)
        except (OverflowError, TypeError):
            taken[n] = False
        n += 1


def gather_lanes(jobs: Sequence[Job], sources: Sequence[Source], stops: Sequence[StopKind],
                 constants: type[DumpConstants], reader: LaneReader) -> Lanes:
    """The recorder of every task of ``jobs``, each job's per-dump constants, and the lanes: the tasks of
    jobs with constants that ``reader`` takes.

    Every task's words go into one buffer (of :data:`_WORD` words) as they are read, so no task's words are
    Python objects in between."""
    total = sum(len(job.tasks) for job in jobs)
    rec = Recorder(total, sources, stops)
    consts = [constants.of(job) if job.tasks else None for job in jobs]
    words = array(_WORD, bytes(8 * reader.width * total))
    taken = bytearray(total)
    first = 0
    for n, (job, c) in enumerate(zip(jobs, consts)):
        if c is not None:
            rec.dump(n, c)
            read_lanes(reader, job.tasks, words, taken, first)
        first += len(job.tasks)
    lanes = np.flatnonzero(np.frombuffer(taken, np.bool_))
    if not len(lanes):
        return Lanes(rec, consts, None, lanes, lanes, [])
    columns = np.frombuffer(words, _U64).reshape(total, reader.width).T.take(lanes, axis=1)
    tasks = list(compress(chain.from_iterable(job.tasks for job in jobs), taken))
    return Lanes(rec, consts, columns, lanes, lane_jobs(jobs).take(lanes), tasks)


@dataclass(slots=True)
class Walked:
    """A finished batch walk: the frames in step order (each step's in lane order), and per lane its frame
    count and where its frames start once in task order."""

    recorder: Recorder
    _sizes: list[int]
    #: which of the parts' lanes reported a frame
    _go: np.ndarray
    #: per frame, in step order: its lane, pc and flags (the call-site check adds its bits to these)
    lanes: np.ndarray
    pcs: np.ndarray
    flags: np.ndarray
    #: per lane: frames reported, and where they start in task order
    counts: np.ndarray
    offsets: np.ndarray
    _lists: tuple[list[Frame], list[int], list[list[int]]] | None = None
    _stop_codes: list[int] | None = None

    def stop_codes(self) -> list[int]:
        """Each lane's stop code (-1: walked by the scalar path) as a list (made once, when first read)."""
        if self._stop_codes is None:
            self._stop_codes = self.recorder.stop_code.tolist()
        return self._stop_codes

    def lists(self) -> tuple[list[Frame], list[int], list[list[int]]]:
        """What the replays read (made once, when the first replay is built): every frame as a
        :class:`~unwind.core.frame.Frame` in task order, per lane its first frame's index (and the end's) and
        its stop arguments."""
        if self._lists is None:
            rec, go, sizes = self.recorder, self._go, self._sizes
            # each frame at its lane's offset plus its index among the lane's frames; the frame (in step order) at
            # each place in task order
            index = np.repeat(np.array([part[1] for part in rec._parts], np.int64), sizes).take(go)
            order = np.empty(len(index), np.int64)
            order[self.offsets[self.lanes] + index] = np.arange(len(index))

            def ordered(values: np.ndarray, known: np.ndarray | None = None) -> list:
                """``values`` in task order as Python ints, ``None`` where not ``known``."""
                if known is None or known.all():
                    return values.take(order).tolist()
                if not known.any():
                    return [None] * len(order)
                col = values.astype(object)
                col[~known] = None
                return col.take(order).tolist()

            def named(codes: np.ndarray, table: Sequence[object]) -> list:
                """What each of ``codes`` (indices into ``table``) stands for, in task order."""
                objects = np.empty(len(table), object)
                objects[:] = table
                return objects.take(codes.take(order)).tolist()
            field = rec.field
            frames = list(map(Frame, ordered(self.pcs),
                              ordered(field(4, _U64, go, sizes), field(5, bool, go, sizes)),
                              ordered(field(6, _U64, go, sizes), field(7, bool, go, sizes)),
                              named(field(9, np.int64, go, sizes), rec.sources),
                              named(field(10, np.int64, go, sizes), rec.labels), named(self.flags, _FLAGS)))
            offsets = self.offsets.tolist()
            for lanes, key, values in rec._extras:
                for lane, value in zip(lanes.tolist(), values.tolist()):
                    frames[offsets[lane + 1] - 1].extra = {key: value}
            self._lists = (frames, offsets, rec.stop_args.tolist())
        return self._lists


#: 2**64 divided by the golden ratio: a key times it, its top bits taken, is the key's slot (Fibonacci hashing)
_FIBONACCI = _U64(0x9E3779B97F4A7C15)


class Memo:
    """Answers of a function of one word, for lookups over many lanes at once; keys it has not seen are
    answered by ``compute`` (given them distinct, in ascending order), once each.

    A batch's lanes share most of their return addresses, so each is decided once, not once per lane. A
    direct-mapped table holds, in each of its slots, a key last looked up there and its answer, so a key found
    there costs two ``take``s. Keys that missed are written to their slots at once (one key stays in a slot:
    the lanes of a key that lost its slot to another try again), which also finds them each once, with no sort.
    Every answer computed is kept (:attr:`answers`), so a key that lost its slot is not computed again. A memo
    past :attr:`LIMIT` answers starts over (mutated stacks bring words without end); the table keeps its
    answers, which do not change.
    """

    LIMIT = 1 << 16
    #: the table has ``2 ** SLOT_BITS`` slots
    SLOT_BITS = 12

    __slots__ = ("answers", "slot_keys", "slot_values", "__weakref__")

    def __init__(self) -> None:
        self.answers: dict[int, int] = {}
        # an empty slot holds a key whose slot it is not: 0 (whose slot is 0) everywhere, 1 in slot 0
        self.slot_keys = np.zeros(1 << self.SLOT_BITS, _U64)
        self.slot_keys[0] = 1
        self.slot_values = np.zeros(1 << self.SLOT_BITS, np.int64)

    def slot_of(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot in the table."""
        slot = keys * _FIBONACCI
        slot >>= _U64(64 - self.SLOT_BITS)
        return slot.view(np.int64)  # below 2 ** SLOT_BITS

    def lookup(self, keys: np.ndarray, compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The answer for each of ``keys``."""
        slot = self.slot_of(keys)
        values = self.slot_values.take(slot)
        lanes = np.flatnonzero(self.slot_keys.take(slot) != keys)
        while len(lanes):  # each round puts at least one key in its slot: the lanes left are fewer
            if len(lanes) == len(keys):  # a table new to these keys: every lane missed, nothing to select
                self.place(keys, slot, compute)
                values = self.slot_values.take(slot)
                lanes = np.flatnonzero(self.slot_keys.take(slot) != keys)
                continue
            missed, where = keys.take(lanes), slot.take(lanes)
            self.place(missed, where, compute)
            held = self.slot_keys.take(where) == missed
            values[lanes[held]] = self.slot_values.take(where[held])
            lanes = lanes[~held]
        return values

    def place(self, keys: np.ndarray, slot: np.ndarray, compute: Callable[[np.ndarray], np.ndarray]) -> None:
        """Write ``keys`` (``slot``: theirs) into the table, one to a slot, each with its answer."""
        self.slot_keys[slot] = keys
        written = np.zeros(len(self.slot_keys), bool)
        written[slot] = True
        slots = np.flatnonzero(written)
        self.slot_values[slots] = self.answer(self.slot_keys.take(slots), compute)

    def answer(self, keys: np.ndarray, compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The answers of ``keys`` (distinct): kept, or computed now for the keys not seen yet."""
        known = self.answers
        ks = keys.tolist()
        got = list(map(known.get, ks))
        if None in got:
            new = sorted(k for k, a in zip(ks, got) if a is None)
            computed = dict(zip(new, np.asarray(compute(np.array(new, _U64)), np.int64).tolist()))
            got = [computed[k] if a is None else a for k, a in zip(ks, got)]
            if len(known) + len(new) > self.LIMIT:
                known.clear()
            known.update(computed)
        return np.array(got, np.int64)


#: per image (or :data:`_NO_TEXT`), per arch: its call-site verdicts as flag bits by return address
_VERDICTS: "WeakKeyDictionary[object, dict[str, Memo]]" = WeakKeyDictionary()


class _NoText:
    """What the verdicts of a checker whose image has no text depend on: nothing of the checker's own
    (``CallSiteChecker._check()`` answers ``unknown`` to every address), so all such checkers share them."""


_NO_TEXT = _NoText()


def verdict_owner(checker: "CallSiteChecker") -> object:
    """What ``checker``'s verdicts depend on (with its arch): its image, or :data:`_NO_TEXT`."""
    return checker.image if checker.image is not None else _NO_TEXT


def apply_call_sites(checker: "CallSiteChecker", pcs: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """Each frame's call-site flag (:meth:`unwind.core.callsite.CallSiteChecker.annotate`) from ``checker``'s
    cached verdicts; a pc from exception registers is not checked."""
    memos = _VERDICTS.setdefault(verdict_owner(checker), {})
    memo = memos.get(checker.backend.name)
    if memo is None:
        memo = memos[checker.backend.name] = Memo()

    def verdicts(new: np.ndarray) -> np.ndarray:
        return np.array([checker.check(pc).flag for pc in new.tolist()], np.int64)
    checked = (flags & _BOUNDARY) == 0
    if checked.all():
        return flags | memo.lookup(pcs, verdicts)
    out = flags.copy()
    out[checked] |= memo.lookup(pcs[checked], verdicts)
    return out


class BatchReplay(Sequence["Replay"]):
    """The replays of one job's tasks, in task order; each :class:`~unwind.session.result.Replay` is built
    each time it is read, from the frames the batch made (once, at the first read); a task the batch handed
    back is walked by ``Session.replay`` then. No replay is kept, so a reader that takes each replay once
    and drops it leaves the garbage collector nothing more to visit than a ``Session.replay`` loop does."""

    def __init__(self, job: Job, walked: Walked | None, first_lane: int, job_index: int, symbolize: bool,
                 reliable: bool, max_frames: int | None, lines: bool = False) -> None:
        self.job = job
        self._walked = walked
        self._first = first_lane
        self._job_index = job_index
        self._symbolize = symbolize
        self._reliable = reliable
        self._max_frames = max_frames
        self._lines = lines

    @property
    def session(self) -> "Session":
        """The session the tasks belong to."""
        return self.job.session

    @property
    def tasks(self) -> list[Task]:
        """The tasks walked, in order."""
        return self.job.tasks

    def batched(self, i: int) -> bool:
        """Was task ``i`` walked by the batch (``False``: by the scalar path)?"""
        return self._walked is not None and self._walked.stop_codes()[self._first + i] >= 0

    @property
    def batched_frames(self) -> int:
        """The frames the lockstep walk reported for the tasks it walked itself."""
        w = self._walked
        if w is None:
            return 0
        lanes = slice(self._first, self._first + len(self))
        return int(w.counts[lanes][w.recorder.stop_code[lanes] >= 0].sum())

    def __len__(self) -> int:
        return len(self.job.tasks)

    @overload
    def __getitem__(self, i: int) -> "Replay": ...

    @overload
    def __getitem__(self, i: slice) -> list["Replay"]: ...

    def __getitem__(self, i: int | slice) -> "Replay | list[Replay]":
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._build(i)

    def __iter__(self) -> Iterator["Replay"]:
        for i in range(len(self)):
            yield self._build(i)

    def _build(self, i: int) -> "Replay":
        job, task = self.job, self.job.tasks[i]
        session = job.session
        walked = self._walked
        lane = self._first + i
        code = walked.stop_codes()[lane] if walked is not None else -1
        if code < 0:  # walked by the scalar path
            return session.replay(task, job.options, reliable=self._reliable, max_frames=self._max_frames,
                                  symbolize=self._symbolize, lines=self._lines)
        assert walked is not None
        rec = walked.recorder
        frames_all, offsets, stop_args = walked.lists()
        target = session.target(task, job.options)
        frames = frames_all[offsets[lane]:offsets[lane + 1]]
        if self._symbolize:
            session.symbolize(frames, target)
        if self._lines:
            session.source_lines().fill(frames)
        reason, detail = rec.stop_kinds[code]
        constants = rec.constants[self._job_index]
        # the detail formatted when read, as the scalar walk's stops are
        stop = Stop(reason, partial(detail, target, constants, *stop_args[lane]), len(frames))
        return Replay(target, frames, stop, None, constants.basis.copy)  # the basis copied when read


#: the fewest tasks of one arch walked in lockstep: a smaller batch, every replay read, costs more CPU than
#: ``Session.replay`` task by task (numpy's per-call cost, ~35-70 calls per step, outweighs so few lanes). The
#: compiled build's task-by-task walk is several times faster, so it gains from a batch only at about eight
#: times the tasks (measured on the corpora by ``benches/batch_threshold.py``: docs/benchmarks.md "Why a small
#: batch is walked task by task"). The answers are the same either way.
MIN_TASKS = 1024 if cython.compiled else 128


def replay_all(sessions: "Sequence[Session]", options: Options | None = None, *,
               tasks: Sequence[Sequence[Task]] | None = None, symbolize: bool = True,
               reliable: bool = False, max_frames: int | None = None,
               lockstep: bool | None = None, lines: bool = False) -> list[BatchReplay]:
    """Replay every task of each session (or ``tasks[i]`` of ``sessions[i]``) in lockstep batches.

    Sessions of one arch are walked together, so many small dumps make long batches. The result is one
    :class:`BatchReplay` per session; each of its replays equals ``Session.replay(task, options,
    reliable=reliable, max_frames=max_frames, symbolize=symbolize, lines=lines)``. ``reliable``, or an option
    the batch does not take (:func:`batch_options`), sends every task to that scalar path; so do fewer
    than :data:`MIN_TASKS` tasks of an arch, unless ``lockstep`` (``False``: never in lockstep).
    """
    options = options or Options()
    jobs = [Job(s, list(tasks[i]) if tasks is not None else s.dump.tasks(), options)
            for i, s in enumerate(sessions)]
    checked: set[str] = set()
    for s in sessions:  # the check reads the options and the session's backend: once per backend
        if s.backend.name not in checked:
            s.check_options(options)
            checked.add(s.backend.name)
    results: list[BatchReplay | None] = [None] * len(jobs)
    by_arch: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        by_arch.setdefault(job.session.backend.name, []).append(i)
    for indices in by_arch.values():
        backend = jobs[indices[0]].session.backend
        group = [jobs[i] for i in indices]
        walked = None
        together = lockstep if lockstep is not None else sum(len(job.tasks) for job in group) >= MIN_TASKS
        if together and not reliable and batch_options(options):
            walked = backend.batch_walk(group)
        first = 0
        for n, i in enumerate(indices):
            results[i] = BatchReplay(jobs[i], walked, first, n, symbolize, reliable, max_frames, lines)
            first += len(jobs[i].tasks)
        if walked is not None:
            _finish_flags(group, walked)
            if max_frames is not None:  # the scalar walk stops at max_frames with 'frame limit reached'
                rec = walked.recorder
                rec.stop_code[walked.counts >= max_frames] = -1
    return results  # type: ignore[return-value]


def lane_jobs(group: Sequence[Job]) -> np.ndarray:
    """The job of each lane: a group's lanes are its jobs' tasks, job after job, in task order."""
    return np.repeat(np.arange(len(group), dtype=np.int64), [len(job.tasks) for job in group])


def narrowed(go: np.ndarray, n: int, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """A lockstep's lanes for its next step: which of them go on (``go``, ``n`` of them) and its arrays
    (lanes along the last axis); the same arrays while more than half of their lanes go on (a narrower
    copy costs every array), else copies of only theirs (and ``go`` all true)."""
    if 2 * n > len(go):
        return (go, *arrays)
    keep = np.flatnonzero(go)
    return (np.ones(n, bool), *[a.take(keep, axis=-1) for a in arrays])


def _finish_flags(group: list[Job], walked: Walked) -> None:
    """The call-site flags of every batched frame, once per image (sessions of one image share its verdicts, and
    so do all sessions of images without text)."""
    flags = walked.flags
    lanes, pcs = walked.lanes, walked.pcs
    groups: dict[int, int] = {}
    checkers: list["CallSiteChecker"] = []
    image_of_job = []
    for job in group:
        checker = job.session.callsites
        key = id(verdict_owner(checker))
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(checkers)
            checkers.append(checker)
        image_of_job.append(g)
    if len(checkers) == 1:
        flags = apply_call_sites(checkers[0], pcs, flags)
    else:
        image_of_frame = np.array(image_of_job, np.int64).take(lane_jobs(group)).take(lanes)  # each lane's, then each frame's
        for g, checker in enumerate(checkers):
            sel = image_of_frame == g
            flags[sel] = apply_call_sites(checker, pcs[sel], flags[sel])
    walked.flags = flags
