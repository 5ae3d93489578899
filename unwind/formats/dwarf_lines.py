"""Source lines and inline frames of an ELF image, from its DWARF, as ``addr2line -i -f`` gives them.

pyelftools reads the DWARF once per image: every compile unit's line program (the rows of its line
table) and the tree of ``DW_TAG_subprogram`` / ``DW_TAG_inlined_subroutine`` entries with their address
ranges, names and call sites (``DW_AT_call_file``, ``DW_AT_call_line``). What a lookup needs is kept as
flat columns (:class:`LineIndex`), cached in ``$UNWIND_CACHE/lines`` by build-id like the symbol and ORC
tables, so a later run reads a few arrays and parses no DWARF.

A lookup follows binutils' ``addr2line`` (``bfd/dwarf2.c``): the line-table row is the last one at or
below the address (of several rows at one address, the last), and the function is the innermost
inlined instance whose ranges hold the address, its callers named up to the out-of-line subprogram,
each level's location being the call site the level inside it was inlined at.
"""

from __future__ import annotations

import bisect
import os
import posixpath
from array import array
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from unwind.core.frame import SourceLine

from .cachefile import CacheFileError, cache_dir, read_arrays, write_arrays, write_atomically

if TYPE_CHECKING:
    from elftools.dwarf.compileunit import CompileUnit
    from elftools.dwarf.die import DIE
    from elftools.dwarf.dwarfinfo import DWARFInfo
    from elftools.elf.elffile import ELFFile

    from .image import Image

#: the layout of ``$UNWIND_CACHE/lines/<build-id>-vN.arrays``
_CACHE_VERSION = 1
#: the same for a relocatable object (``<build-id>-rel-vN.arrays``): its addresses are those of its sections
#: placed by :func:`section_addresses`
_REL_CACHE_VERSION = 2
#: ``sh_flags``: the section occupies memory at run time
SHF_ALLOC = 0x2
#: "no such entry" in the index's 32-bit columns (a row that ends a sequence, a subprogram's parent)
NONE = 0xFFFFFFFF
#: the sections an image needs for source lines
DWARF_SECTIONS = (".debug_info", ".debug_line")
#: tags whose children may hold inlined subroutines
_SCOPES = frozenset({"DW_TAG_lexical_block", "DW_TAG_inlined_subroutine"})
#: forms of ``DW_AT_high_pc`` that give the size rather than the end address
_HIGH_PC_ADDRESS_FORMS = frozenset({"DW_FORM_addr", "DW_FORM_addrx", "DW_FORM_addrx1", "DW_FORM_addrx2",
                                    "DW_FORM_addrx3", "DW_FORM_addrx4", "DW_FORM_GNU_addr_index"})


class DwarfLinesError(Exception):
    """The image's DWARF cannot be read (malformed, or a form pyelftools does not know)."""


def has_dwarf(sections: frozenset[str]) -> bool:
    """True when section names ``sections`` include the DWARF a line index is built from."""
    return all(name in sections for name in DWARF_SECTIONS)


