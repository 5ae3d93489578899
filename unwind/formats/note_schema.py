"""The ``UNWIND`` note's schema for pydantic's validation core (``pydantic_core``), declared directly.

One object schema per part of the note, strict, with the key-path errors of the whole note at
once. :mod:`unwind.formats.note` validates with it and imports this module only when a note is validated
(a note validated before is read from the cache of validated notes: ``docs/dump-format.md``).
The validated note is plain dicts and lists (addresses as ints, absent optional keys filled in
with their defaults, undeclared keys kept). pydantic's model classes over the same core cost a
warm ``unwind replay`` 100 ms of imports and class building; this costs 20.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

from pydantic_core import PydanticCustomError, SchemaValidator, ValidationError
from pydantic_core import core_schema as cs

from .note_limits import MAX_CPU, MAX_MODULE_BYTES, MAX_PID, MAX_STACK_BYTES, MAX_STRUCT_BYTES, MAX_TRAMPOLINE_BYTES

if TYPE_CHECKING:
    from .note import Note

__all__ = ["NOTE", "TASK_KEYS", "VALIDATOR", "ValidationError"]

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


#: ``tasks[].lacks``: what the dump lacks that a walk of the task needs (``unwind.core.target.Lack``): its walk
#: stops on it, saying ``what``; ``registers``: the missing thing is its CPU's registers
LACK_NOTE = _obj(what=_required(cs.str_schema(min_length=1, max_length=4096)),
                 registers=_default(cs.bool_schema(), False))

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
    last_cpu=_nullable(CPU),
    ppid=_nullable(PID),
    tgid=_nullable(PID),
    kthread=_nullable(cs.bool_schema()),
    lacks=_nullable(LACK_NOTE),
    fgraph_lacks=_nullable(cs.str_schema(min_length=1, max_length=4096)),
    kretprobes_lacks=_nullable(cs.str_schema(min_length=1, max_length=4096)),
)
#: the keys :data:`TASK_NOTE` declares
TASK_KEYS = frozenset(TASK_NOTE["fields"])

#: the ``fault`` names of ``holes[]`` (``unwind.formats.dump.HOLE_FAULTS``)
HOLE_FAULT_NAMES = ("missing", "excluded", "not_mapped", "truncated", "left_out")


def _hole_range(v: Note) -> Note:
    """``holes[]``: ``low < high``."""
    if not v["low"] < v["high"]:
        raise PydanticCustomError("range", f"low {v['low']:#x} is not below high {v['high']:#x}")
    return v


#: ``holes[]``: a range of a stack the dump lacks, and why the source lacked it (``fault``): a read there
#: raises that fault, so a walk's stop says what the vmcore's said
HOLE_NOTE = cs.no_info_after_validator_function(_hole_range, _obj(
    low=_required(U64), high=_required(U64), fault=_default(cs.literal_schema(list(HOLE_FAULT_NAMES)), "missing")))

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

#: ``offsets.<struct>``: a struct's size and member offsets from BTF (``unwind.kernel.layout.dump_layout``)
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


def _bpf_range(v: Any) -> Any:
    """``bpf_symbols[]``: ``start < end``."""
    if not v[0] < v[1]:
        raise PydanticCustomError("range", f"start {v[0]:#x} is not below end {v[1]:#x}")
    return v


#: ``bpf_symbols[]``: a JITed BPF program or trampoline on ``bpf_kallsyms``, ``[start, end, name]``
BPF_SYMBOL = cs.no_info_after_validator_function(_bpf_range, cs.no_info_before_validator_function(
    _pair, cs.tuple_schema([U64, U64, NAME])))

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
    bpf_symbols=_list(BPF_SYMBOL),
    holes=_list(HOLE_NOTE),
)
#: the validator of the whole note
VALIDATOR = SchemaValidator(NOTE, _STRICT)


