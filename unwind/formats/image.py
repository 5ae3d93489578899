"""A kernel image: full debug vmlinux, stripped vmlinux, or a slim image.

pyelftools reads the section headers and notes; the symbol table is decoded
with numpy in one pass (a debug vmlinux holds ~200k symbols), and text bytes
are read on demand for the call-site check and complete modes. Unpacked xz
images, what pyelftools read of each image file's headers (keyed by the
file's device, inode, size and modification time) and decoded symbol tables
are kept in ``$UNWIND_CACHE`` (default ``~/.cache/unwind``) so later runs
start at once, without pyelftools.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import zlib
from dataclasses import dataclass
from contextlib import contextmanager
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator

from construct import ConstructError
from elftools.common.exceptions import ELFError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.structs import ELFStructs

from .cachefile import (CacheFileError, cache_dir, cache_root, mark_used, read_arrays, write_arrays,
                        write_atomically)
from .elfcore import check_section_fits, section_data
from unwind.kernel.symbols import SymbolError, SymbolTable

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

    from unwind.kernel.btf import Btf

NT_GNU_BUILD_ID = "NT_GNU_BUILD_ID"
IMAGE_PATH_ENV = "UNWIND_IMAGE_PATH"
_SYMBOL_CACHE_VERSION = 3
#: the layout of ``$UNWIND_CACHE/images/*.headers-vN.json`` (:class:`Headers`)
_HEADERS_CACHE_VERSION = 1
_BUILD_ID_IN_NAME = re.compile(r"[0-9a-f]{40}")


@lru_cache(maxsize=1)
def _elf_errors() -> tuple[type[Exception], ...]:
    """What pyelftools, construct, zlib and numpy raise on a malformed image (a symbol table of a size
    that is no multiple of its entries is numpy's ValueError; a compressed section that is not deflate
    data is zlib's error); pyelftools' own construct is imported only once an error is seen."""
    from elftools.construct import ConstructError as ElftoolsConstructError

    return (ELFError, ConstructError, ElftoolsConstructError, ValueError, OverflowError, UnicodeDecodeError,
            zlib.error)

# Elf64_Sym as numpy sees it, to decode .symtab in one pass (numpy is imported there: a cached
# table needs none).
_ELF64_SYM = [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
              ("size", "<u8")]
_SHN_UNDEF, _SHN_ABS = 0, 0xFFF1
_STB_LOCAL, _STB_WEAK = 0, 2
_STT_SECTION, _STT_FILE = 3, 4


class ImageError(Exception):
    """The image is unusable (not ELF, no symbols, wrong build-id, ...)."""


@dataclass(frozen=True, slots=True)
class SectionHeader:
    """One section header as pyelftools read it: its index in the table, name, type and the fields used."""

    index: int
    name: str
    type: str
    flags: int
    addr: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True, slots=True)
class Headers:
    """What an ELF file's headers say: its type and machine, its build-id and every section header."""

    type: str
    machine: str
    build_id: str | None
    sections: tuple[SectionHeader, ...]

    def to_json(self) -> dict[str, Any]:
        """The cache entry's contents."""
        return {"version": _HEADERS_CACHE_VERSION, "type": self.type, "machine": self.machine, "build_id": self.build_id,
                "sections": [[h.index, h.name, h.type, h.flags, h.addr, h.offset, h.size, h.link]
                             for h in self.sections]}

    @classmethod
    def from_json(cls, doc: Any) -> "Headers":
        """A cache entry read back; ``ValueError`` (``KeyError``, ``TypeError``) when it is not one of this layout."""
        if doc["version"] != _HEADERS_CACHE_VERSION:
            raise ValueError("another layout")
        build_id = doc["build_id"]
        sections = tuple(SectionHeader(int(i), str(n), str(t), int(f), int(a), int(o), int(z), int(ln))
                         for i, n, t, f, a, o, z, ln in doc["sections"])
        if any(h.index != i for i, h in enumerate(sections)) or not (build_id is None or isinstance(build_id, str)):
            raise ValueError("not a section table")
        return cls(str(doc["type"]), str(doc["machine"]), build_id, sections)


@dataclass(frozen=True, slots=True)
class TextRange:
    """An executable section with file contents: its address, file offset and size."""

    start: int
    offset: int
    size: int


class Image:
    """Symbols, text and unwind sections of a kernel ELF image."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: BinaryIO = _open_maybe_compressed(self.path)
            headers = _headers(self._file, self.path, self.__dict__)
        except OSError as e:
            raise ImageError(f"cannot open image {path}: {e.strerror}") from None
        except ELFError as e:
            raise ImageError(f"{path} is not an ELF image: {e}") from None
        if headers.type == "ET_CORE":
            raise ImageError(f"{path} is a core file (a dump), not a kernel image: give it as the DUMP "
                             "argument and the vmlinux (or slim image) to --vmlinux")
        self.machine: str = headers.machine
        self._headers = headers
        # as pyelftools' get_section_by_name: the last section of a name
        self._by_name = {h.name: h for h in headers.sections}
        self._text = [TextRange(h.addr, h.offset, h.size) for h in headers.sections
                      if h.flags & SH_FLAGS.SHF_EXECINSTR and h.flags & SH_FLAGS.SHF_ALLOC
                      and h.type == "SHT_PROGBITS" and h.size]
        #: why :attr:`btf` is ``None``, once asked
        self.btf_problem: str | None = None

    @cached_property
    def elf(self) -> "ELFFile":
        """pyelftools' view of the file (opened when first asked: an image whose headers are cached needs none)."""
        from elftools.elf.elffile import ELFFile

        with self._malformed():
            return ELFFile(self._file)

    @cached_property
    def _sections(self) -> list[Any]:
        """pyelftools' sections, in table order."""
        with self._malformed():
            return list(self.elf.iter_sections())

    def close(self) -> None:
        """Close the underlying file."""
        self._file.close()

    @contextmanager
    def _malformed(self) -> Iterator[None]:
        """pyelftools and construct errors of a malformed image as one :class:`ImageError` line."""
        with _malformed(self.path):
            yield

    @property
    def build_id(self) -> str | None:
        """The hex NT_GNU_BUILD_ID, or ``None``."""
        return self._headers.build_id

    @property
    def sections_with_contents(self) -> frozenset[str]:
        """The names of the sections the file holds bytes of (not ``SHT_NOBITS``): a slim image keeps the
        headers of sections it dropped."""
        return frozenset(h.name for h in self._headers.sections if h.type not in ("SHT_NOBITS", "SHT_NULL"))

    @cached_property
    def symbols(self) -> SymbolTable:
        """The kallsyms-like symbol table, from the cache when this build was seen before."""
        cache = cache_dir("symbols")
        path = cache / f"{self.build_id}-v{_SYMBOL_CACHE_VERSION}.arrays" if cache and self.build_id else None
        if path is not None and path.exists():
            try:
                return SymbolTable.from_arrays(read_arrays(path)[1])
            except (OSError, CacheFileError, SymbolError):
                pass  # a damaged cache entry is rebuilt below
        table = self._read_symbols()
        if path is not None:
            write_atomically(path, lambda f: write_arrays(f, {"build_id": self.build_id}, table.to_arrays()))
        return table

    def _read_symbols(self) -> SymbolTable:
        """Decode ``.symtab`` into a kallsyms-like table."""
        with self._malformed():
            return self._decode_symbols()

    def _decode_symbols(self) -> SymbolTable:
        import numpy as np

        symtab = self._by_name.get(".symtab")
        if symtab is None or symtab.type == "SHT_NOBITS":
            raise ImageError(f"{self.path}: no .symtab (use a System.map)")
        if not 0 <= symtab.link < len(self._headers.sections):
            raise ImageError(f"{self.path}: .symtab names string table {symtab.link}, which does not exist")
        strtab = section_data(self._sections[symtab.link])
        raw = np.frombuffer(section_data(self._sections[symtab.index]), dtype=np.dtype(_ELF64_SYM))
        exec_sections = np.array([bool(h.flags & SH_FLAGS.SHF_EXECINSTR)
                                  for h in self._headers.sections] + [False])
        stt, stb, shndx = raw["info"] & 0xF, raw["info"] >> 4, raw["shndx"]
        keep = (stt != _STT_SECTION) & (stt != _STT_FILE) & (shndx != _SHN_UNDEF) & (raw["name"] != 0)
        raw, stb, shndx = raw[keep], stb[keep], shndx[keep]
        is_text = exec_sections[np.minimum(shndx, len(exec_sections) - 1)]
        # the nm letter: A absolute, W weak, T/t text, D/d anything else (lower case when local)
        letters = np.where(is_text, ord("T"), ord("D"))
        letters = np.where(stb == _STB_LOCAL, letters + 32, letters)
        letters = np.where(stb == _STB_WEAK, ord("W"), letters)
        letters = np.where(shndx == _SHN_ABS, ord("A"), letters)
        names: dict[int, str] = {}
        pos = 0
        for part in strtab.split(b"\0"):
            names[pos] = part.decode("ascii", "replace")
            pos += len(part) + 1
        entries = []
        for name_off, letter, value in zip(raw["name"].tolist(), letters.tolist(), raw["value"].tolist()):
            name = names.get(name_off)
            if name is None:  # a tail-merged string starts inside another
                name = strtab[name_off:strtab.index(b"\0", name_off)].decode("ascii", "replace")
            entries.append((value, chr(letter), name))
        # kallsyms reads `nm -n`, which orders symbols at one address by name
        entries.sort(key=lambda e: (e[0], e[2]))
        try:
            return SymbolTable(entries)
        except SymbolError as e:
            raise ImageError(f"{self.path}: {e}") from None

    @cached_property
    def btf(self) -> Btf | None:
        """The kernel's type information from ``.BTF``, or ``None`` (see :attr:`btf_problem`)."""
        sec = self.section(".BTF")
        if sec is None:
            self.btf_problem = "the image has no .BTF"
            return None
        from unwind.kernel.btf import Btf, BtfError

        try:
            return Btf.cached(sec[1])
        except BtfError as e:
            self.btf_problem = f"the image's .BTF is unreadable: {e}"
            return None

    def section(self, name: str) -> tuple[int, bytes] | None:
        """``(sh_addr, data)`` of a section with file contents, or ``None``."""
        h = self._by_name.get(name)
        if h is None or h.type == "SHT_NOBITS":
            return None
        with self._malformed():
            if h.flags & SH_FLAGS.SHF_COMPRESSED:  # pyelftools inflates it
                return h.addr, section_data(self._sections[h.index])
            check_section_fits(h.name, h.offset, h.size, self._file.seek(0, 2))
            return h.addr, self._read_at(h.offset, h.size)

    def _read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes of the file at ``offset`` (``pread``: no shared file position to race on)."""
        if isinstance(self._file, io.BytesIO):
            return bytes(self._file.getbuffer()[offset:offset + size])
        return os.pread(self._file.fileno(), size, offset)

    @property
    def has_text(self) -> bool:
        """True when the image carries the kernel's instructions (from the section headers)."""
        return bool(self._text)

    def text(self, addr: int, size: int) -> bytes | None:
        """Instruction bytes at ``[addr, addr + size)``, or ``None`` when not in the image.

        Only those bytes are read from the file: a call-site check reads a few per return address.
        """
        for r in self._text:
            if r.start <= addr and addr + size <= r.start + r.size:
                data = self._read_at(r.offset + addr - r.start, size)
                return data if len(data) == size else None  # a truncated image holds less than it says
        return None

    @cached_property
    def release(self) -> str | None:
        """The kernel release from ``linux_banner`` when the image holds it."""
        sym = self.symbols.address("linux_banner")
        if sym is None:
            return None
        for h in self._headers.sections:
            if h.type == "SHT_PROGBITS" and h.addr <= sym < h.addr + h.size:
                with self._malformed():  # the banner's bytes only, not the whole section
                    data = self._read_at(h.offset + sym - h.addr, min(256, h.addr + h.size - sym))
                parts = data.split(b"\0", 1)[0].split()
                if len(parts) >= 3 and parts[0] == b"Linux" and parts[1] == b"version":
                    return parts[2].decode("ascii", "replace")
        return None


def _open_maybe_compressed(path: Path) -> BinaryIO:
    """Open an image; an xz-compressed one (a committed slim image) is unpacked once into the cache."""
    f = open(path, "rb")
    if f.read(6) != b"\xfd7zXZ\x00":
        f.seek(0)
        return f
    f.seek(0)
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    cache = cache_dir("images")
    unpacked = cache / f"{key}.elf" if cache else None
    try:
        if unpacked is not None:
            try:
                cached = open(unpacked, "rb")
            except OSError:
                pass  # not unpacked yet, or pruned since: unpack it
            else:
                mark_used(unpacked)
                return cached
        data = lzma.decompress(f.read())
    except lzma.LZMAError as e:
        raise ImageError(f"{path}: corrupt xz image: {e}") from None
    finally:
        f.close()
    if unpacked is not None:
        write_atomically(unpacked, lambda out: out.write(data))
        try:
            return open(unpacked, "rb")  # the file, as when opened again: its headers' cache entry is written now
        except OSError:
            pass  # not written (or pruned since)
    return io.BytesIO(data)


@contextmanager
def _malformed(path: Path) -> Iterator[None]:
    """pyelftools and construct errors of a malformed image as one :class:`ImageError` line."""
    try:
        yield
    except Exception as e:
        if not isinstance(e, _elf_errors()):
            raise
        text = str(e.args[0]) if e.args else type(e).__name__
        raise ImageError(f"{path}: malformed ELF image: {text.splitlines()[0][:200] if text else type(e).__name__}") from None


def _headers(f: BinaryIO, path: Path, kept: dict[str, Any] | None = None) -> Headers:
    """The headers of the open ELF file ``f``: from the cache when this file was read before, else read by
    pyelftools (every section header, name and note once: a malformed one is an :class:`ImageError` here,
    and the later reads of the same headers cannot fail) and kept there. ``kept``: where pyelftools' file
    and sections go when they are read (an :class:`Image`'s ``elf`` and ``_sections``)."""
    entry = _headers_entry(f)
    headers = _read_cached_headers(entry) if entry is not None else None
    if headers is not None:
        return headers
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(f)
    with _malformed(path):
        sections = list(elf.iter_sections())
        for sec in sections:
            if sec["sh_type"] == "SHT_NOTE":
                list(sec.iter_notes())
        headers = Headers(elf["e_type"], elf["e_machine"], _build_id_of(sections),
                          tuple(SectionHeader(i, sec.name, sec["sh_type"], sec["sh_flags"], sec["sh_addr"],
                                              sec["sh_offset"], sec["sh_size"], sec["sh_link"])
                                for i, sec in enumerate(sections)))
    if kept is not None:
        kept["elf"], kept["_sections"] = elf, sections
    if entry is not None:
        doc = json.dumps(headers.to_json()).encode()
        write_atomically(entry, lambda out: out.write(doc))
    return headers


def _headers_entry(f: BinaryIO) -> Path | None:
    """The cache entry of what pyelftools reads of the headers of the open file ``f``, named after the file's
    device, inode, size and modification time; ``None`` for an image in memory or without a cache folder."""
    if isinstance(f, io.BytesIO):
        return None
    try:
        st = os.fstat(f.fileno())
    except (OSError, ValueError):
        return None
    folder = cache_dir("images")
    if folder is None:
        return None
    key = hashlib.sha1(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return folder / f"{key}.headers-v{_HEADERS_CACHE_VERSION}.json"


def _read_cached_headers(entry: Path) -> Headers | None:
    """The headers kept in ``entry``; ``None`` when it is missing or damaged (then they are read again)."""
    try:
        headers = Headers.from_json(json.loads(entry.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    mark_used(entry)
    return headers


def _build_id_of(sections: Iterable) -> str | None:
    for sec in sections:
        if sec["sh_type"] != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_type"] == NT_GNU_BUILD_ID and note["n_name"] == "GNU":
                return note["n_desc"]
    return None


def image_build_id(path: str | Path) -> str | None:
    """The build-id of an ELF file, or ``None`` if it is not a readable ELF."""
    try:
        with _open_maybe_compressed(Path(path)) as f:
            return _headers(f, Path(path)).build_id
    except (OSError, ELFError, ImageError, ValueError):
        return None


def image_machine(path: str | Path) -> str | None:
    """``e_machine`` of an ELF image (``EM_RISCV``), read from its first bytes, an ``.xz`` one's without
    unpacking it whole; ``None`` if it is not a 64-bit little-endian ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        if head.startswith(b"\xfd7zXZ\x00"):
            head = lzma.LZMADecompressor().decompress(head, max_length=64)
        if head[:6] != b"\x7fELF\x02\x01" or len(head) < 64:
            return None
        structs = ELFStructs(little_endian=True, elfclass=64)
        structs.create_basic_structs()
        structs.create_advanced_structs()
        return str(structs.Elf_Ehdr.parse(head[:64]).e_machine)
    except (OSError, lzma.LZMAError, *_elf_errors()):
        return None


#: the debuginfo root packages install into (``/usr/lib/debug/.build-id/``, ``/usr/lib/debug/boot/``)
DEBUG_ROOT = Path("/usr/lib/debug")


def _image_files(folder: Path) -> list[Path]:
    """Image-like files in ``folder`` (not below it)."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_file() and _looks_like_image(p))
    except OSError:
        return []


def _image_files_below(folder: Path) -> list[Path]:
    """Image-like files in ``folder`` and every subfolder (symlinked folders are not followed)."""
    out: list[Path] = []
    for root, dirs, files in os.walk(folder, onerror=lambda e: None):
        dirs.sort()
        out.extend(Path(root) / f for f in sorted(files) if _looks_like_image(Path(root) / f))
    return out


def _fetched_kernels(build_id: str) -> list[Path]:
    """``vmlinux`` of the kernels ``unwind kernels fetch`` put in the cache whose ``kernel.json`` names ``build_id``."""
    out = []
    for meta in sorted((cache_root() / "kernels").glob("*/kernel.json")):
        try:
            if json.loads(meta.read_text()).get("build_id") == build_id:
                out.append(meta.parent / "vmlinux")
        except (OSError, ValueError, AttributeError):
            continue
    return out


def image_search_places(dump_path: str | Path | None, release: str | None) -> list[str]:
    """Where :func:`find_image` looks after ``--vmlinux``, in order, as a user would write them."""
    places = [f"${IMAGE_PATH_ENV} (and subfolders)" if os.environ.get(IMAGE_PATH_ENV) else f"${IMAGE_PATH_ENV} (unset)"]
    if dump_path is not None:
        places.append(f"{Path(dump_path).resolve().parent} and 3 parents")
    places.append(f"{DEBUG_ROOT}/.build-id/")
    if release:
        places.append(f"{DEBUG_ROOT}/boot/vmlinux-{release}")
    places.append(f"{cache_root()}/kernels/")
    return places


def _candidates(build_id: str, dump_path: Path | None, release: str | None) -> Iterator[Path]:
    """Candidate files in the documented order (README "Finding the kernel image")."""
    for d in os.environ.get(IMAGE_PATH_ENV, "").split(os.pathsep):
        if d and Path(d).is_dir():
            yield from _image_files_below(Path(d))
    if dump_path is not None:
        folder = dump_path.resolve().parent
        for d in [folder, *folder.parents][:4]:
            yield from _image_files(d)
    yield DEBUG_ROOT / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    if release:
        yield DEBUG_ROOT / "boot" / f"vmlinux-{release}"
        yield DEBUG_ROOT / "lib" / "modules" / release / "vmlinux"
    yield from _fetched_kernels(build_id)


def images_near(dump_path: str | Path | None) -> Iterator[Path]:
    """Every image file :func:`find_image` would look at, for a dump with no build-id to look for:
    ``$UNWIND_IMAGE_PATH`` with its subfolders, the dump's folder and three parents, and the kernels
    ``unwind kernels fetch`` put in the cache; each once, in that order."""
    seen: set[Path] = set()
    places: list[Iterable[Path]] = [_image_files_below(Path(d)) for d in os.environ.get(IMAGE_PATH_ENV, "").split(os.pathsep)
                                    if d and Path(d).is_dir()]
    if dump_path is not None:
        folder = Path(dump_path).resolve().parent
        places += [_image_files(d) for d in [folder, *folder.parents][:4]]
    places.append(sorted((cache_root() / "kernels").glob("*/vmlinux")))
    for cand in (c for place in places for c in place):
        if cand not in seen and cand.is_file():
            seen.add(cand)
            yield cand


def _looks_like_image(p: Path) -> bool:
    name = p.name.removesuffix(".xz")
    return name.startswith("vmlinux") or name.endswith((".elf", ".slim", ".debug"))


@lru_cache(maxsize=8)
def open_image(path: Path) -> Image:
    """Open an image once per process: a corpus has many dumps of one kernel."""
    return Image(path)


def find_image(build_id: str | None, dump_path: str | Path | None = None, explicit: str | Path | None = None,
               release: str | None = None, accept: Callable[[Image], bool] | None = None) -> Image | None:
    """Find the kernel image of ``build_id``: ``explicit`` (``--vmlinux``), then ``$UNWIND_IMAGE_PATH``
    with its subfolders, the dump's folder and three parents, the debuginfo store
    (``/usr/lib/debug/.build-id/xx/yyyy.debug``, ``/usr/lib/debug/boot/vmlinux-<release>``) and the
    kernels ``unwind kernels fetch`` put in the cache. Candidates are checked by build-id; an explicit
    image whose build-id differs is refused. ``None`` when nothing matches (or no build-id is known).
    ``accept`` narrows the search to the images it accepts (one with DWARF, say).
    """
    if explicit is not None:
        img = open_image(Path(explicit).resolve())
        if build_id and img.build_id and img.build_id != build_id:
            raise ImageError(f"{explicit}: build-id {img.build_id} does not match the dump's {build_id}")
        return img
    if not build_id:
        return None
    seen: set[Path] = set()
    for cand in _candidates(build_id, Path(dump_path) if dump_path is not None else None, release):
        if cand in seen or not cand.is_file():
            continue
        seen.add(cand)
        named = _BUILD_ID_IN_NAME.findall(cand.name)
        if named and build_id not in named:
            continue  # named after another build: skip without unpacking it
        if named:
            try:
                img = open_image(cand.resolve())
            except ImageError:
                continue
            if img.build_id == build_id and (accept is None or accept(img)):
                return img
        elif image_build_id(cand) == build_id:
            img = open_image(cand.resolve())
            if accept is None or accept(img):
                return img
    return None