class LineIndex:
    """Address -> source lines and inline frames of one image, as flat columns.

    Line table: ``row_addr`` ascending, ``row_file``/``row_line`` the row's position (``row_file`` is
    :data:`NONE` where a sequence ends). Functions: one entry per subprogram or inlined instance
    (``die_*``: name, parent entry, call file and line, depth), their address ranges grouped by
    out-of-line subprogram (``rng_*``, a group's slice given by ``top_first``/``top_end`` for each of
    the subprogram's ranges ``top_lo``/``top_hi``, sorted by ``top_lo``). Strings (file paths, function
    names) are one blob with offsets.
    """

    def __init__(self, meta: dict[str, Any], arrays: dict[str, array]) -> None:
        self.build_id: str | None = meta.get("build_id")
        #: the compile units' most common ``DW_AT_comp_dir``: the build folder, stripped from file names
        self.comp_dir: str | None = meta.get("comp_dir")
        self._a = arrays
        self._blob = arrays["str_blob"].tobytes()
        self._str_off = arrays["str_off"]
        self._strings: dict[int, str] = {}

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, array]]:
        """``(meta, arrays)`` for :func:`~unwind.formats.cachefile.write_arrays`."""
        return {"build_id": self.build_id, "comp_dir": self.comp_dir}, self._a

    def __len__(self) -> int:
        """The line table's rows."""
        return len(self._a["row_addr"])

    def _string(self, i: int) -> str:
        s = self._strings.get(i)
        if s is None:
            s = self._strings[i] = self._blob[self._str_off[i]:self._str_off[i + 1]].decode("utf-8", "replace")
        return s

    def line_at(self, addr: int) -> tuple[str, int] | None:
        """``(file, line)`` of the line-table row holding ``addr``, or ``None``."""
        a = self._a
        i = bisect.bisect_right(a["row_addr"], addr) - 1
        if i < 0 or a["row_file"][i] == NONE:
            return None
        return self._string(a["row_file"][i]), a["row_line"][i]

    def _innermost(self, addr: int) -> int | None:
        """The function entry holding ``addr`` most deeply (smallest range on a tie), or ``None``."""
        a = self._a
        top_lo, top_hi = a["top_lo"], a["top_hi"]
        i = bisect.bisect_right(top_lo, addr) - 1
        if i < 0 or addr >= top_hi[i]:
            return None
        lo, hi, die, depth = a["rng_lo"], a["rng_hi"], a["rng_die"], a["die_depth"]
        best, key = None, (-1, 0)
        for j in range(a["top_first"][i], a["top_end"][i]):
            if lo[j] <= addr < hi[j]:
                k = (depth[die[j]], lo[j] - hi[j])
                if k > key:
                    best, key = die[j], k
        return best

    def lookup(self, addr: int) -> list[SourceLine]:
        """The source position of ``addr``, innermost inlined function first, out to the subprogram
        (``addr2line -i -f``); empty when no line-table row holds ``addr``."""
        pos = self.line_at(addr)
        if pos is None:
            return []
        file, line = pos
        a = self._a
        d = self._innermost(addr)
        if d is None:
            return [SourceLine(None, file, line)]
        out = []
        while True:
            out.append(SourceLine(self._string(a["die_name"][d]) if a["die_name"][d] != NONE else None, file, line))
            parent = a["die_parent"][d]
            if parent == NONE:
                return out
            call_file = a["die_call_file"][d]
            file = self._string(call_file) if call_file != NONE else "??"
            line = a["die_call_line"][d]
            d = parent

    @classmethod
    def of_image(cls, image: "Image") -> "LineIndex | None":
        """The index of ``image``, from the cache when this build was indexed before; ``None`` when the
        image has no DWARF (:func:`has_dwarf`). :class:`DwarfLinesError` when its DWARF is unreadable."""
        if not has_dwarf(image.sections_with_contents):
            return None
        folder = cache_dir("lines") if image.build_id else None
        name = (f"{image.build_id}-rel-v{_REL_CACHE_VERSION}" if image.elf["e_type"] == "ET_REL"
                else f"{image.build_id}-v{_CACHE_VERSION}")
        path = folder / f"{name}.arrays" if folder is not None else None
        if path is not None and path.exists():
            try:
                meta, arrays = read_arrays(path)
                if meta.get("build_id") == image.build_id:
                    return cls(meta, arrays)
            except (OSError, CacheFileError, KeyError):
                pass  # a damaged cache entry is rebuilt below
        index = build_index(image.elf, image.build_id)
        if path is not None:
            write_atomically(path, lambda f: write_arrays(f, *index.to_arrays()))
        return index


