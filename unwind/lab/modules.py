"""Modules for the lab guest, taken from the kernel's own image package with their dependencies.

The guest loads them from its initramfs in dependency order, so dumps carry
module code, module symbols and (x86) module ORC:

* ``uhid`` (and ``hid``): ``/init`` leaves ``dd if=/dev/uhid`` blocked in ``uhid_char_read()``;
* ``virtio_scsi`` (and ``scsi_mod``): with QEMU's ``-device virtio-scsi-pci`` the host adapter's
  ``scsi_eh_0`` kernel thread sleeps in ``scsi_error_handler()``.

They land in ``<kernel>/modules/``: ``NAME.ko`` (decompressed) and ``order``, one name a line.
"""

from __future__ import annotations

import lzma
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from elftools.elf.elffile import ELFFile

from .fetch import FetchError, Kernel, _say, cache_dir, extract_from_deb

#: a kernel module file, compressed or not
KO = re.compile(r"\.ko(\.xz|\.zst|\.gz)?$")

#: the modules the lab guest loads (their dependencies are added)
LAB_MODULES = ("uhid", "virtio_scsi")
#: QEMU arguments that give the modules something to drive
LAB_MODULE_QEMU_ARGS = ("-device", "virtio-scsi-pci")


def _modname(member: str) -> str:
    """``./usr/lib/modules/<rel>/kernel/drivers/hid/uhid.ko.xz`` -> ``uhid`` (``-`` as ``_``)."""
    return KO.sub("", member.rsplit("/", 1)[-1]).replace("-", "_")


def modinfo_depends(ko: Path) -> list[str]:
    """The ``depends=`` names in a module's ``.modinfo`` section."""
    with open(ko, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".modinfo")
        data = sec.data() if sec is not None else b""
    for entry in data.split(b"\0"):
        if entry.startswith(b"depends="):
            return [d.replace("-", "_") for d in entry[8:].decode().split(",") if d]
    return []


def _ko_bytes(path: Path) -> bytes:
    """A module file's ELF bytes (Debian ships them xz-compressed)."""
    data = path.read_bytes()
    return lzma.decompress(data) if data[:6] == b"\xfd7zXZ\0" else data


def _module_members(debs: list[Path]) -> dict[str, tuple[Path, str]]:
    """Module name -> (package, member) over the kernel's packages (one listing pass each)."""
    found: dict[str, tuple[Path, str]] = {}
    for deb in debs:
        p = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        try:
            with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
                for m in tar:
                    if m.isfile() and KO.search(m.name):
                        found.setdefault(_modname(m.name), (deb, m.name))
        except tarfile.TarError as e:
            raise FetchError(f"cannot read {deb.name}: {e}") from None
        finally:
            p.kill()
            p.wait()
    return found


def fetch_modules(k: Kernel, names: tuple[str, ...] = LAB_MODULES, folder: str = "modules") -> list[str]:
    """Extract ``names`` and what they depend on from ``k``'s packages into ``<kernel>/<folder>/``;
    returns the load order."""
    dest = k.root / folder
    order_file = dest / "order"
    if order_file.exists() and set(names) <= set(order_file.read_text().split()):
        return order_file.read_text().split()
    pkgs = k.manifest().get("packages", {})
    debs = [cache_dir() / "debs" / n for n in pkgs.get("kernel") or [pkgs.get("image", "")] if n]
    if not debs or not all(d.exists() for d in debs):
        raise FetchError(f"the packages of {k.release} are not in the cache; run: unwind kernels fetch "
                         f"--arch {k.arch} --release {k.release}")
    members = _module_members(debs)
    tmp = dest / "x"
    deps: dict[str, list[str]] = {}
    todo = set(names)
    while todo:
        missing = sorted(n for n in todo if n not in members)
        if missing:
            raise FetchError(f"module {missing[0]} is not in {k.release}'s packages (built in?)")
        for deb in {members[n][0] for n in todo}:
            wanted = {n: [members[n][1]] for n in todo if members[n][0] == deb}
            for n, path in extract_from_deb(deb, wanted, tmp).items():
                (dest / f"{n}.ko").write_bytes(_ko_bytes(path))
                deps[n] = modinfo_depends(dest / f"{n}.ko")
        todo = {d for n in todo for d in deps[n] if d not in deps}
    shutil.rmtree(tmp, ignore_errors=True)
    order: list[str] = []

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in chain:
            raise FetchError(f"module dependency loop: {' -> '.join((*chain, name))}")
        if name not in order:
            for dep in deps[name]:
                add(dep, (*chain, name))
            order.append(name)

    for n in names:
        add(n, ())
    order_file.write_text("\n".join(order) + "\n")
    _say(f"modules for the lab guest: {' '.join(order)}")
    return order


def fetch_module_debug(k: Kernel) -> list[Path]:
    """The debug files of the lab modules (``<kernel>/modules/debug/NAME.ko``) from the ``-dbg`` package.

    drgn needs them to unwind through module code (it reads ORC and CFI from files, not memory).
    """
    order = fetch_modules(k)
    dest = k.root / "modules" / "debug"
    have = [dest / f"{n}.ko" for n in order]
    if all(p.exists() for p in have):
        return have
    pkgs = k.manifest().get("packages", {})
    dbg = cache_dir() / "debs" / pkgs.get("dbg", "")
    images = [cache_dir() / "debs" / n for n in pkgs.get("kernel") or [pkgs.get("image", "")] if n]
    if not dbg.is_file():
        raise FetchError(f"the -dbg package of {k.release} is not in the cache")
    members = _module_members(images)
    wanted = {}
    for n in order:
        rel = KO.sub(".ko", members[n][1].split(f"/modules/{k.release}/", 1)[1])
        wanted[n] = [f"./usr/lib/debug/{d}/modules/{k.release}/{rel}" for d in ("lib", "usr/lib")]
    found = extract_from_deb(dbg, wanted, dest)
    missing = [n for n in order if n not in found]
    if missing:
        raise FetchError(f"no debug file for module {missing[0]} in {dbg.name}")
    for n, path in found.items():
        path.replace(dest / f"{n}.ko")
    return have
