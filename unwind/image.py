"""A kernel image: full debug vmlinux, stripped vmlinux, or a slim image.

pyelftools opens the file lazily; the symbol table is decoded with numpy in
one pass (a debug vmlinux holds ~200k symbols), and text bytes are read on
demand for the call-site check and complete modes. Unpacked xz images and
decoded symbol tables are kept in ``$UNWIND_CACHE`` (default
``~/.cache/unwind``) so later runs start at once.
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
from typing import BinaryIO, Iterable, Iterator

from construct import ConstructError
from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError as ElftoolsConstructError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from .btf import Btf, BtfError
from .cachefile import (CACHE_ENV, CacheFileError, cache_dir, cache_root, mark_used, read_arrays, write_arrays,
                        write_atomically)
from .elfcore import section_data
from .symbols import SymbolError, SymbolTable

NT_GNU_BUILD_ID = "NT_GNU_BUILD_ID"
IMAGE_PATH_ENV = "UNWIND_IMAGE_PATH"
_SYMBOL_CACHE_VERSION = 3
_BUILD_ID_IN_NAME = re.compile(r"[0-9a-f]{40}")
#: what pyelftools, construct, zlib and numpy raise on a malformed image (a symbol table of a size
#: that is no multiple of its entries is numpy's ValueError; a compressed section that is not
#: deflate data is zlib's error)
_ELF_ERRORS = (ELFError, ConstructError, ElftoolsConstructError, ValueError, OverflowError, UnicodeDecodeError,
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
            self.elf = ELFFile(self._file)
        except OSError as e:
            raise ImageError(f"cannot open image {path}: {e.strerror}") from None
        except ELFError as e:
            raise ImageError(f"{path} is not an ELF image: {e}") from None
        if self.elf["e_type"] == "ET_CORE":
            raise ImageError(f"{path} is a core file (a dump), not a kernel image: give it as the DUMP "
                             "argument and the vmlinux (or slim image) to --vmlinux")
        with self._malformed():
            # every section header, name and note read once: a malformed one is an ImageError here,
            # and the later reads of the same headers cannot fail (pyelftools parses a header again
            # on each get_section(): these are the ones every later lookup uses)
            self._sections = list(self.elf.iter_sections())
            for sec in self._sections:
                if sec["sh_type"] == "SHT_NOTE":
                    list(sec.iter_notes())
            # as pyelftools' get_section_by_name: the last section of a name
            self._by_name = {sec.name: sec for sec in self._sections}
        self.machine: str = self.elf["e_machine"]
        self._text = [TextRange(sec["sh_addr"], sec["sh_offset"], sec["sh_size"]) for sec in self._sections
                      if sec["sh_flags"] & SH_FLAGS.SHF_EXECINSTR and sec["sh_flags"] & SH_FLAGS.SHF_ALLOC
                      and sec["sh_type"] == "SHT_PROGBITS" and sec["sh_size"]]
        #: why :attr:`btf` is ``None``, once asked
        self.btf_problem: str | None = None

    def close(self) -> None:
        """Close the underlying file."""
        self._file.close()

    @contextmanager
    def _malformed(self) -> Iterator[None]:
        """pyelftools and construct errors of a malformed image as one :class:`ImageError` line."""
        try:
            yield
        except _ELF_ERRORS as e:
            text = str(e.args[0]) if e.args else type(e).__name__
            raise ImageError(f"{self.path}: malformed ELF image: {text.splitlines()[0][:200] if text else type(e).__name__}") from None

    @cached_property
    def build_id(self) -> str | None:
        """The hex NT_GNU_BUILD_ID, or ``None``."""
        return _build_id_of(self._sections)

    @cached_property
    def symbols(self) -> SymbolTable:
        """The kallsyms-like symbol table, from the cache when this build was seen before."""
        cache = cache_dir("symbols")
        path = cache / f"{self.build_id}-v{_SYMBOL_CACHE_VERSION}.arrays" if cache and self.build_id else None
        if path is not None and path.exists():
            try:
                table = SymbolTable.from_arrays(read_arrays(path)[1])
                mark_used(path)
                return table
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
        if symtab is None or symtab["sh_type"] == "SHT_NOBITS":
            raise ImageError(f"{self.path}: no .symtab (use a System.map)")
        if not 0 <= symtab["sh_link"] < len(self._sections):
            raise ImageError(f"{self.path}: .symtab names string table {symtab['sh_link']}, which does not exist")
        strtab = section_data(self._sections[symtab["sh_link"]])
        raw = np.frombuffer(section_data(symtab), dtype=np.dtype(_ELF64_SYM))
        exec_sections = np.array([bool(sec["sh_flags"] & SH_FLAGS.SHF_EXECINSTR)
                                  for sec in self._sections] + [False])
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
        try:
            return Btf.cached(sec[1])
        except BtfError as e:
            self.btf_problem = f"the image's .BTF is unreadable: {e}"
            return None

    def section(self, name: str) -> tuple[int, bytes] | None:
        """``(sh_addr, data)`` of a section with file contents, or ``None``."""
        with self._malformed():
            sec = self._by_name.get(name)
            if sec is None or sec["sh_type"] == "SHT_NOBITS":
                return None
            return sec["sh_addr"], section_data(sec)

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
        for sec in self._sections:
            if sec["sh_type"] == "SHT_PROGBITS" and sec["sh_addr"] <= sym < sec["sh_addr"] + sec["sh_size"]:
                with self._malformed():  # the banner's bytes only, not the whole section
                    data = self._read_at(sec["sh_offset"] + sym - sec["sh_addr"],
                                         min(256, sec["sh_addr"] + sec["sh_size"] - sym))
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
    return io.BytesIO(data)


def read_build_id(elf: ELFFile) -> str | None:
    """The hex build-id from any note section of ``elf``."""
    return _build_id_of(elf.iter_sections())


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
            return read_build_id(ELFFile(f))
    except (OSError, ELFError, ImageError, ValueError):
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


def _looks_like_image(p: Path) -> bool:
    name = p.name.removesuffix(".xz")
    return name.startswith("vmlinux") or name.endswith((".elf", ".slim", ".debug"))


@lru_cache(maxsize=8)
def open_image(path: Path) -> Image:
    """Open an image once per process: a corpus has many dumps of one kernel."""
    return Image(path)


def find_image(build_id: str | None, dump_path: str | Path | None = None, explicit: str | Path | None = None,
               release: str | None = None) -> Image | None:
    """Find the kernel image of ``build_id``: ``explicit`` (``--vmlinux``), then ``$UNWIND_IMAGE_PATH``
    with its subfolders, the dump's folder and three parents, the debuginfo store
    (``/usr/lib/debug/.build-id/xx/yyyy.debug``, ``/usr/lib/debug/boot/vmlinux-<release>``) and the
    kernels ``unwind kernels fetch`` put in the cache. Candidates are checked by build-id; an explicit
    image whose build-id differs is refused. ``None`` when nothing matches (or no build-id is known).
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
            if img.build_id == build_id:
                return img
        elif image_build_id(cand) == build_id:
            return open_image(cand.resolve())
    return None
