"""The schema of the dump's ``UNWIND`` JSON note, declared once (``docs/dump-format.md``).

The writer (:class:`unwind.dump.DumpWriter`) and the reader (:class:`unwind.dump.Dump`)
share this schema. The reader validates the whole note when a dump is opened:

- a violation of a key the walk needs (stacks, tasks, their contexts, fgraph and kretprobe
  entries, cpus) is fatal: :func:`validate_note` raises :class:`NoteError` naming the key
  path, e.g. ``tasks[3].fgraph[0].retp: not a hex address``;
- a malformed *optional* key the walk can go on without (see :data:`DROPPABLE`) is removed
  from the note, with a warning, and validation runs again on what is left.

Addresses and register values are u64 hex strings (``"0x..."``, 1 to 16 digits), as the
writer stores them, so every consumer of the note may ``int(value, 16)`` them.

The schema is pydantic's validation core (``pydantic_core``) declared directly: one object
schema per part of the note, strict, with the key-path errors of the whole note at once. The
validated note is plain dicts and lists (addresses as ints, absent optional keys filled in with
their defaults, undeclared keys kept). pydantic's model classes over the same core cost a warm
``unwind replay`` 100 ms of imports and class building; this costs 20 (``docs/dump-format.md``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable, Mapping

from pydantic_core import PydanticCustomError, SchemaValidator, ValidationError
from pydantic_core import core_schema as cs

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

#: the validated note (and each part of it): JSON objects as dicts, addresses as ints
Note = dict[str, Any]


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


def _normalised(v: Any) -> Any:
    """How the capture normalised a CPU's registers: text, or an object of text."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, dict) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v.values()):
        return v
    raise PydanticCustomError("normalised", "not a string or an object of strings")


def _pair(v: Any) -> Any:
    """A JSON ``[a, b]`` as the tuple a strict tuple wants."""
    return tuple(v) if isinstance(v, list) else v


U64 = cs.no_info_before_validator_function(_u64, cs.int_schema())
OFFSET = cs.no_info_before_validator_function(_offset, cs.int_schema())
CPU = cs.int_schema(ge=0, le=MAX_CPU)
PID = cs.int_schema(ge=0, le=MAX_PID)
#: names and keys: at most KSYM_NAME_LEN (512) characters, as kallsyms names are
NAME = cs.str_schema(max_length=512)


#: every type is strict: ``"1"`` is no integer, ``true`` no integer, ``1`` no string
_STRICT = cs.CoreConfig(strict=True)


def _obj(**fields: cs.TypedDictField) -> cs.TypedDictSchema:
    """A JSON object with these keys (strict types); keys not declared are kept as they are."""
    return cs.typed_dict_schema(fields, extra_behavior="allow", config=_STRICT)


def _required(schema: cs.CoreSchema) -> cs.TypedDictField:
    return cs.typed_dict_field(schema, required=True)


def _default(schema: cs.CoreSchema, default: Any = None, factory: Callable[[], Any] | None = None) -> cs.TypedDictField:
    """A key that may be absent: then ``default`` (or a new ``factory()``)."""
    inner = (cs.with_default_schema(schema, default_factory=factory) if factory is not None
             else cs.with_default_schema(schema, default=default))
    return cs.typed_dict_field(inner, required=False)


def _nullable(schema: cs.CoreSchema) -> cs.TypedDictField:
    """A key that may be absent or ``null``: then ``None``."""
    return _default(cs.nullable_schema(schema))


def _list(item: cs.CoreSchema) -> cs.TypedDictField:
    """A key holding an array, absent: empty."""
    return _default(cs.list_schema(item), factory=list)


# --- the parts of the note ----------------------------------------------------------------------

#: ``kernel``: the release and an optional generation override
KERNEL = _obj(release=_nullable(NAME), generation=_nullable(NAME))

#: ``cpus[]``: what the capture knew of one CPU
CPU_NOTE = _obj(
    cpu=_required(CPU),
    pid=_nullable(PID),
    mode=_default(cs.literal_schema(["kernel", "user", "firmware"]), "kernel"),
    sysregs=_nullable(cs.dict_schema(NAME, U64)),
    normalised=_default(cs.no_info_before_validator_function(_normalised, cs.any_schema())),
    current=_nullable(U64),
    current_from=_nullable(NAME),
    hit=_nullable(cs.bool_schema()),
)


def _stack_range(v: Note) -> Note:
    """``stacks[]``: ``low < high``, and no larger than any kernel stack."""
    if not v["low"] < v["high"]:
        raise PydanticCustomError("range", f"low {v['low']:#x} is not below high {v['high']:#x}")
    if v["high"] - v["low"] > MAX_STACK_BYTES:
        raise PydanticCustomError("range", f"{v['high'] - v['low']:#x} bytes is larger than any kernel "
                                  f"stack (at most {MAX_STACK_BYTES:#x})")
    return v


#: ``stacks[]``: a typed stack range ``[low, high)``; ``task`` is the task_struct of the task whose
#: stack this is (it ties the stack to its task where pids collide)
STACK_NOTE = cs.no_info_after_validator_function(_stack_range, _obj(
    kind=_required(NAME), low=_required(U64), high=_required(U64), cpu=_nullable(CPU), pid=_nullable(PID),
    task=_nullable(U64)))

#: ``tasks[].fgraph[]``: one function-graph return-stack entry
FGRAPH_NOTE = _obj(ret=_required(U64), retp=_required(U64), func=_default(U64, 0), fp=_default(U64, 0))

#: ``tasks[].kretprobes[]``: one kretprobe/rethook instance
KRETPROBE_NOTE = _obj(ret=_required(U64), fp=_required(U64))


