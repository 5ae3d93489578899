"""Host-side vmcore recipes: makedumpfile's filtered and flattened files from QEMU's ELF vmcore.

``unwind capture --vmcore`` has QEMU write its vmcores of a stop; these
functions derive the makedumpfile variants of the same stop on the host:

* ``<stem>.mdf-c-d31.kdump``: ``makedumpfile -c -d 31 -x <vmlinux>`` (kdump-compressed, zlib, level 31);
* ``<stem>.mdf-F-c-d31.flat``: the same with ``-F`` (flattened, what Debian's kdump-tools writes);
* ``<stem>.kdump-zlib.kdump``: QEMU's flattened ``-z`` file reassembled by ``makedumpfile -R``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from elftools.construct.lib import Container
from elftools.elf.elffile import ELFFile

from .fetch import ARCHES, _download, cache_dir, newest_version


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


#: Debian packages of a foreign-arch makedumpfile and its libraries (``name/suite``): the host's
#: makedumpfile is built for the host's arch only (one TARGET per build)
FOREIGN_MAKEDUMPFILE = ("makedumpfile/sid", "libc6/trixie", "libdw1t64/trixie", "libelf1t64/trixie",
                        "liblzo2-2/trixie", "libzstd1/trixie", "zlib1g/trixie", "libbz2-1.0/trixie",
                        "liblzma5/trixie")
#: our arch -> qemu-user binary name suffix
QEMU_USER = {"x86_64": "x86_64", "arm64": "aarch64", "riscv": "riscv64"}


def makedumpfile_command(arch: str) -> list[str]:
    """The command that runs a makedumpfile built for ``arch`` on this host.

    The host's own for its arch; otherwise Debian's package of that arch and its libraries,
    unpacked into ``<cache>/tools/makedumpfile-<dpkg arch>/`` and run under ``qemu-<arch>-static``.
    """
    dpkg_arch = ARCHES[arch][0]
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    if dpkg_arch == native:
        return ["makedumpfile"]
    root = cache_dir() / "tools" / f"makedumpfile-{dpkg_arch}"
    binary = root / "usr" / "bin" / "makedumpfile"
    qemu = f"qemu-{QEMU_USER[arch]}-static"
    if shutil.which(qemu) is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "qemu-user-static"], check=True, capture_output=True)
    if not binary.exists():
        debs = root.parent / f"debs-{dpkg_arch}"
        debs.mkdir(parents=True, exist_ok=True)
        for pkg in FOREIGN_MAKEDUMPFILE:
            name, _, suite = pkg.partition("/")
            deb = _download(name, newest_version(f"{name}:{dpkg_arch}", suite), dpkg_arch, debs)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (root / "lib").unlink(missing_ok=True)
        (root / "lib").symlink_to("usr/lib")  # merged /usr: the loader is looked up in /lib
    return [qemu, "-L", str(root), str(binary)]


def _makedumpfile(cmd: list[str], stdout=None) -> None:
    try:
        r = subprocess.run(cmd, stdout=stdout if stdout is not None else subprocess.PIPE,
                           stderr=subprocess.PIPE, text=False, timeout=1800)
    except FileNotFoundError:
        raise VmcoreToolError("makedumpfile not found (apt-get install makedumpfile)") from None
    if r.returncode != 0:
        msg = [ln for ln in r.stderr.decode(errors="replace").splitlines() if ln.strip()]
        raise VmcoreToolError(f"{' '.join(cmd)}: {msg[0] if msg else f'exit {r.returncode}'}")


def makedumpfile_variants(elf: Path, arch: str, vmlinux: Path | None = None, vmcoreinfo: str | None = None,
                          level: int = 31) -> list[Path]:
    """Write the makedumpfile files of QEMU's ELF vmcore ``elf`` beside it; returns their paths.

    The kernel's layout comes from ``-x vmlinux`` when given, else from a ``vmcoreinfo`` text
    (``-i``; for a dump without the VMCOREINFO note), else from the dump's own VMCOREINFO note.
    A foreign-arch makedumpfile runs under qemu-user, where parsing a vmlinux's DWARF takes
    many minutes: give it the note or ``vmcoreinfo`` instead.
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
    tool = makedumpfile_command(arch)
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
