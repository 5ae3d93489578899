"""The dump's ``UNWIND`` JSON note: its schema (:mod:`unwind.formats.note_schema`), checked at open (``docs/dump-format.md``).

The writer (:class:`unwind.formats.dump.DumpWriter`) and the reader (:class:`unwind.formats.dump.Dump`)
share one schema. The reader validates the whole note when a dump is opened:

- a violation of a key the walk needs (stacks, tasks, their contexts, fgraph and kretprobe
  entries, cpus) is fatal: :func:`validate_note` raises :class:`NoteError` naming the key
  path, e.g. ``tasks[3].fgraph[0].retp: not a hex address``;
- a malformed *optional* key the walk can go on without (see :data:`DROPPABLE`) is removed
  from the note, with a warning, and validation runs again on what is left.

Addresses and register values are u64 hex strings (``"0x..."``, 1 to 16 digits), as the
writer stores them, so every consumer of the note may ``int(value, 16)`` them.

A dump file's note that validated without a warning is kept, validated, in
``$UNWIND_CACHE/notes`` under a hash of its bytes and of the validator (:func:`read_note`): a
later open of the same note reads that instead of importing ``pydantic_core`` (~20 ms of a warm
``unwind replay``). Any other note, or a cache entry that is damaged or of another validator, is
validated as the first time.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

U64_MAX = 2**64 - 1
#: the largest note the reader parses (real notes are tens to hundreds of KiB)
MAX_NOTE_BYTES = 64 * 1024 * 1024

#: the validated note (and each part of it): JSON objects as dicts, addresses as ints
Note = dict[str, Any]


class NoteError(ValueError):
    """The note violates the schema where the walk cannot go on; the text names the key path."""


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
    ("bpf_symbols", _ANY),                   # that program's pcs print bare
    ("bpf_symbols",),
    ("stacks", _ANY, "task"),                # the stack is then tied to its task by pid
    ("tasks", _ANY, "task"),
    ("tasks", _ANY, "last_cpu"),             # what the dump does not say is None
    ("tasks", _ANY, "ppid"),
    ("tasks", _ANY, "tgid"),
    ("tasks", _ANY, "kthread"),
    ("holes", _ANY),                         # a read there is then a plain fault: the stop says less
    ("holes",),
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
    from .note_schema import VALIDATOR, ValidationError

    say = warn or (lambda _msg: None)
    for _ in range(_PASSES):
        ctx: dict[str, Any] = {"context_keys": context_keys}
        try:
            valid: Note = VALIDATOR.validate_python(note, context=ctx)
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
    from .note_schema import VALIDATOR

    VALIDATOR.validate_python(note)
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


# --- the cache of validated notes -----------------------------------------------------------------

#: the first bytes of a cache entry: then a BLAKE2b digest of the rest keyed with the entry's name (an
#: entry copied under another note's name does not match), then the rest (``marshal``)
_CACHE_MAGIC = b"unwind-note 2\n"
_DIGEST = 20


def read_note(raw: bytes, context_keys: frozenset[str] | None = None, warn: Callable[[str], None] | None = None,
              cached: bool = False) -> tuple[Any, Note, frozenset[str]]:
    """The note's bytes parsed (:func:`parse_note`) and validated (:func:`validate_note`): ``(the parsed JSON
    less any dropped key, the validated note, the keys the schema declares for a task)``.

    With ``cached``, a note validated before without a warning is read from ``$UNWIND_CACHE/notes``,
    under a hash of its bytes, ``context_keys`` and the validator (this module, the schema's modules,
    pydantic-core's binary, the Python and ``marshal`` versions): the same answer, without importing
    the validator. An entry that is missing, damaged or not this note's (its digest does not match) or
    unreadable is no answer: the note is validated, and the entry written again when it validates
    without a warning.
    """
    meta = parse_note(raw)
    path = _cache_path(raw, context_keys) if cached else None
    if path is not None:
        hit = _read_cached(path)
        if hit is not None:
            return meta, hit[0], hit[1]
    warned: list[str] = []

    def say(msg: str) -> None:
        warned.append(msg)
        if warn is not None:
            warn(msg)

    valid = validate_note(meta, context_keys, say)
    from .note_schema import TASK_KEYS

    if path is not None and not warned:
        _write_cached(path, valid, TASK_KEYS)
    return meta, valid, TASK_KEYS


def _cache_path(raw: bytes, context_keys: frozenset[str] | None) -> Path | None:
    from .cachefile import cache_dir

    validator = _validator_identity()
    folder = cache_dir("notes") if validator is not None else None
    if folder is None:
        return None
    h = hashlib.blake2b(validator, digest_size=_DIGEST)
    h.update(repr(sorted(context_keys) if context_keys is not None else None).encode() + b"\0")
    h.update(raw)
    return folder / f"{h.hexdigest()}.note"


@lru_cache(maxsize=1)
def _validator_identity() -> bytes | None:
    """What the validated note depends on besides the note: the source of this module, of the schema and of its bounds,
    pydantic-core's compiled validator (size, mtime), the Python and ``marshal`` versions; ``None`` when
    a part cannot be read (then nothing is cached)."""
    import importlib.util

    try:
        here = Path(__file__)
        spec = importlib.util.find_spec("pydantic_core")
        folders = spec.submodule_search_locations if spec is not None else None
        cores = sorted(p for f in folders or () for p in Path(f).glob("_pydantic_core*"))
        if not cores:
            return None
        parts = [here.read_bytes(), here.with_name("note_schema.py").read_bytes(),
                 here.with_name("note_limits.py").read_bytes(),
                 *(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}".encode() for p in cores),
                 sys.version.encode(), str(marshal.version).encode()]
    except (OSError, ImportError, ValueError):
        return None
    return hashlib.blake2b(b"\0".join(parts), digest_size=_DIGEST).digest()


def _digest(path: Path, body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=_DIGEST, key=path.stem.encode()[:64]).digest()


def _read_cached(path: Path) -> tuple[Note, frozenset[str]] | None:
    from .cachefile import mark_used

    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_CACHE_MAGIC) + _DIGEST
    body = data[head:]
    if data[:len(_CACHE_MAGIC)] != _CACHE_MAGIC or _digest(path, body) != data[len(_CACHE_MAGIC):head]:
        return None
    try:
        valid, keys = marshal.loads(body)
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(valid, dict) or not isinstance(keys, tuple) or not all(isinstance(k, str) for k in keys):
        return None
    mark_used(path)
    return valid, frozenset(keys)


def _write_cached(path: Path, valid: Note, task_keys: frozenset[str]) -> None:
    from .cachefile import write_atomically

    try:
        body = marshal.dumps((valid, tuple(sorted(task_keys))))
    except ValueError:  # a value marshal cannot store: not cached
        return
    digest = _digest(path, body)
    write_atomically(path, lambda f: f.write(_CACHE_MAGIC + digest + body))