def _context_keys(v: dict[str, int] | None, info: cs.ValidationInfo) -> dict[str, int] | None:
    """The arch's saved-context keys only; any other key is dropped with a warning."""
    allowed = (info.context or {}).get("context_keys")
    if v is None or allowed is None:
        return v
    unknown = sorted(k for k in v if k not in allowed)
    if unknown:
        (info.context or {}).setdefault("unknown", []).append(unknown)
        v = {k: x for k, x in v.items() if k in allowed}
    return v


#: ``tasks[]``: one task (``task`` is its task_struct address); keys not declared here reach the
#: backend as ``Task.extra``
TASK_NOTE = _obj(
    pid=_nullable(PID),
    comm=_default(cs.str_schema(max_length=64), "?"),
    state=_default(cs.str_schema(max_length=64), ""),
    cpu=_nullable(CPU),
    context=_default(cs.with_info_after_validator_function(_context_keys, cs.nullable_schema(cs.dict_schema(NAME, U64)))),
    fgraph=_list(FGRAPH_NOTE),
    kretprobes=_list(KRETPROBE_NOTE),
    user_regs=_nullable(cs.dict_schema(NAME, U64)),
    task=_nullable(U64),
)
#: the keys :data:`TASK_NOTE` declares
TASK_KEYS = frozenset(TASK_NOTE["fields"])

#: ``ftrace_trampolines[]``: a dynamic ftrace trampoline (x86-64 ``orc_ftrace_find``)
TRAMPOLINE = _obj(addr=_required(U64), size=_required(cs.int_schema(gt=0, le=MAX_TRAMPOLINE_BYTES)),
                  ops=_nullable(U64), save_regs=_default(cs.bool_schema(), False))

#: ``oracles[].pt_regs[]``: a pt_regs the kernel's printout crossed
PT_REGS_CROSSING = _obj(after=_required(cs.int_schema(ge=0)), pc=_required(U64))

#: ``oracles[]``: an independent trace of one task
ORACLE = _obj(source=_required(NAME), pid=_nullable(PID), cpu=_nullable(CPU), frames=_list(U64),
              text=_nullable(cs.str_schema()), unreliable=_list(U64), pt_regs=_list(PT_REGS_CROSSING))

#: ``oracles_excluded[]``: a trace left out of comparison (``stale``, ``why``), kept as the capture read
#: it: a frame the capture could not resolve stays the ``symbol+off`` text the kernel printed
EXCLUDED_ORACLE = _obj(source=_required(NAME), pid=_nullable(PID), cpu=_nullable(CPU), frames=_list(NAME),
                       text=_nullable(cs.str_schema()), unreliable=_list(NAME),
                       stale=_default(cs.bool_schema(), True), why=_nullable(cs.str_schema()))

#: ``offsets.<struct>``: a struct's size and member offsets from BTF (``unwind.layout.dump_layout``)
STRUCT_OFFSETS = _obj(size=_nullable(OFFSET), members=_default(cs.dict_schema(NAME, OFFSET), factory=dict))

#: ``modules[].regions[]``: one ``mod->mem[]`` (or ``core_layout``) region
MODULE_REGION = _obj(kind=_required(NAME), base=_required(U64),
                     size=_required(cs.int_schema(ge=0, le=MAX_MODULE_BYTES)))

#: ``modules[].orc``: x86-64 ``mod->arch.orc_unwind_ip/orc_unwind/num_orcs``
MODULE_ORC = _obj(orc_unwind_ip=_required(U64), orc_unwind=_required(U64),
                  num_orcs=_required(cs.int_schema(ge=0, le=MAX_MODULE_BYTES // 4)),
                  entry_size=_required(cs.int_schema(ge=1, le=64)))

#: ``modules[]``: a loaded module's regions, kallsyms and ORC tables
MODULE_NOTE = _obj(name=_required(NAME), addr=_nullable(U64), state=_nullable(cs.int_schema()),
                   regions=_list(MODULE_REGION),
                   symbols=_list(cs.no_info_before_validator_function(_pair, cs.tuple_schema([U64, NAME]))),
                   orc=_nullable(MODULE_ORC))

#: the whole ``UNWIND`` note
NOTE = _obj(
    format=_required(cs.literal_schema([1])),
    arch=_required(NAME),
    kernel=_default(KERNEL, factory=lambda: {"release": None, "generation": None}),
    build_id=_nullable(cs.str_schema(pattern=r"^[0-9a-f]{2,128}$")),
    capture=_default(cs.dict_schema(cs.str_schema(), cs.any_schema()), factory=dict),
    cpus=_list(CPU_NOTE),
    stacks=_list(STACK_NOTE),
    tasks=_list(TASK_NOTE),
    symbols=_default(cs.dict_schema(NAME, U64), factory=dict),
    oracles=_list(ORACLE),
    oracles_excluded=_list(EXCLUDED_ORACLE),
    ftrace_trampolines=_list(TRAMPOLINE),
    offsets=_nullable(cs.dict_schema(NAME, STRUCT_OFFSETS)),
    modules=_list(MODULE_NOTE),
)
_VALIDATOR = SchemaValidator(NOTE, _STRICT)


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
             "dict_type": "not an object", "list_type": "not an array",
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
            valid: Note = _VALIDATOR.validate_python(note, context=ctx)
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
        return valid
    raise NoteError("note: still malformed after dropping its malformed optional keys")


def note_bytes(note: Mapping[str, Any]) -> bytes:
    """The note's JSON as the writer stores it (validated: the writer writes only good notes)."""
    _VALIDATOR.validate_python(note)
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
