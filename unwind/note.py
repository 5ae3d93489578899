"""The schema of the dump's ``UNWIND`` JSON note, declared once (``docs/dump-format.md``).

The writer (:class:`unwind.dump.DumpWriter`) and the reader (:class:`unwind.dump.Dump`)
share these pydantic models. The reader validates the whole note when a dump is opened:

- a violation of a key the walk needs (stacks, tasks, their contexts, fgraph and kretprobe
  entries, cpus) is fatal: :func:`validate_note` raises :class:`NoteError` naming the key
  path, e.g. ``tasks[3].fgraph[0].retp: not a hex address``;
- a malformed *optional* key the walk can go on without (see :data:`DROPPABLE`) is removed
  from the note, with a warning, and validation runs again on what is left.

Addresses and register values are u64 hex strings (``"0x..."``, 1 to 16 digits), as the
writer stores them, so every consumer of the note may ``int(value, 16)`` them. pydantic was chosen over hand-written checks for
the key-path errors it reports for the whole note at once and its typed, strict fields.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, \
    field_validator, model_validator
from pydantic_core import PydanticCustomError

U64_MAX = 2**64 - 1
#: the largest stack range a note may declare: 16x the largest THREAD_SIZE any of the three arches
#: configures (arm64 64 KiB pages with KASAN, 128 KiB); real stacks are 4 KiB to 32 KiB
MAX_STACK_BYTES = 2 * 1024 * 1024
#: a dynamic ftrace trampoline is a copy of ftrace_(regs_)caller: a few hundred bytes
MAX_TRAMPOLINE_BYTES = 1024 * 1024
#: the largest note the reader parses (real notes are tens to hundreds of KiB)
MAX_NOTE_BYTES = 64 * 1024 * 1024
#: CPU numbers and pids: NR_CPUS is at most 8192, PID_MAX_LIMIT 4M
MAX_CPU = 8191
MAX_PID = 4 * 1024 * 1024
#: struct offsets and sizes from BTF (pt_regs is a few hundred bytes)
MAX_STRUCT_BYTES = 1024 * 1024
#: a module region (the largest modules' text is a few MiB)
MAX_MODULE_BYTES = 1 << 30


class NoteError(ValueError):
    """The note violates the schema where the walk cannot go on; the text names the key path."""


# --- field types --------------------------------------------------------------------------------

_HEX = re.compile(r"0x[0-9a-fA-F]{1,16}")


def _u64(v: Any) -> int:
    """A u64 stored as the writer stores addresses and registers: ``"0x"`` and 1 to 16 hex digits."""
    if isinstance(v, str) and _HEX.fullmatch(v):
        return int(v, 16)
    raise PydanticCustomError("u64", "not a hex address")


def _offset(v: Any) -> int:
    """A struct offset or size from BTF: an integer or a hex string, below 1 MiB."""
    n = _u64(v) if isinstance(v, str) else v
    if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_STRUCT_BYTES:
        return n
    raise PydanticCustomError("offset", "not a struct offset (an integer or hex string below 1 MiB)")


U64 = Annotated[int, BeforeValidator(_u64)]
Int = Annotated[int, Field(strict=True)]
Cpu = Annotated[int, Field(strict=True, ge=0, le=MAX_CPU)]
Pid = Annotated[int, Field(strict=True, ge=0, le=MAX_PID)]
#: names and keys: at most KSYM_NAME_LEN (512) characters, as kallsyms names are
Name = Annotated[str, Field(strict=True, max_length=512)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class Kernel(_Model):
    """``kernel``: the release and an optional generation override."""

    release: Name | None = None
    generation: Name | None = None


def _normalised(v: Any) -> Any:
    """How the capture normalised a CPU's registers: text, or an object of text."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, dict) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v.values()):
        return v
    raise PydanticCustomError("normalised", "not a string or an object of strings")


class CpuNote(_Model):
    """``cpus[]``: what the capture knew of one CPU."""

    cpu: Cpu
    pid: Pid | None = None
    mode: Literal["kernel", "user", "firmware"] = "kernel"
    sysregs: dict[Name, U64] | None = None
    normalised: Annotated[Any, BeforeValidator(_normalised)] = None
    current: U64 | None = None
    current_from: Name | None = None
    hit: bool | None = None


class StackNote(_Model):
    """``stacks[]``: a typed stack range ``[low, high)``."""

    kind: Name
    low: U64
    high: U64
    cpu: Cpu | None = None
    pid: Pid | None = None
    #: the task_struct of the task whose stack this is (ties it to its task where pids collide)
    task: U64 | None = None

    @model_validator(mode="after")
    def _range(self) -> "StackNote":
        if not self.low < self.high:
            raise PydanticCustomError("range", f"low {self.low:#x} is not below high {self.high:#x}")
        if self.high - self.low > MAX_STACK_BYTES:
            raise PydanticCustomError("range", f"{self.high - self.low:#x} bytes is larger than any kernel "
                                      f"stack (at most {MAX_STACK_BYTES:#x})")
        return self


class FgraphNote(_Model):
    """``tasks[].fgraph[]``: one function-graph return-stack entry."""

    ret: U64
    retp: U64
    func: U64 = 0
    fp: U64 = 0


