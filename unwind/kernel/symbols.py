"""Kernel symbols, looked up as kallsyms does.

The table comes from a ``System.map`` or from the ``.symtab`` of an ELF image
(full debug vmlinux, stripped vmlinux, or a slim image). Aliases are ordered
as ``scripts/kallsyms.c: compare_symbols()`` orders them, and a symbol's size
is the distance to the next symbol at a higher address, as
``kernel/kallsyms.c: get_symbol_pos()`` computes it, so ``name+0xoff/0xsize``
prints as the kernel prints it.
"""

from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from unwind.core.dumpinfo import BpfSymbol, ModuleInfo


class SymbolError(Exception):
    """The symbol source is unusable."""


@dataclass(frozen=True, slots=True)
class Symbol:
    """A resolved address: ``name+offset/size``."""

    name: str
    addr: int
    size: int
    offset: int
    #: the module the symbol is in, ``None`` for vmlinux
    module: str | None = None

    @property
    def suffix(self) -> str:
        """What ``__sprint_symbol()`` appends after ``+off/size``: `` [module]`` for a module symbol."""
        return f" [{self.module}]" if self.module else ""

    def __str__(self) -> str:
        return f"{self.name}+{self.offset:#x}/{self.size:#x}{self.suffix}"


# scripts/kallsyms.c: may_be_linker_script_provide_symbol()
def _linker_provided(name: str) -> bool:
    if len(name) < 8 or not name.startswith("__"):
        return False
    return (name.startswith(("__start_", "__stop_", "__end_"))
            or name.endswith(("_start", "_end")))


# scripts/kallsyms.c: compare_symbols(), for symbols at one address
def _alias_key(item: tuple[int, str, str, int]) -> tuple[int, int, int, int, int]:
    addr, typ, name, seq = item
    weak = typ in "wW"
    underscores = len(name) - len(name.lstrip("_"))
    return (addr, weak, _linker_provided(name), underscores, seq)


# scripts/mksysmap: the names System.map (and so kallsyms) never holds
_MKSYSMAP_DROPPED = re.compile(
    r"^(\$|\.L|__efistub_|__pi_\$|__pi_\.L|__kvm_nvhe_\$|__kvm_nvhe_\.L|__[A-Za-z0-9]*Thunk_|"
    r"__kcfi_typeid_|__kvm_nvhe___kcfi_typeid_|__pi___kcfi_typeid_|__crc_|__kstrtab_|__kstrtabns_|L0$|"
    r"_SDA_BASE_$|_SDA2_BASE_$)|(_from_arm|_from_thumb|_veneer)$|\.long_branch\.|\.plt_branch\.")


def _ignored(name: str, typ: str) -> bool:
    """``mksysmap``'s filter, then ``scripts/kallsyms.c: is_ignored_symbol()``."""
    if not name or typ in "aNUwun" or typ == "A":
        return True
    if name[0] not in "$._L" and "." not in name and not name.endswith(("_arm", "_thumb", "_veneer")):
        return False  # none of the patterns can match
    return _MKSYSMAP_DROPPED.search(name) is not None


#: names :meth:`SymbolTable.address` keeps the answer of at most
_ASKED_MAX = 1 << 12


def _blob(parts: Iterable[bytes]) -> tuple[bytes, array]:
    """``parts`` joined, and the start offset of each (plus the end)."""
    chunks = list(parts)
    offsets = array("I", [0])
    pos = 0
    for c in chunks:
        pos += len(c)
        offsets.append(pos)
    return b"".join(chunks), offsets