class _Strings:
    """Interned strings: each distinct string once, by number."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.ids)
        return i

    def arrays(self) -> dict[str, array]:
        blob = array("B")
        offsets = array("Q", [0])
        for s in self.ids:  # insertion order: the numbers
            blob.frombytes(s.encode("utf-8", "surrogateescape"))
            offsets.append(len(blob))
        return {"str_blob": blob, "str_off": offsets}


class _Builder:
    """The columns of a :class:`LineIndex`, filled compile unit by compile unit."""

    def __init__(self, dwarf: "DWARFInfo") -> None:
        self.dwarf = dwarf
        self.strings = _Strings()
        self.rows: tuple[array, array, array] = (array("Q"), array("I"), array("I"))
        self.die = {k: array("I") for k in ("die_name", "die_parent", "die_call_file", "die_call_line",
                                            "die_depth")}
        self.rng = {k: array(t) for k, t in (("rng_lo", "Q"), ("rng_hi", "Q"), ("rng_die", "I"))}
        self.tops: list[tuple[int, int, int, int]] = []
        self.comp_dirs: Counter[str] = Counter()
        self.names: dict[int, int] = {}  # DIE offset -> string number of its name (NONE: none)
        self._ranges = dwarf.range_lists()

    def compile_unit(self, cu: "CompileUnit") -> None:
        """Index one compile unit: its line program, then its subprograms."""
        top = cu.get_top_DIE()
        comp_dir = _str(top.attributes.get("DW_AT_comp_dir"))
        if comp_dir:
            self.comp_dirs[comp_dir] += 1
        files = self.line_program(cu, comp_dir)
        base = _attr_int(top, "DW_AT_low_pc") or 0
        for die in top.iter_children():
            if die.tag == "DW_TAG_subprogram":
                self.subprogram(cu, die, files, base)

    def line_program(self, cu: "CompileUnit", comp_dir: str | None) -> list[int]:
        """Append the rows of ``cu``'s line table; the string numbers of its file table (DWARF 5 numbers
        files from 0, earlier versions from 1: index 0 is then unused)."""
        prog = self.dwarf.line_program_for_CU(cu)
        if prog is None:
            return []
        files = _file_names(prog, comp_dir)
        ids = [self.strings(f) if f is not None else NONE for f in files]
        addrs, fids, lines = self.rows
        start = len(addrs)  # the current sequence's first row
        for entry in prog.get_entries():
            st = entry.state
            if st is None:
                continue
            if st.end_sequence:
                # rows at the end address cover nothing: the end, not they, holds that address
                while len(addrs) > start and addrs[-1] == st.address:
                    addrs.pop()
                    fids.pop()
                    lines.pop()
                addrs.append(st.address)
                fids.append(NONE)
                lines.append(0)
                start = len(addrs)
            else:
                addrs.append(st.address)
                fids.append(ids[st.file] if 0 <= st.file < len(ids) else NONE)
                lines.append(st.line)
        return ids

    def subprogram(self, cu: "CompileUnit", die: "DIE", files: list[int], base: int) -> None:
        """An out-of-line function with code: its ranges and those of the instances inlined into it."""
        ranges = self.die_ranges(cu, die, base)
        if not ranges:
            return
        first = len(self.rng["rng_lo"])
        self.function(cu, die, NONE, 0, files, base, ranges)
        end = len(self.rng["rng_lo"])
        for lo, hi in ranges:
            self.tops.append((lo, hi, first, end))

    def function(self, cu: "CompileUnit", die: "DIE", parent: int, depth: int, files: list[int], base: int,
                 ranges: list[tuple[int, int]]) -> None:
        """One subprogram or inlined instance with its ``ranges``, then the instances inlined into it."""
        me = len(self.die["die_name"])
        call_file = _attr_int(die, "DW_AT_call_file")
        self.die["die_name"].append(self.name_of(die))
        self.die["die_parent"].append(parent)
        self.die["die_call_file"].append(files[call_file] if call_file is not None and 0 <= call_file < len(files)
                                         else NONE)
        self.die["die_call_line"].append(_attr_int(die, "DW_AT_call_line") or 0)
        self.die["die_depth"].append(depth)
        for lo, hi in ranges:
            self.rng["rng_lo"].append(lo)
            self.rng["rng_hi"].append(hi)
            self.rng["rng_die"].append(me)
        for child in _inlined_below(die):
            child_ranges = self.die_ranges(cu, child, base)
            if child_ranges:
                self.function(cu, child, me, depth + 1, files, base, child_ranges)

    def die_ranges(self, cu: "CompileUnit", die: "DIE", base: int) -> list[tuple[int, int]]:
        """The address ranges of ``die`` (``DW_AT_low_pc``/``DW_AT_high_pc`` or ``DW_AT_ranges``)."""
        attrs = die.attributes
        if "DW_AT_ranges" in attrs:
            if self._ranges is None:
                return []
            out = []
            for e in self._ranges.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=cu):
                if hasattr(e, "base_address"):
                    base = e.base_address
                elif e.is_absolute:
                    out.append((e.begin_offset, e.end_offset))
                else:
                    out.append((base + e.begin_offset, base + e.end_offset))
            return [(lo, hi) for lo, hi in out if lo < hi]
        low, high = attrs.get("DW_AT_low_pc"), attrs.get("DW_AT_high_pc")
        if low is None or high is None:
            return []
        hi = high.value if high.form in _HIGH_PC_ADDRESS_FORMS else low.value + high.value
        return [(low.value, hi)] if low.value < hi else []

    def name_of(self, die: "DIE") -> int:
        """The string number of the function's name (``DW_AT_linkage_name``, else ``DW_AT_name``, else
        that of its ``DW_AT_abstract_origin`` or ``DW_AT_specification``), as ``bfd``'s
        ``find_abstract_instance`` names an instance."""
        known = self.names.get(die.offset)
        if known is not None:
            return known
        self.names[die.offset] = NONE  # a reference cycle in damaged DWARF ends here
        attrs = die.attributes
        name = NONE
        for key in ("DW_AT_linkage_name", "DW_AT_MIPS_linkage_name", "DW_AT_name"):
            text = _str(attrs.get(key))
            if text:
                name = self.strings(text)
                break
        else:
            for key in ("DW_AT_abstract_origin", "DW_AT_specification"):
                if key in attrs:
                    name = self.name_of(die.get_DIE_from_attribute(key))
                    break
        self.names[die.offset] = name
        return name

    def index(self, build_id: str | None) -> LineIndex:
        """The finished index: rows sorted (a sequence's end before a row starting at that address, of
        rows at one address the last kept), runs of one position merged; groups sorted by address."""
        import numpy as np

        addrs, fids, lines = (np.frombuffer(c, dtype=c.typecode) if len(c) else np.zeros(0, c.typecode)
                              for c in self.rows)
        order = np.lexsort((np.arange(len(addrs)), fids != NONE, addrs))
        addrs, fids, lines = addrs[order], fids[order], lines[order]
        last_at_address = np.append(addrs[1:] != addrs[:-1], True) if len(addrs) else np.zeros(0, bool)
        addrs, fids, lines = addrs[last_at_address], fids[last_at_address], lines[last_at_address]
        changes = np.ones(len(addrs), bool)
        changes[1:] = (fids[1:] != fids[:-1]) | (lines[1:] != lines[:-1])
        arrays: dict[str, array] = {
            "row_addr": array("Q", addrs[changes].astype(np.uint64).tobytes()),
            "row_file": array("I", fids[changes].astype(np.uint32).tobytes()),
            "row_line": array("I", lines[changes].astype(np.uint32).tobytes()),
        }
        tops = sorted(self.tops)
        arrays["top_lo"] = array("Q", [t[0] for t in tops])
        arrays["top_hi"] = array("Q", [t[1] for t in tops])
        arrays["top_first"] = array("I", [t[2] for t in tops])
        arrays["top_end"] = array("I", [t[3] for t in tops])
        arrays.update(self.die)
        arrays.update(self.rng)
        arrays.update(self.strings.arrays())
        comp_dir = self.comp_dirs.most_common(1)[0][0] if self.comp_dirs else None
        return LineIndex({"build_id": build_id, "comp_dir": comp_dir}, arrays)


def section_addresses(elf: "ELFFile") -> dict[int, int]:
    """The address of each allocated section of a relocatable object (a module's ``.ko``), keyed by section
    number: one after the other in section order, each at its alignment, as ``bfd``'s ``place_sections``
    places them for ``addr2line`` (in the file they all start at 0). Empty for a linked image."""
    if elf["e_type"] != "ET_REL":
        return {}
    out, end = {}, 0
    for i, sec in enumerate(elf.iter_sections()):
        if sec["sh_flags"] & SHF_ALLOC:
            align = max(1, sec["sh_addralign"])
            end = (end + align - 1) // align * align
            out[i] = end
            end += sec["sh_size"]
    return out


def build_index(elf: "ELFFile", build_id: str | None) -> LineIndex:
    """Read ``elf``'s DWARF with pyelftools into a :class:`LineIndex`; a relocatable object's sections
    placed by :func:`section_addresses`."""
    from elftools.common.exceptions import DWARFError, ELFError

    try:
        placed = section_addresses(elf)
        dwarf = (_placed(elf, placed) if placed else elf).get_dwarf_info()
        builder = _Builder(dwarf)
        for cu in dwarf.iter_CUs():
            builder.compile_unit(cu)
            _forget(dwarf, cu)
        return builder.index(build_id)
    except (DWARFError, ELFError, NotImplementedError, KeyError, IndexError, ValueError, AssertionError) as e:
        raise DwarfLinesError(f"unreadable DWARF: {type(e).__name__}: {e}") from None
    except Exception as e:  # construct's errors, in pyelftools' own copy of construct
        if type(e).__module__.startswith("elftools.construct"):
            raise DwarfLinesError(f"unreadable DWARF: {e}") from None
        raise


def _placed(elf: "ELFFile", addresses: dict[int, int]) -> "ELFFile":
    """``elf`` whose DWARF relocations add each symbol's section address (``addresses``) to its value, so the
    DWARF of a relocatable object's sections does not overlap at 0."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    class PlacedSymbols(SymbolTableSection):
        """The symbol table as the relocations see it: ``st_value`` plus the symbol's section address."""

        def get_symbol(self, n: int) -> Any:
            sym = super().get_symbol(n)
            shndx = sym["st_shndx"]
            if isinstance(shndx, int):
                sym.entry["st_value"] += addresses.get(shndx, 0)
            return sym

    class PlacedELF(ELFFile):
        def _make_symbol_table_section(self, section_header: Any, name: str) -> SymbolTableSection:
            strtab = self._get_linked_strtab_section(section_header["sh_link"])
            return PlacedSymbols(section_header, name, elffile=self, stringtable=strtab)

    return PlacedELF(elf.stream)


def _forget(dwarf: "DWARFInfo", cu: "CompileUnit") -> None:
    """Drop what pyelftools keeps of ``cu`` once it is indexed (its DIEs, its decoded line program, the
    abbreviation tables): a kernel's millions of DIEs and line rows would otherwise all stay in memory."""
    cu._dielist.clear()
    cu._diemap.clear()
    dwarf._linetable_cache.clear()
    dwarf._abbrevtable_cache.clear()


def _inlined_below(die: "DIE") -> Iterator["DIE"]:
    """The inlined subroutines directly inside ``die``, through lexical blocks."""
    for child in die.iter_children():
        if child.tag == "DW_TAG_inlined_subroutine":
            yield child
        elif child.tag == "DW_TAG_lexical_block":
            yield from _inlined_below(child)


def _file_names(prog: Any, comp_dir: str | None) -> list[str | None]:
    """The line table's file names as ``bfd``'s ``concat_filename`` makes them: a relative name under
    its directory, a relative directory under the compile unit's ``DW_AT_comp_dir``."""
    header = prog.header
    version = header["version"]
    dirs = [_decode(d) for d in header["include_directory"]]
    names: list[str | None] = [] if version >= 5 else [None]
    for entry in header["file_entry"]:
        name = _decode(entry.name)
        if posixpath.isabs(name):
            names.append(name)
            continue
        d = entry.dir_index
        if version >= 5:
            sub = dirs[d] if 0 <= d < len(dirs) else None
        else:
            sub = dirs[d - 1] if 1 <= d <= len(dirs) else None
        if sub is not None and posixpath.isabs(sub):
            names.append(f"{sub}/{name}")
        elif comp_dir and sub:
            names.append(f"{comp_dir}/{sub}/{name}")
        elif comp_dir or sub:
            names.append(f"{comp_dir or sub}/{name}")
        else:
            names.append(name)
    return names


def _decode(b: bytes | str) -> str:
    return b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else b


def _str(attr: Any) -> str | None:
    if attr is None or not isinstance(attr.value, (bytes, str)):
        return None
    return _decode(attr.value)


def _attr_int(die: "DIE", name: str) -> int | None:
    attr = die.attributes.get(name)
    return attr.value if attr is not None and isinstance(attr.value, int) else None


def index_for(path: str | os.PathLike[str]) -> LineIndex | None:
    """The :class:`LineIndex` of the ELF file at ``path`` (any ELF with DWARF: a vmlinux, a module, a
    program), ``None`` when it has no DWARF."""
    from .image import Image

    return LineIndex.of_image(Image(Path(path)))