class KretprobeNote(_Model):
    """``tasks[].kretprobes[]``: one kretprobe/rethook instance."""

    ret: U64
    fp: U64


class TaskNote(_Model):
    """``tasks[]``: one task; keys not declared here reach the backend as ``Task.extra``."""

    pid: Pid | None = None
    comm: Annotated[str, Field(strict=True, max_length=64)] = "?"
    state: Annotated[str, Field(strict=True, max_length=64)] = ""
    cpu: Cpu | None = None
    context: dict[Name, U64] | None = None
    fgraph: list[FgraphNote] = []
    kretprobes: list[KretprobeNote] = []
    user_regs: dict[Name, U64] | None = None
    #: the task_struct address
    task: U64 | None = None

    @field_validator("context")
    @classmethod
    def _context_keys(cls, v: dict[str, int] | None, info: ValidationInfo) -> dict[str, int] | None:
        """The arch's saved-context keys only; any other key is dropped with a warning."""
        allowed = (info.context or {}).get("context_keys")
        if v is None or allowed is None:
            return v
        unknown = sorted(k for k in v if k not in allowed)
        if unknown:
            (info.context or {}).setdefault("unknown", []).append(unknown)
            v = {k: x for k, x in v.items() if k in allowed}
        return v


class Trampoline(_Model):
    """``ftrace_trampolines[]``: a dynamic ftrace trampoline (x86-64 ``orc_ftrace_find``)."""

    addr: U64
    size: Annotated[int, Field(strict=True, gt=0, le=MAX_TRAMPOLINE_BYTES)]
    ops: U64 | None = None
    save_regs: bool = False


class PtRegsCrossing(_Model):
    """``oracles[].pt_regs[]``: a pt_regs the kernel's printout crossed."""

    after: Annotated[int, Field(strict=True, ge=0)]
    pc: U64


class Oracle(_Model):
    """``oracles[]``: an independent trace of one task."""

    source: Name
    pid: Pid | None = None
    cpu: Cpu | None = None
    frames: list[U64] = []
    text: str | None = None
    unreliable: list[U64] = []
    pt_regs: list[PtRegsCrossing] = []


class ExcludedOracle(_Model):
    """``oracles_excluded[]``: a trace left out of comparison (``stale``, ``why``), kept as the capture
    read it: a frame the capture could not resolve stays the ``symbol+off`` text the kernel printed."""

    source: Name
    pid: Pid | None = None
    cpu: Cpu | None = None
    frames: list[Name] = []
    text: str | None = None
    unreliable: list[Name] = []
    stale: bool = True
    why: str | None = None


Offset = Annotated[int, BeforeValidator(_offset)]


class StructOffsets(_Model):
    """``offsets.<struct>``: a struct's size and member offsets from BTF (``unwind.layout.dump_layout``)."""

    size: Offset | None = None
    members: dict[Name, Offset] = {}


class ModuleRegion(_Model):
    """``modules[].regions[]``: one ``mod->mem[]`` (or ``core_layout``) region."""

    kind: Name
    base: U64
    size: Annotated[int, Field(strict=True, ge=0, le=MAX_MODULE_BYTES)]