class SymbolTable:
    """A sorted kallsyms-like table with scalar and batch lookup.

    The table is flat arrays, so that a cached one loads in one read
    (:meth:`to_arrays`, :meth:`from_arrays`): :attr:`addrs`, and the names as
    one UTF-8 blob with start offsets, decoded one name at a time as lookups
    ask (the name kallsyms prints at each address first, then the other
    aliases). The by-name index is every name's position in the blob sorted by
    name, with its address, searched by bisection: no dict of 200,000 names is
    built at start-up.
    """

    def __init__(self, entries: Iterable[tuple[int, str, str]]) -> None:
        """``entries`` are ``(addr, nm type, name)`` in source (``nm -n``) order."""
        items = [(a, t, n, i) for i, (a, t, n) in enumerate(entries) if not _ignored(n, t)]
        if not items:
            raise SymbolError("no symbols")
        items.sort(key=lambda it: it[0])  # stable: source order kept within an address
        addrs: list[int] = []
        names: list[str] = []
        by_name: dict[str, int] = {}
        i, n = 0, len(items)
        while i < n:
            addr = items[i][0]
            j = i + 1
            while j < n and items[j][0] == addr:
                j += 1
            group = items[i:j]
            # get_symbol_pos() reports the first alias in compare_symbols() order
            best = group[0] if j == i + 1 else min(group, key=_alias_key)
            addrs.append(addr)
            names.append(best[2])
            for it in group:
                by_name.setdefault(it[2], addr)
            i = j
        end = by_name.get("_end") or by_name.get("_etext") or addrs[-1]
        position: dict[str, int] = {}
        for i, name in enumerate(names):
            position.setdefault(name, i)
        stored = list(names)
        for name in by_name:  # the aliases kallsyms never prints: after the printed names
            if name not in position:
                position[name] = len(stored)
                stored.append(name)
        index = sorted((name.encode(), position[name], addr) for name, addr in by_name.items())
        self._set(array("Q", addrs), *_blob(n.encode() for n in stored), max(end, addrs[-1]),
                  array("I", [i for _, i, _ in index]), array("Q", [a for _, _, a in index]))

    def _set(self, addrs: array, blob: bytes | memoryview, offsets: array, last_end: int, index: array,
             index_addrs: array) -> None:
        n = len(addrs)
        if not n or len(offsets) < n + 1 or len(index) != len(index_addrs) or offsets[-1] != len(blob):
            raise SymbolError("inconsistent symbol table arrays")
        #: symbol start addresses, ascending (one per address: the alias kallsyms prints)
        self.addrs: array = addrs
        self._blob, self._offsets, self._last_end = blob, offsets, last_end
        self._index, self._index_addrs = index, index_addrs
        #: :meth:`address`'s answers so far, by the name asked (a walk asks the same few names of every dump)
        self._asked: dict[str, int | None] = {}

    def to_arrays(self) -> dict[str, array]:
        """The table as flat arrays, for a cache file (:meth:`from_arrays` reads them back)."""
        names = array("B")
        names.frombytes(self._blob)
        return {"addrs": self.addrs, "names": names, "name_offsets": self._offsets,
                "last_end": array("Q", [self._last_end]), "index": self._index, "index_addrs": self._index_addrs}

    @classmethod
    def from_arrays(cls, arrays: dict[str, array]) -> "SymbolTable":
        """A table saved by :meth:`to_arrays`; :class:`SymbolError` when they do not fit together."""
        self = cls.__new__(cls)
        try:
            last_end = arrays["last_end"]
            if len(last_end) != 1:
                raise SymbolError("inconsistent cached symbol table")
            # the names' bytes are read in place (one name a lookup), not copied out of the array
            self._set(arrays["addrs"], memoryview(arrays["names"]), arrays["name_offsets"], last_end[0],
                      arrays["index"], arrays["index_addrs"])
        except (KeyError, AttributeError, TypeError):
            raise SymbolError("inconsistent cached symbol table") from None
        return self

    def name(self, index: int) -> str:
        """The name kallsyms prints for the symbol at :attr:`addrs` ``[index]``."""
        return self._name_bytes(index).decode("utf-8", "replace")

    def _name_bytes(self, position: int) -> bytes:
        return bytes(self._blob[self._offsets[position]:self._offsets[position + 1]])

    @property
    def names(self) -> list[str]:
        """Every name, in :attr:`addrs` order (decoded on each call: lookups use :meth:`name`)."""
        return [self.name(i) for i in range(len(self.addrs))]

    @property
    def ends(self) -> array:
        """Where each symbol ends: the next symbol's start (the last: ``_end``)."""
        ends = self.addrs[1:]
        ends.append(self._last_end)
        return ends

    def __len__(self) -> int:
        return len(self.addrs)

    # kallsyms_lookup_buildid(): is_ksym_addr(), then get_symbol_pos()
    def lookup(self, addr: int) -> Symbol | None:
        """The symbol containing ``addr``; ``None`` below the first symbol and from the image's end on
        (``_end``, else ``_etext``), where ``is_ksym_addr()`` is false and ``%pS`` prints the address."""
        table = self.addrs
        i = bisect.bisect_right(table, addr) - 1
        if i < 0 or addr >= self._last_end:
            return None
        start = table[i]
        end = table[i + 1] if i + 1 < len(table) else self._last_end
        return Symbol(self.name(i), start, end - start, addr - start)

    def format(self, addr: int) -> str:
        """``%pS``: ``name+0xoff/0xsize``, or the bare hex address when unknown."""
        sym = self.lookup(addr)
        return str(sym) if sym is not None else hex(addr)

    def address(self, name: str) -> int | None:
        """The address of a symbol by name (any alias; a name at several addresses: the lowest)."""
        asked = self._asked
        try:
            return asked[name]
        except KeyError:
            pass
        except TypeError:  # not hashable, so no name
            return None
        if len(asked) >= _ASKED_MAX:  # a caller asking ever new names: the memo stays small
            asked.clear()
        addr = asked[name] = self._address(name)
        return addr

    def _address(self, name: str) -> int | None:
        """:meth:`address` by bisection of the by-name index."""
        try:
            key = name.encode()
        except (AttributeError, UnicodeEncodeError):
            return None
        index, name = self._index, self._name_bytes
        i = bisect.bisect_left(range(len(index)), key, key=lambda j: name(index[j]))
        if i < len(index) and name(index[i]) == key:
            return self._index_addrs[i]
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.address(name) is not None

    @classmethod
    def from_system_map(cls, path: str | Path) -> "SymbolTable":
        """Read a ``System.map``: lines of ``hexaddr type name``."""
        entries = []
        try:
            with open(path, "r", encoding="ascii", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    parts = line.split()
                    if len(parts) < 3:
                        continue
                    try:
                        entries.append((int(parts[0], 16), parts[1], parts[2]))
                    except ValueError:
                        raise SymbolError(f"{path}:{lineno}: not a System.map line") from None
        except OSError as e:
            raise SymbolError(f"cannot read {path}: {e.strerror}") from None
        if not any(not _ignored(n, t) for _, t, n in entries):
            raise SymbolError(f"{path}: no symbols (a System.map has lines 'hexaddr type name')")
        return cls(entries)


class ModuleSymbols:
    """One module's kallsyms (``mod->kallsyms``) with ``find_kallsyms_symbol()``'s lookup."""

    def __init__(self, name: str, regions: list[tuple[int, int]], symbols: Iterable[tuple[int, str]]) -> None:
        self.name = name
        self.regions = sorted((b, b + size) for b, size in regions if size > 0)
        pairs = sorted(symbols)
        self.addrs = [a for a, _ in pairs]
        self.names = [n for _, n in pairs]

    @classmethod
    def of(cls, module: ModuleInfo) -> "ModuleSymbols":
        """A loaded module's kallsyms over its regions."""
        return cls(module.name, [(r.base, r.size) for r in module.regions], module.symbols)

    @classmethod
    def bpf(cls, entries: Sequence[BpfSymbol]) -> "ModuleSymbols":
        """JITed BPF programs and trampolines: each its own region, printed with no module
        (``bpf_address_lookup()`` sets none)."""
        return cls("", [(b.start, b.end - b.start) for b in entries], [(b.start, b.name) for b in entries])

    def region(self, addr: int) -> tuple[int, int] | None:
        """``within_module_mem_type()``: the region holding ``addr``."""
        for lo, hi in self.regions:
            if lo <= addr < hi:
                return lo, hi
        return None

    # find_kallsyms_symbol() (kernel/module/kallsyms.c)
    def lookup(self, addr: int) -> Symbol | None:
        """The closest symbol at or below ``addr`` in its region; its size runs to the next symbol or the region end."""
        reg = self.region(addr)
        if reg is None:
            return None
        lo, hi = reg
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i < 0 or self.addrs[i] < lo:
            return None
        start = self.addrs[i]
        j = bisect.bisect_right(self.addrs, addr)
        nextval = self.addrs[j] if j < len(self.addrs) and self.addrs[j] < hi else hi
        return Symbol(self.names[i], start, nextval - start, addr - start, self.name)


class KernelSymbols:
    """vmlinux's table plus the modules': ``kallsyms_lookup()`` asks vmlinux for its own range, else the
    module holding the address (``module_address_lookup()``)."""

    def __init__(self, vmlinux: SymbolTable, modules: Iterable[ModuleSymbols]) -> None:
        self.vmlinux = vmlinux
        self.modules = [m for m in modules if m.regions]

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.vmlinux, name)

    def __len__(self) -> int:
        return len(self.vmlinux)

    def __contains__(self, name: object) -> bool:
        return name in self.vmlinux

    def module_at(self, addr: int) -> ModuleSymbols | None:
        """``__module_address()``: the module whose memory holds ``addr``."""
        for m in self.modules:
            if m.region(addr) is not None:
                return m
        return None

    def lookup(self, addr: int) -> Symbol | None:
        """The symbol containing ``addr``, in a module or in vmlinux."""
        mod = self.module_at(addr)
        return mod.lookup(addr) if mod is not None else self.vmlinux.lookup(addr)

    def format(self, addr: int) -> str:
        """``%pS``: ``name+0xoff/0xsize [module]``, or the bare hex address when unknown."""
        sym = self.lookup(addr)
        return str(sym) if sym is not None else hex(addr)

    def address(self, name: str) -> int | None:
        """A vmlinux symbol's address by name."""
        return self.vmlinux.address(name)
