"""Kernel struct layouts: declared once with construct, overridden by what the kernel itself says.

An unwinder needs a few sizes and member offsets (``sizeof(struct pt_regs)``,
``offsetof(struct pt_regs, stackframe)``, ...). Each arch declares the layout
of every generation it knows with ``construct`` (the *table*); a walk then
asks :func:`resolve_layout`, which takes, in this order:

1. ``btf``: the image's ``.BTF`` (the kernel's own type information);
2. ``dump``: the dump's ``offsets`` note key (written by ``unwind capture``
   from the guest's BTF), shaped
   ``{"pt_regs": {"size": 320, "members": {"stackframe": 296, "pc": 256}}}``;
3. ``derived``: a layout the arch worked out from the stacks themselves;
4. ``table``: the construct declaration of the generation the walk follows.

The :class:`StructLayout` it returns says which source it came from, for
``--explain`` and the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence
from weakref import WeakKeyDictionary

from construct import Struct

from .btf import Btf, BtfError

if TYPE_CHECKING:
    from unwind.core.dumpinfo import StructOffsets
    from unwind.core.registry import ArchBackend
    from unwind.core.target import Target

#: the sources, in the order they are tried
SOURCES = ("btf", "dump", "derived", "table")


def offsetof(struct: Struct, member: str) -> int:
    """``offsetof()``: the byte offset of a top-level member of a struct of fixed-size members."""
    off = 0
    for sub in struct.subcons:
        if sub.name == member:
            return off
        off += sub.sizeof()
    raise KeyError(f"no member {member!r}")


@dataclass(frozen=True, slots=True)
class StructLayout:
    """A struct's size and the member offsets a walk reads, and where they came from."""

    name: str
    size: int
    offsets: Mapping[str, int]
    #: one of :data:`SOURCES`
    source: str
    #: a few words on the source: ``vmlinux .BTF``, ``FINAL record at top-0x18``, ``v6.13 table``
    detail: str

    def __getitem__(self, member: str) -> int:
        return self.offsets[member]

    def describe(self) -> str:
        """``struct pt_regs: 320 bytes, from BTF (the image's .BTF)``."""
        return f"struct {self.name}: {self.size} bytes, from {self.source} ({self.detail})"


def table_layout(name: str, struct: Struct, members: Sequence[str], detail: str) -> StructLayout:
    """The layout a construct declaration gives."""
    return StructLayout(name, struct.sizeof(), {m: offsetof(struct, m) for m in members}, "table", detail)


def btf_layout(btf: Btf, name: str, members: Sequence[str]) -> StructLayout:
    """The layout the kernel's BTF gives; :class:`BtfError` when the struct or a member is missing.

    Read once per image's BTF (every dump of the image shares it), then kept with it."""
    known = _BTF_LAYOUTS.get(btf)
    if known is None:
        known = _BTF_LAYOUTS[btf] = {}
    key = (name, tuple(members))
    got = known.get(key)
    if got is None:
        try:
            got = StructLayout(name, btf.sizeof(name), {m: btf.offsetof(name, m) for m in members}, "btf",
                               "the image's .BTF")
        except BtfError as e:
            got = str(e)
        known[key] = got
    if isinstance(got, str):
        raise BtfError(got)
    return got


#: per BTF, the layouts read from it (or why not), by struct name and members
_BTF_LAYOUTS: "WeakKeyDictionary[Btf, dict[tuple[str, tuple[str, ...]], StructLayout | str]]" = WeakKeyDictionary()


def btf_offsets(btf: Btf, wanted: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The dump's ``offsets`` value for ``{struct: members}``: what BTF has of each (absent ones left out)."""
    out: dict[str, Any] = {}
    for name, members in wanted.items():
        try:
            size = btf.sizeof(name)
        except BtfError:
            continue
        found = {m: btf.offsetof(name, m) for m in members if btf.has_member(name, m)}
        out[name] = {"size": size, "members": found}
    return out


#: layouts a dump records beside each backend's own (kernel/trace/fgraph.c's return stack)
COMMON_LAYOUTS: dict[str, tuple[str, ...]] = {"ftrace_ret_stack": ("ret", "func", "fp", "retp")}


def dump_offsets(btf: Btf, backend: "ArchBackend") -> dict[str, Any]:
    """The dump's ``offsets`` for ``backend``: its :attr:`~unwind.core.registry.ArchBackend.layouts` and
    :data:`COMMON_LAYOUTS`, from ``btf`` (what ``unwind capture`` writes)."""
    return btf_offsets(btf, {**backend.layouts, **COMMON_LAYOUTS})


def dump_layout(offsets: Mapping[str, StructOffsets] | None, name: str, members: Sequence[str]) -> StructLayout | None:
    """The layout a dump's ``offsets`` gives, or ``None`` unless it names the size and every member inside it."""
    entry = offsets.get(name) if offsets is not None else None
    if entry is None or entry.size is None:
        return None
    found = {m: entry.members.get(m) for m in members}
    if any(v is None or v >= entry.size for v in found.values()):
        return None
    return StructLayout(name, entry.size, found, "dump", "the dump's offsets")  # type: ignore[arg-type]


def image_btf(target: "Target") -> Btf | None:
    """The BTF of the target's image, when it has one."""
    image = target.image
    return getattr(image, "btf", None) if image is not None else None


def known_layout(target: "Target", name: str, members: Sequence[str]) -> StructLayout | None:
    """The layout of struct ``name`` the image or the dump states: BTF, else the dump's offsets; ``None`` where
    :func:`resolve_layout` goes on to derive it or to take the table."""
    btf = image_btf(target)
    if btf is not None:
        try:
            return btf_layout(btf, name, members)
        except BtfError:
            pass
    return dump_layout(target.info.offsets, name, members)


def resolve_layout(target: "Target", name: str, members: Sequence[str], table: StructLayout,
                   derive: Callable[[], StructLayout | None] | None = None) -> StructLayout:
    """The layout of struct ``name`` for one walk: BTF, else the dump's offsets, else derived, else ``table``."""
    got = known_layout(target, name, members)
    if got is not None:
        return got
    if derive is not None:
        got = derive()
        if got is not None:
            return got
    return table
