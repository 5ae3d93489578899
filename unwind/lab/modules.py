"""Modules for the lab guest, taken from the kernel's own image package with their dependencies.

The guest loads them from its initramfs in dependency order, so dumps carry
module code, module symbols and (x86) module ORC:

* ``uhid`` (and ``hid``): ``/init`` leaves ``dd if=/dev/uhid`` blocked in ``uhid_char_read()``;
* ``virtio_scsi`` (and ``scsi_mod``): with QEMU's ``-device virtio-scsi-pci`` the host adapter's
  ``scsi_eh_0`` kernel thread sleeps in ``scsi_error_handler()``.

They land in ``<kernel>/modules/``: ``NAME.ko`` (decompressed) and ``order``, one name a line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from elftools.elf.elffile import ELFFile

from .fetch import ARCHES, FetchError, Kernel, _download, _extract, _members, _say, cache_dir

#: the modules the lab guest loads (their dependencies are added)
LAB_MODULES = ("uhid", "virtio_scsi")
#: QEMU arguments that give the modules something to drive
LAB_MODULE_QEMU_ARGS = ("-device", "virtio-scsi-pci")


def _modname(member: str) -> str:
    """``./usr/lib/modules/<rel>/kernel/drivers/hid/uhid.ko.xz`` -> ``uhid`` (``-`` as ``_``)."""
    return re.sub(r"\.ko(\.xz|\.zst|\.gz)?$", "", member.rsplit("/", 1)[-1]).replace("-", "_")


def modinfo_depends(ko: Path) -> list[str]:
    """The ``depends=`` names in a module's ``.modinfo`` section."""
    with open(ko, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".modinfo")
        data = sec.data() if sec is not None else b""
    for entry in data.split(b"\0"):
        if entry.startswith(b"depends="):
            return [d.replace("-", "_") for d in entry[8:].decode().split(",") if d]
    return []


def _decompress(src: Path, dst: Path) -> None:
    tool = {".xz": ["xz", "-dc"], ".zst": ["zstd", "-dc"], ".gz": ["gzip", "-dc"]}.get(src.suffix)
    if tool is None:
        dst.write_bytes(src.read_bytes())
        return
    with open(dst, "wb") as out:
        subprocess.run([*tool, str(src)], stdout=out, check=True)


def fetch_modules(k: Kernel, names: tuple[str, ...] = LAB_MODULES) -> list[str]:
    """Extract ``names`` and what they depend on from ``k``'s image package; returns the load order."""
    dest = k.root / "modules"
    order_file = dest / "order"
    if order_file.exists() and set(names) <= set(order_file.read_text().split()):
        return order_file.read_text().split()
    dpkg_arch = ARCHES[k.arch][0]
    suite = k.manifest().get("suite", "")
    img = _download(f"linux-image-{k.release}:{dpkg_arch}" + (f"/{suite}" if suite else ""),
                    cache_dir() / "debs")
    by_name = {_modname(m): m for m in _members(img) if re.search(r"\.ko(\.xz|\.zst|\.gz)?$", m)}
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / "x"
    order: list[str] = []

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in chain:
            raise FetchError(f"module dependency loop: {' -> '.join((*chain, name))}")
        if name not in by_name:
            raise FetchError(f"module {name} is not in {img.name} (built in?)")
        member = by_name[name]
        _extract(img, [member], tmp)
        ko = dest / f"{name}.ko"
        _decompress(tmp / member, ko)
        for dep in modinfo_depends(ko):
            add(dep, (*chain, name))
        order.append(name)

    for n in names:
        add(n, ())
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    order_file.write_text("\n".join(order) + "\n")
    _say(f"modules for the lab guest: {' '.join(order)}")
    return order