class ModuleOrc(_Model):
    """``modules[].orc``: x86-64 ``mod->arch.orc_unwind_ip/orc_unwind/num_orcs``."""

    orc_unwind_ip: U64
    orc_unwind: U64
    num_orcs: Annotated[int, Field(strict=True, ge=0, le=MAX_MODULE_BYTES // 4)]
    entry_size: Annotated[int, Field(strict=True, ge=1, le=64)]


def _pair(v: Any) -> Any:
    """A JSON ``[a, b]`` as the tuple a strict model wants."""
    return tuple(v) if isinstance(v, list) else v


class ModuleNote(_Model):
    """``modules[]``: a loaded module's regions, kallsyms and ORC tables."""

    name: Name
    addr: U64 | None = None
    state: Int | None = None
    regions: list[ModuleRegion] = []
    symbols: list[Annotated[tuple[U64, Name], BeforeValidator(_pair)]] = []
    orc: ModuleOrc | None = None


class Note(_Model):
    """The whole ``UNWIND`` note."""

    format: Literal[1]
    arch: Name
    kernel: Kernel = Kernel()
    build_id: Annotated[str, Field(strict=True, pattern=r"^[0-9a-f]{2,128}$")] | None = None
    capture: dict[str, Any] = {}
    cpus: list[CpuNote] = []
    stacks: list[StackNote] = []
    tasks: list[TaskNote] = []
    symbols: dict[Name, U64] = {}
    oracles: list[Oracle] = []
    oracles_excluded: list[ExcludedOracle] = []
    ftrace_trampolines: list[Trampoline] = []
    offsets: dict[Name, StructOffsets] | None = None
    modules: list[ModuleNote] = []


# --- what may be dropped ------------------------------------------------------------------------

_ANY = object()
#: key-path patterns of optional keys the walk can go on without: a violation at or below one
#: drops the key (or list entry) the pattern ends at, with a warning. ``_ANY`` is any key or index.
DROPPABLE: tuple[tuple[Any, ...], ...] = (
    ("kernel",),                             # release then comes from VMCOREINFO OSRELEASE
    ("build_id",),                           # no image found by build-id: raw addresses
    ("capture",),                            # capture details: never read by a walk
    ("symbols", _ANY),                       # one symbol hint: the image is authoritative
    ("symbols",),
    ("cpus", _ANY, "sysregs", _ANY),         # one system register: complete modes lose it
    ("cpus", _ANY, "sysregs"),
    ("cpus", _ANY, "normalised"),            # the arm64 vector pseudo-frame is not shown
    ("cpus", _ANY, "mode"),                  # default "kernel"
    ("cpus", _ANY, "current"),
    ("cpus", _ANY, "current_from"),
    ("cpus", _ANY, "hit"),
    ("tasks", _ANY, "comm"),                 # "?"
    ("tasks", _ANY, "state"),
    ("tasks", _ANY, "user_regs"),            # --user then stops: no user registers
    ("oracles", _ANY),                       # one oracle: unwind diff skips it
    ("oracles",),
    ("oracles_excluded",),
    ("ftrace_trampolines", _ANY),            # the trampoline's ip then gets the FP guess
    ("ftrace_trampolines",),
    ("offsets", _ANY),                       # that struct: BTF, else the generation's defaults
    ("offsets",),
    ("modules", _ANY),                       # that module's pcs print raw; x86 walks stop in it
    ("modules",),
    ("stacks", _ANY, "task"),                # the stack is then tied to its task by pid
    ("tasks", _ANY, "task"),
)
#: passes of drop-and-revalidate before giving up (each pass drops every reported key at once)
_PASSES = 4

_MESSAGES = {"int_type": "not an integer", "string_type": "not a string", "bool_type": "not a boolean",
             "dict_type": "not an object", "model_type": "not an object", "list_type": "not an array",
             "missing": "missing", "none_required": "must be null"}


def key_path(loc: Iterable[Any]) -> str:
    """``("tasks", 3, "fgraph", 0, "retp")`` as ``tasks[3].fgraph[0].retp``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "note"


def _message(err: Mapping[str, Any]) -> str:
    return _MESSAGES.get(err["type"], err["msg"])


def _droppable(loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The prefix of ``loc`` to drop, or ``None`` when the violation is fatal."""
    for pat in DROPPABLE:
        if len(loc) >= len(pat) and all(p is _ANY or p == x for p, x in zip(pat, loc)):
            return loc[:len(pat)]
    return None


def _delete(note: dict[str, Any], loc: tuple[Any, ...]) -> None:
    parent: Any = note
    for part in loc[:-1]:
        parent = parent[part]
    del parent[loc[-1]]


def _sort_key(loc: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in loc)


def validate_note(note: Any, context_keys: frozenset[str] | None = None,
                  warn: Callable[[str], None] | None = None) -> Note:
    """Validate ``note`` (the parsed JSON); drop malformed optional keys from it, in place.

    ``context_keys`` are the arch's saved-context keys (``None``: any). Raises
    :class:`NoteError` with ``key.path: what is wrong`` at the first fatal violation.
    """
    if not isinstance(note, dict):
        raise NoteError("note: not a JSON object")
    say = warn or (lambda _msg: None)
    for _ in range(_PASSES):
        ctx: dict[str, Any] = {"context_keys": context_keys}
        try:
            model = Note.model_validate(note, context=ctx)
        except ValidationError as e:
            drops: dict[tuple[Any, ...], str] = {}
            for err in e.errors(include_url=False, include_context=False):
                loc = tuple(err["loc"])
                where = _droppable(loc)
                if where is None:
                    raise NoteError(f"{key_path(loc)}: {_message(err)}") from None
                drops.setdefault(where, f"{key_path(loc)}: {_message(err)}")
            for where in sorted(drops, key=_sort_key, reverse=True):
                say(f"dropped {key_path(where)} ({drops[where]})")
                _delete(note, where)
            continue
        for keys in ctx.get("unknown", []):
            say(f"dropped saved-context keys {', '.join(keys)}: not this arch's")
        return model
    raise NoteError("note: still malformed after dropping its malformed optional keys")


def note_bytes(note: Mapping[str, Any]) -> bytes:
    """The note's JSON as the writer stores it (validated: the writer writes only good notes)."""
    Note.model_validate(note)
    return json.dumps(note, sort_keys=True, separators=(",", ":")).encode()


def parse_note(raw: bytes) -> Any:
    """``json.loads`` with the input bounded: size, nesting depth, huge numbers."""
    if len(raw) > MAX_NOTE_BYTES:
        raise NoteError(f"note: {len(raw)} bytes is more than the {MAX_NOTE_BYTES} a note may hold")
    try:
        return json.loads(raw)
    except RecursionError:
        raise NoteError("note: JSON nested too deeply") from None
    except UnicodeDecodeError as e:
        raise NoteError(f"note: not UTF-8 ({e.reason} at byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError, and int() refusing a number of > 4300 digits
        raise NoteError(f"note: not JSON: {str(e).splitlines()[0]}") from None
