"""Host-side vmcore recipes: makedumpfile's filtered and flattened files from QEMU's ELF vmcore.

``unwind capture --vmcore`` has QEMU write its vmcores of a stop; these
functions derive the makedumpfile variants of the same stop on the host:

* ``<stem>.mdf-c-d31.kdump``: ``makedumpfile -c -d 31 -x <vmlinux>`` (kdump-compressed, zlib, level 31);
* ``<stem>.mdf-F-c-d31.flat``: the same with ``-F`` (flattened, what Debian's kdump-tools writes);
* ``<stem>.kdump-zlib.kdump``: QEMU's flattened ``-z`` file reassembled by ``makedumpfile -R``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from elftools.construct.lib import Container
from elftools.elf.elffile import ELFFile

from .fetch import ARCHES, _download, cache_dir, newest_version

if TYPE_CHECKING:
    import numpy as np


class VmcoreToolError(Exception):
    """A host tool failed; the message is one line for the user."""


def _stem(path: Path) -> str:
    return path.name.split(".")[0]


def phdrs_first_copy(src: Path, dst: Path) -> Path:
    """Copy QEMU's ELF vmcore ``src`` to ``dst`` with the program headers right after the ELF header.

    makedumpfile reads program header ``i`` at ``sizeof(Elf64_Ehdr) + i * sizeof(Elf64_Phdr)``
    whatever ``e_phoff`` says (``elf_info.c`` get_elf64_phdr), while QEMU 7.2 puts its section
    headers there and the program headers after them. Notes and memory keep their offsets; the
    section headers (only there for ``PN_XNUM``) are dropped, so this refuses a file that needs them.
    """
    with open(src, "rb") as f:
        elf = ELFFile(f)
        h = elf.header
        ehsize = elf.structs.Elf_Ehdr.sizeof()
        phsize = h["e_phnum"] * h["e_phentsize"]
        if h["e_phnum"] == 0xFFFF:
            raise VmcoreToolError(f"{src.name}: PN_XNUM program headers cannot move before the section headers")
        first = min(seg["p_offset"] for seg in elf.iter_segments() if seg["p_filesz"])
        if ehsize + phsize > first:
            raise VmcoreToolError(f"{src.name}: no room for the program headers after the ELF header")
        f.seek(h["e_phoff"])
        phdrs = f.read(phsize)
        header = Container(**h)
        header.update(e_phoff=ehsize, e_ehsize=ehsize, e_shoff=0, e_shnum=0, e_shstrndx=0)
        raw_header = elf.structs.Elf_Ehdr.build(header)
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as out:
        out.write(raw_header)
        out.write(phdrs)
        out.write(b"\0" * (first - ehsize - phsize))
    return dst


#: Debian packages of makedumpfile's libraries (``name/suite``), beside makedumpfile of the suite asked for.
#: Not the host's own makedumpfile: bookworm's 1.7.2 takes 6.10+ slab pages (page_type) for free ones and
#: excludes them at -d 16, and one build of makedumpfile reads the dumps of one arch only
MAKEDUMPFILE_LIBRARIES = ("libc6/trixie", "libdw1t64/trixie", "libelf1t64/trixie",
                         "liblzo2-2/trixie", "libzstd1/trixie", "zlib1g/trixie", "libbz2-1.0/trixie",
                         "liblzma5/trixie")
#: our arch -> (qemu-user binary suffix, Debian multiarch triplet, dynamic loader)
QEMU_USER = {"x86_64": ("x86_64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2"),
             "arm64": ("aarch64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1"),
             "riscv": ("riscv64", "riscv64-linux-gnu", "ld-linux-riscv64-lp64d.so.1")}


def makedumpfile_command(arch: str, suite: str = "sid") -> list[str]:
    """The command that runs the makedumpfile of Debian ``suite`` built for ``arch`` on this host.

    The package and its libraries are unpacked into ``<cache>/tools/makedumpfile-<dpkg arch>/``
    (sid's; another suite's in ``makedumpfile-<suite>-<dpkg arch>/``); the host's arch runs it
    through the unpacked loader, other arches under ``qemu-<arch>-static``.
    """
    dpkg_arch = ARCHES[arch][0]
    qarch, triplet, loader = QEMU_USER[arch]
    root = cache_dir() / "tools" / ("makedumpfile-" + ("" if suite == "sid" else f"{suite}-") + dpkg_arch)
    binary = root / "usr" / "bin" / "makedumpfile"
    if not binary.exists():
        debs = root.parent / f"debs-{dpkg_arch}"
        debs.mkdir(parents=True, exist_ok=True)
        for pkg in (f"makedumpfile/{suite}", *MAKEDUMPFILE_LIBRARIES):
            name, _, suite = pkg.partition("/")
            deb = _download(name, newest_version(f"{name}:{dpkg_arch}", suite), dpkg_arch, debs)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (root / "lib").unlink(missing_ok=True)
        (root / "lib").symlink_to("usr/lib")  # merged /usr: the loader is looked up in /lib
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    if dpkg_arch == native:
        libs = root / "usr" / "lib" / triplet
        return [str(libs / loader), "--library-path", str(libs), str(binary)]
    qemu = f"qemu-{qarch}-static"
    if shutil.which(qemu) is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "qemu-user-static"], check=True, capture_output=True)
    return [qemu, "-L", str(root), str(binary)]


#: makedumpfile's progress lines on stderr
_PROGRESS = re.compile(r"(Checking|Excluding|Copying|Calculating|Saving)\b")


def _makedumpfile(cmd: list[str], stdout=None) -> None:
    try:
        r = subprocess.run(cmd, stdout=stdout if stdout is not None else subprocess.PIPE,
                           stderr=subprocess.PIPE, text=False, timeout=1800)
    except FileNotFoundError:
        raise VmcoreToolError("makedumpfile not found (apt-get install makedumpfile)") from None
    if r.returncode != 0:
        text = r.stderr.decode(errors="replace").replace("\r", "\n")
        msg = [ln for ln in text.splitlines() if ln.strip() and not _PROGRESS.match(ln)]
        raise VmcoreToolError(f"makedumpfile {' '.join(cmd[-2:])}: {msg[0] if msg else f'exit {r.returncode}'}")


def makedumpfile_variants(elf: Path, arch: str, vmlinux: Path | None = None, vmcoreinfo: str | None = None,
                          level: int = 31, tool: list[str] | None = None) -> list[Path]:
    """Write the makedumpfile files of QEMU's ELF vmcore ``elf`` beside it; returns their paths.

    The kernel's layout comes from ``-x vmlinux`` when given, else from a ``vmcoreinfo`` text
    (``-i``; for a dump without the VMCOREINFO note), else from the dump's own VMCOREINFO note.
    A foreign-arch makedumpfile runs under qemu-user, where parsing a vmlinux's DWARF takes
    many minutes: give it the note or ``vmcoreinfo`` instead. ``tool`` is another makedumpfile
    command than sid's package (one built for ``arch``, e.g. from makedumpfile's sources).
    """
    d, stem = elf.parent, _stem(elf)
    fixed = d / f".{stem}.mdf-input.elf"
    info = d / f".{stem}.vmcoreinfo"
    phdrs_first_copy(elf, fixed)
    out = [d / f"{stem}.mdf-c-d{level}.kdump", d / f"{stem}.mdf-F-c-d{level}.flat"]
    layout: list[str] = []
    if vmlinux is not None:
        layout = ["-x", str(vmlinux)]
    elif vmcoreinfo:
        info.write_text(vmcoreinfo)
        layout = ["-i", str(info)]
    tool = tool or makedumpfile_command(arch)
    try:
        for p in out:
            p.unlink(missing_ok=True)
        _makedumpfile([*tool, "-c", "-d", str(level), *layout, str(fixed), str(out[0])])
        with open(out[1], "wb") as f:
            _makedumpfile([*tool, "-F", "-c", "-d", str(level), *layout, str(fixed)], stdout=f)
    finally:
        fixed.unlink(missing_ok=True)
        info.unlink(missing_ok=True)
    return out


def reassemble(flat: Path) -> Path:
    """``makedumpfile -R``: the kdump-compressed file of a flattened one, beside it (``.flat`` -> ``.kdump``)."""
    out = flat.with_suffix(".kdump")
    out.unlink(missing_ok=True)
    with open(flat, "rb") as f:
        try:
            r = subprocess.run(["makedumpfile", "-R", str(out)], stdin=f, capture_output=True, timeout=600)
        except FileNotFoundError:
            raise VmcoreToolError("makedumpfile not found (apt-get install makedumpfile)") from None
    if r.returncode != 0:
        msg = [ln for ln in r.stderr.decode(errors="replace").splitlines() if ln.strip()]
        raise VmcoreToolError(f"makedumpfile -R {out.name}: {msg[0] if msg else f'exit {r.returncode}'}")
    return out


def slice_elf(src: Path, dst: Path, pages: set[int], page_size: int = 4096) -> Path:
    """Write an ELF vmcore holding ``src``'s notes and only its physical ``pages`` (page frame numbers).

    The ELF header and the notes are ``src``'s, as is the first page of each of its PT_LOADs; each
    run of consecutive pages becomes one PT_LOAD (``p_vaddr = p_paddr``, as QEMU writes them without
    paging), and each gap between them inside one of ``src``'s PT_LOADs a PT_LOAD with no bytes in the
    file (``p_filesz`` 0): the slice describes the RAM ``src`` describes, the pages cut away read as
    excluded from the dump (as ``makedumpfile -E`` writes them), and memory ``src`` never described stays
    outside every segment. A reader that works on the slice needs nothing else of the dump.
    """
    import bisect

    with open(src, "rb") as f:
        elf = ELFFile(f)
        structs = elf.structs
        loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_memsz"]]
        note = next(s for s in elf.iter_segments() if s["p_type"] == "PT_NOTE")
        notes = note.data()
        # each RAM block keeps its first page, so the slice's RAM starts where the guest's did
        # (readers place the riscv image from the start of RAM)
        pages = set(pages) | {seg["p_paddr"] // page_size for seg in loads if seg["p_filesz"]}
        runs: list[tuple[int, int]] = []
        for pfn in sorted(pages):
            if runs and runs[-1][1] == pfn:
                runs[-1] = (runs[-1][0], pfn + 1)
            else:
                runs.append((pfn, pfn + 1))
        run_ends = [hi * page_size for _, hi in runs]
        chunks: list[tuple[int, int, bytes]] = []  # physical address, p_memsz, the bytes in the file
        for seg in loads:
            lo_seg, hi_seg = seg["p_paddr"], seg["p_paddr"] + seg["p_filesz"]
            pos = lo_seg
            for lo, hi in runs[bisect.bisect_right(run_ends, lo_seg):]:
                a, b = max(lo * page_size, lo_seg), min(hi * page_size, hi_seg)
                if a >= hi_seg:
                    break
                if a > pos:
                    chunks.append((pos, a - pos, b""))
                f.seek(seg["p_offset"] + a - lo_seg)
                chunks.append((a, b - a, f.read(b - a)))
                pos = b
            if pos < lo_seg + seg["p_memsz"]:
                chunks.append((pos, lo_seg + seg["p_memsz"] - pos, b""))
        header = Container(**elf.header)
    ehsize, phsize = structs.Elf_Ehdr.sizeof(), structs.Elf_Phdr.sizeof()
    phnum = 1 + len(chunks)
    if phnum >= 0xFFFF:
        raise VmcoreToolError(f"{len(chunks)} page runs and gaps need PN_XNUM program headers")
    header.update(e_phoff=ehsize, e_ehsize=ehsize, e_phnum=phnum, e_phentsize=phsize,
                  e_shoff=0, e_shnum=0, e_shstrndx=0, e_shentsize=0)
    offset = ehsize + phnum * phsize
    phdrs = [structs.Elf_Phdr.build(Container(p_type="PT_NOTE", p_flags=0, p_offset=offset, p_vaddr=0,
                                              p_paddr=0, p_filesz=len(notes), p_memsz=len(notes), p_align=0))]
    offset += len(notes)
    for paddr, memsz, data in chunks:
        phdrs.append(structs.Elf_Phdr.build(Container(p_type="PT_LOAD", p_flags=7, p_offset=offset,
                                                      p_vaddr=paddr, p_paddr=paddr, p_filesz=len(data),
                                                      p_memsz=memsz, p_align=0)))
        offset += len(data)
    with open(dst, "wb") as out:
        out.write(structs.Elf_Ehdr.build(header))
        out.write(b"".join(phdrs))
        out.write(notes)
        for _, _, data in chunks:
            out.write(data)
    return dst


def _bitmap_bits(image: bytes | bytearray, offset: int, nbytes: int) -> np.ndarray:
    import numpy as np

    return np.unpackbits(np.frombuffer(image, dtype=np.uint8, count=nbytes, offset=offset), bitorder="little")


def _keep_dumped_pages(image: bytearray, pages: set[int]) -> None:
    """Leave dumped in the kdump-compressed ``image`` only the pfns in ``pages``, every byte in its place.

    Bitmap 2 keeps the pages that are in both; as a page's descriptor is its rank among the set bits of
    bitmap 2 (makedumpfile ``write_kdump_pages``), the kept descriptors move up and zeros follow them;
    the data of the other pages is zeroed unless a kept descriptor shares it (the one page of zeros).
    """
    import numpy as np

    from unwind.formats.vmcore.diskdump import _DESC_DTYPE, Disk_dump_header

    h = Disk_dump_header.parse(bytes(image[:Disk_dump_header.sizeof()]))
    bitmaps = (1 + h.sub_hdr_size) * h.block_size
    half = h.bitmap_blocks * h.block_size // 2
    dumped = np.flatnonzero(_bitmap_bits(image, bitmaps + half, half))
    keep = np.isin(dumped, np.fromiter(pages, dtype=np.int64, count=len(pages)))
    bits = np.zeros(half * 8, dtype=np.uint8)
    bits[dumped[keep]] = 1
    image[bitmaps + half:bitmaps + 2 * half] = np.packbits(bits, bitorder="little").tobytes()
    start = bitmaps + 2 * half
    descs = np.frombuffer(image, dtype=_DESC_DTYPE, count=len(dumped), offset=start).copy()
    shared = set(descs["offset"][keep].tolist())
    for off, size in zip(descs["offset"][~keep].tolist(), descs["size"][~keep].tolist()):
        if off not in shared:
            image[off:off + size] = bytes(size)
    moved = np.zeros_like(descs)
    moved[:int(keep.sum())] = descs[keep]
    image[start:start + moved.nbytes] = moved.tobytes()


def slice_kdump(src: Path, dst: Path, pages: set[int]) -> Path:
    """Write makedumpfile's kdump-compressed or flattened ``src`` with only the dumped ``pages`` (pfns) left in it.

    The other pages read as excluded from the dump, as if makedumpfile had filtered them: headers,
    notes, VMCOREINFO and bitmap 1 are ``src``'s (:func:`_keep_dumped_pages`). A flattened file keeps
    makedumpfile's records, each with the offset and size it had, holding the edited bytes.
    """
    from unwind.formats.vmcore.flattened import _DATA_HEADER, MDF_HEADER_SIZE, is_flattened

    raw = src.read_bytes()
    if not is_flattened(raw[:MDF_HEADER_SIZE]):
        image = bytearray(raw)
        _keep_dumped_pages(image, pages)
        dst.write_bytes(image)
        return dst
    records: list[tuple[int, int, int]] = []  # (position of the header in the flat file, offset, size)
    pos = MDF_HEADER_SIZE
    while pos + _DATA_HEADER.size <= len(raw):
        offset, size = _DATA_HEADER.unpack_from(raw, pos)
        if offset < 0:
            break
        records.append((pos, offset, size))
        pos += _DATA_HEADER.size + size
    image = bytearray(max(o + n for _, o, n in records))
    for p, o, n in records:
        image[o:o + n] = raw[p + _DATA_HEADER.size:p + _DATA_HEADER.size + n]
    _keep_dumped_pages(image, pages)
    out = bytearray(raw)
    for p, o, n in records:
        out[p + _DATA_HEADER.size:p + _DATA_HEADER.size + n] = image[o:o + n]
    dst.write_bytes(out)
    return dst


def pages_read_by_unwind(vmcore: Path, vmlinux: Path) -> set[int]:
    """Page frame numbers the project reads from ``vmcore`` to list its tasks and replay them all.

    Runs ``unwind ps`` and ``unwind replay --all`` (plain, and ``--reliable --complete --json``)
    in this process with ``read_phys`` of :class:`PhysicalMemory` (and of each reader that overrides
    it) wrapped to record each page it reads.
    """
    import contextlib
    import io

    from unwind.cli.main import main
    from unwind.formats.vmcore.physmem import PhysicalMemory

    pages: set[int] = set()

    def recording(orig):
        def read_phys(self, paddr: int, size: int) -> bytes:
            if size > 0:
                pages.update(range(paddr >> 12, ((paddr + size - 1) >> 12) + 1))
            return orig(self, paddr, size)
        return read_phys

    # every reader class that defines its own read_phys (the ELF reader reads big extents at once)
    classes, todo = [], [PhysicalMemory]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "read_phys" in cls.__dict__:
            classes.append((cls, cls.__dict__["read_phys"]))
    common = [str(vmcore), "--vmlinux", str(vmlinux)]
    for cls, orig in classes:
        cls.read_phys = recording(orig)
    try:
        for args in (["ps", *common], ["replay", *common, "--all"],
                     ["replay", *common, "--all", "--reliable", "--complete", "--json"]):
            with contextlib.redirect_stdout(io.StringIO()):
                main(args)
    finally:
        for cls, orig in classes:
            cls.read_phys = orig
    return pages


def pages_walked_by_unwind(vmcore: Path, vmlinux: Path) -> set[int]:
    """Page frame numbers of the page tables behind every page a full replay reads.

    A replay translates most addresses by a shortcut (kernel image, linear map); the translation
    cross-check (``tests/vmcore/test_corpus_translation.py``) walks the page tables for each of
    them as well. This runs ``ps`` and ``replay --all`` (plain, and ``--reliable --complete --json``)
    recording each page :class:`VirtualMemory` translates, then walks every one with the
    shortcuts off, recording the table pages read.
    """
    import contextlib
    import copy
    import io

    from unwind.cli.main import main
    from unwind.core.memory import MemoryFault
    from unwind.formats.vmcore.virtual import VirtualMemory

    seen: dict[int, tuple[object, set[int]]] = {}
    page_phys = VirtualMemory.page_phys

    def recording(self: VirtualMemory, vaddr: int) -> int:
        seen.setdefault(id(self.translator), (self.translator, set()))[1].add(vaddr >> self.page_shift)
        return page_phys(self, vaddr)

    common = [str(vmcore), "--vmlinux", str(vmlinux)]
    VirtualMemory.page_phys = recording
    try:
        for args in (["ps", *common], ["replay", *common, "--all"],
                     ["replay", *common, "--all", "--reliable", "--complete", "--json"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                main(args)
    finally:
        VirtualMemory.page_phys = page_phys
    tables: set[int] = set()
    for tr, vpages in seen.values():
        walk = copy.copy(tr)
        walk.linear = ()
        phys = tr.phys

        class Recording:
            def read_phys(self, paddr: int, size: int) -> bytes:
                tables.update(range(paddr >> 12, ((paddr + max(size, 1) - 1) >> 12) + 1))
                return phys.read_phys(paddr, size)

        walk.phys = Recording()
        for vpage in vpages:
            with contextlib.suppress(MemoryFault):
                walk.translate(vpage << tr.page_shift)
    return tables


def kdump_slice(elf: Path, console: Path, vmlinux: Path, slim: Path, arch: str, dest: Path) -> list[Path]:
    """Commit-sized files of a true kdump in ``dest``: the slice of ``/proc/vmcore`` (xz) holding what
    the project reads with either image, the page tables behind it (:func:`pages_walked_by_unwind`)
    and what drgn reads; the panicking kernel's console and its ``/proc/iomem`` and ``/proc/kallsyms`` lines where
    the lab kept them; drgn's
    task oracle of the full file (xz JSON)."""
    pages = pages_read_by_unwind(elf, vmlinux) | pages_read_by_unwind(elf, slim)
    pages |= pages_walked_by_unwind(elf, slim)
    kept = [console.with_name(f"{_stem(elf)}.{kind}.txt") for kind in ("iomem", "kallsyms")]
    return write_corpus_slice(elf, pages, [console] + [p for p in kept if p.exists()], vmlinux, arch, dest)


_PREAD = re.compile(r"pread64\((\d+), .*, (\d+), (\d+)\)\s+=\s+(\d+)$")


def pages_read_by_drgn(vmcore: Path, vmlinux: Path, modules: list[Path] = (), arch: str | None = None,
                       json_out: Path | None = None) -> set[int]:
    """Page frame numbers drgn reads from the ELF ``vmcore`` for ``unwind lab drgn-tasks``.

    drgn reads an ELF core with ``pread``; ``strace`` records the file offsets, which the
    PT_LOADs map to physical pages. ``json_out`` keeps the drgn-tasks JSON of that run.
    """
    out = json_out or vmcore.with_name(f".{_stem(vmcore)}.drgn.json")
    cmd = [sys.executable, "-m", "unwind", "lab", "drgn-tasks", "--vmlinux", str(vmlinux), "-o", str(out)]
    cmd += [a for m in modules for a in ("--module-debug", str(m))] + (["--arch", arch] if arch else [])
    log = vmcore.with_name(f".{_stem(vmcore)}.strace")
    try:
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,pread64", "-s", "0", "-o", str(log),
                        *cmd, str(vmcore)], check=True, capture_output=True, timeout=1800)
        fds = {m.group(1) for m in re.finditer(rf'openat\(AT_FDCWD, "{re.escape(str(vmcore))}", [^)]*\) = (\d+)',
                                               log.read_text())}
        reads = [(int(m.group(3)), int(m.group(4))) for line in log.read_text().splitlines()
                 if (m := _PREAD.search(line)) and m.group(1) in fds]
    except FileNotFoundError:
        raise VmcoreToolError("strace not found (apt-get install strace)") from None
    except subprocess.CalledProcessError as e:
        raise VmcoreToolError(f"drgn-tasks under strace failed: {e.stderr.decode(errors='replace')[-200:]}") from None
    finally:
        log.unlink(missing_ok=True)
        if json_out is None:
            out.unlink(missing_ok=True)
    with open(vmcore, "rb") as f:
        loads = [(s["p_offset"], s["p_filesz"], s["p_paddr"]) for s in ELFFile(f).iter_segments()
                 if s["p_type"] == "PT_LOAD" and s["p_filesz"]]
    pages: set[int] = set()
    for off, size in reads:
        for foff, fsz, paddr in loads:
            a, b = max(off, foff), min(off + size, foff + fsz)
            if a < b:
                pages.update(range((paddr + a - foff) >> 12, ((paddr + b - 1 - foff) >> 12) + 1))
    return pages



#: arches whose vmcores drgn 0.3.0 unwinds (it has no riscv stack unwinder)
DRGN_ARCHES = ("x86_64", "arm64")


def corpus_slice(elf: Path, capture: Path, vmlinux: Path, arch: str, dest: Path,
                 modules: list[Path] = (), slim: Path | None = None, tables: bool = False) -> list[Path]:
    """Commit-sized files of one stop in ``dest``: the slice of QEMU's ELF that the project and drgn
    read (xz), the capture of the same stop, and drgn's task oracle of the full ELF (xz JSON).

    With the committed ``slim`` image (which has no BTF) the project reads the kernel's BTF from
    memory, so those pages are kept too, and with ``tables`` the page tables behind every page
    a replay translates (:func:`pages_walked_by_unwind`), so the translation cross-check can walk them.
    """
    pages = pages_read_by_unwind(elf, vmlinux)
    if slim is not None:
        pages |= pages_read_by_unwind(elf, slim)
    if tables:
        pages |= pages_walked_by_unwind(elf, slim or vmlinux)
    return write_corpus_slice(elf, pages, [capture], vmlinux, arch, dest, modules)


def write_corpus_slice(elf: Path, pages: set[int], beside: list[Path], vmlinux: Path, arch: str, dest: Path,
                       modules: list[Path] = ()) -> list[Path]:
    """Write to ``dest`` the slice of the ELF vmcore ``elf`` holding ``pages`` and what drgn reads
    (``<stem>.elf.xz``), copies of the files ``beside`` (the capture or the console of the same stop) and
    drgn's task oracle of the full ``elf`` (``<stem>.drgn-tasks.json.xz``, for :data:`DRGN_ARCHES`); returns them."""
    import lzma

    dest.mkdir(parents=True, exist_ok=True)
    stem = _stem(elf)
    drgn_json = dest / f".{stem}.drgn-tasks.json"
    if arch in DRGN_ARCHES:
        pages = pages | pages_read_by_drgn(elf.resolve(), vmlinux, modules, arch, json_out=drgn_json)
    sliced = dest / f"{stem}.elf"
    slice_elf(elf, sliced, pages)
    out = [dest / f"{stem}.elf.xz"]
    with open(sliced, "rb") as f, lzma.open(out[0], "wb", preset=9) as xz:
        shutil.copyfileobj(f, xz)
    sliced.unlink()
    for p in beside:
        out.append(Path(shutil.copyfile(p, dest / p.name)))
    if drgn_json.exists():
        out.append(dest / f"{stem}.drgn-tasks.json.xz")
        with lzma.open(out[-1], "wt", preset=9) as xz:
            xz.write(drgn_json.read_text())
        drgn_json.unlink()
    return out
