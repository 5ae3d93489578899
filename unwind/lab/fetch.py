"""Fetch a Debian kernel (image, debug vmlinux, System.map, config) and a static busybox.

Everything lands in a cache outside the repository (``$UNWIND_CACHE`` or
``~/.cache/unwind``)::

    <cache>/debs/*.deb                      downloaded packages
    <cache>/kernels/<release>/              extracted files, one folder per kernel
        boot-image  vmlinux  System.map  config  qemu_fw_cfg.ko  busybox  kernel.json

The suite and the foreign dpkg architecture are added with a low apt pin when
missing, so the host's own packages never come from the added suite. Every
step is printed; a step whose output already exists is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

#: our arch name -> (dpkg architecture, kernel flavour, qemu system binary, qemu package)
ARCHES: dict[str, tuple[str, str, str, str]] = {
    "x86_64": ("amd64", "amd64", "qemu-system-x86_64", "qemu-system-x86"),
    "arm64": ("arm64", "arm64", "qemu-system-aarch64", "qemu-system-arm"),
    "riscv": ("riscv64", "riscv64", "qemu-system-riscv64", "qemu-system-misc"),
}

#: pin priorities for suites we add: never preferred over the host's own suite
_PINS = {"sid": 50, "unstable": 50}
_MIRROR = "http://deb.debian.org/debian"


class FetchError(Exception):
    """A fetch step failed; the message is one line for the user."""


def cache_dir() -> Path:
    """The cache root: ``$UNWIND_CACHE`` or ``~/.cache/unwind``."""
    env = os.environ.get("UNWIND_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "unwind"


def canonical_arch(arch: str) -> str:
    """Map user spellings (amd64, aarch64, riscv64, ...) to our arch names."""
    aliases = {"amd64": "x86_64", "x86-64": "x86_64", "aarch64": "arm64", "riscv64": "riscv"}
    arch = aliases.get(arch, arch)
    if arch not in ARCHES:
        raise FetchError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")
    return arch


def _say(msg: str) -> None:
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    _say("$ " + " ".join(cmd))
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)
    except FileNotFoundError as e:
        raise FetchError(f"{cmd[0]} not found: {e}") from None
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or "").strip().splitlines()[-1:]
        raise FetchError(f"{' '.join(cmd)} failed: {tail[0] if tail else e}") from None


def ensure_apt_source(suite: str, dpkg_arch: str) -> None:
    """Add ``suite`` (low pin) and the foreign ``dpkg_arch`` to apt when missing, then update."""
    changed = False
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                            text=True, check=True).stdout.strip()
    if dpkg_arch != native:
        foreign = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True,
                                 text=True, check=True).stdout.split()
        if dpkg_arch not in foreign:
            _run(["dpkg", "--add-architecture", dpkg_arch])
            changed = True
    src_dir = Path("/etc/apt/sources.list.d")
    have = any(re.search(rf"^Suites:.*\b{re.escape(suite)}\b", p.read_text(errors="replace"), re.M)
               or re.search(rf"^deb\s.*\s{re.escape(suite)}\s", p.read_text(errors="replace"), re.M)
               for p in list(src_dir.glob("*.sources")) + list(src_dir.glob("*.list"))
               + [Path("/etc/apt/sources.list")] if p.exists())
    if not have:
        src = src_dir / f"unwind-{suite}.sources"
        _say(f"adding apt source {src} (suite {suite})")
        src.write_text(f"Types: deb\nURIs: {_MIRROR}\nSuites: {suite}\nComponents: main\n"
                       "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        pin = Path("/etc/apt/preferences.d") / f"unwind-{suite}"
        prio = _PINS.get(suite, 100)
        _say(f"pinning {suite} at {prio} in {pin}")
        pin.write_text(f"Package: *\nPin: release n={suite}\nPin-Priority: {prio}\n")
        changed = True
    if changed:
        _run(["apt-get", "update", "-q"])


def ensure_tools(arch: str) -> None:
    """Install the QEMU system emulator for ``arch`` (and gdb-multiarch) when missing."""
    _, _, qemu, qpkg = ARCHES[arch]
    missing = [pkg for binary, pkg in ((qemu, qpkg), ("gdb-multiarch", "gdb-multiarch"),
                                       ("cpio", "cpio"), ("xz", "xz-utils"))
               if shutil.which(binary) is None]
    if missing:
        _say(f"installing {' '.join(missing)}")
        _run(["apt-get", "install", "-y", "-q", *missing],
             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _download(pkg: str, debs: Path) -> Path:
    """``apt-get download`` ``pkg`` (``name:arch/suite``) into ``debs`` unless present."""
    name, _, rest = pkg.partition(":")
    dpkg_arch = rest.split("/")[0]
    found = sorted(debs.glob(f"{name.replace('+', '?')}_*_{dpkg_arch}.deb"))
    found = [p for p in found if p.name.split("_")[0] == name]
    if found:
        _say(f"have {found[-1].name}")
        return found[-1]
    _run(["apt-get", "download", pkg], cwd=debs)
    found = [p for p in debs.glob(f"*_{dpkg_arch}.deb") if p.name.split("_")[0] == name]
    if not found:
        raise FetchError(f"apt-get download {pkg} produced no .deb")
    return sorted(found)[-1]


def _members(deb: Path) -> list[str]:
    """Member names (``./path``) of a .deb's data archive."""
    listing = subprocess.run(f"dpkg-deb --fsys-tarfile '{deb}' | tar -t",
                             shell=True, capture_output=True, text=True)
    if listing.returncode != 0 and not listing.stdout:
        raise FetchError(f"cannot list {deb.name}: {listing.stderr.strip()}")
    return listing.stdout.split()


def _extract(deb: Path, members: list[str], dest: Path) -> None:
    """Extract exactly ``members`` (``./path`` names) of ``deb`` into ``dest``, stopping early."""
    dest.mkdir(parents=True, exist_ok=True)
    quoted = " ".join(f"'{m}'" for m in members)
    _say(f"extracting {len(members)} member(s) of {deb.name}")
    # --occurrence lets tar stop as soon as every member was seen; the writer then
    # gets SIGPIPE ("Broken pipe"), which is expected.
    r = subprocess.run(f"dpkg-deb --fsys-tarfile '{deb}' | tar -x -C '{dest}' --occurrence=1 {quoted}",
                       shell=True, capture_output=True, text=True)
    for m in members:
        if not (dest / m).exists():
            raise FetchError(f"{m} not extracted from {deb.name}: {r.stderr.strip()[-200:]}")


def build_id(path: Path) -> str:
    """Hex NT_GNU_BUILD_ID of an ELF file, or '' when it has none."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_NOTE":
                for note in seg.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                        return _hex(note["n_desc"])
        for sec in elf.iter_sections():
            if sec["sh_type"] == "SHT_NOTE":
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                        return _hex(note["n_desc"])
    return ""


def _hex(desc: str | bytes) -> str:
    return desc.hex() if isinstance(desc, bytes) else desc


@dataclass
class Kernel:
    """Paths of one fetched kernel."""

    arch: str
    release: str
    root: Path

    @property
    def boot_image(self) -> Path:
        return self.root / "boot-image"

    @property
    def vmlinux(self) -> Path:
        return self.root / "vmlinux"

    @property
    def system_map(self) -> Path:
        return self.root / "System.map"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def fw_cfg_module(self) -> Path:
        return self.root / "qemu_fw_cfg.ko"

    @property
    def busybox(self) -> Path:
        return self.root / "busybox"

    def manifest(self) -> dict:
        """The kernel.json written by :func:`fetch` (empty dict when absent)."""
        p = self.root / "kernel.json"
        return json.loads(p.read_text()) if p.exists() else {}


def find_kernel(arch: str, release: str | None = None) -> Kernel:
    """The fetched kernel for ``arch`` (newest release unless given)."""
    arch = canonical_arch(arch)
    root = cache_dir() / "kernels"
    cands = []
    for p in sorted(root.glob("*/kernel.json")) if root.exists() else []:
        m = json.loads(p.read_text())
        if m.get("arch") == arch and (release is None or m.get("release") == release):
            cands.append(Kernel(arch, m["release"], p.parent))
    if not cands:
        raise FetchError(f"no fetched kernel for {arch}"
                         + (f" {release}" if release else "")
                         + f" in {root}; run: unwind kernels fetch --arch {arch}")
    return cands[-1]


def _kernel_release(flavor: str, dpkg_arch: str, suite: str, debs: Path) -> str:
    """The release (e.g. ``6.12.117+deb13-arm64``) the suite's ``linux-image-<flavor>`` points to."""
    meta = _download(f"linux-image-{flavor}:{dpkg_arch}/{suite}", debs)
    dep = _run(["dpkg-deb", "-f", str(meta), "Depends"]).stdout
    m = re.search(r"linux-image-(\S+?)(?:-unsigned)?\s*(?:\(|,|$)", dep)
    if not m:
        raise FetchError(f"cannot find the kernel release in {meta.name} Depends: {dep.strip()}")
    return m.group(1)


def fetch(arch: str, suite: str, release: str | None = None) -> Kernel:
    """Download and extract one kernel for ``arch`` from ``suite``; idempotent."""
    arch = canonical_arch(arch)
    dpkg_arch, flavor, _, _ = ARCHES[arch]
    if not re.fullmatch(r"[a-z][a-z0-9-]*", suite):
        raise FetchError(f"bad suite name {suite!r}")
    cache = cache_dir()
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    ensure_apt_source(suite, dpkg_arch)
    ensure_tools(arch)
    if release is None:
        # The meta package may have been downloaded for another suite: keep one per suite.
        sdebs = debs / suite
        sdebs.mkdir(exist_ok=True)
        release = _kernel_release(flavor, dpkg_arch, suite, sdebs)
    _say(f"kernel release {release}")
    k = Kernel(arch, release, cache / "kernels" / release)
    if (k.root / "kernel.json").exists():
        _say(f"already fetched: {k.root}")
        return k
    img = _download(f"linux-image-{release}:{dpkg_arch}/{suite}", debs)
    dbg = _download(f"linux-image-{release}-dbg:{dpkg_arch}/{suite}", debs)
    bb = _download(f"busybox-static:{dpkg_arch}/{suite}", debs)

    tmp = k.root / "x"
    if not all(p.exists() for p in (k.boot_image, k.config, k.vmlinux, k.system_map, k.busybox)):
        _extract_all(k, img, dbg, bb, tmp)
    bid = build_id(k.vmlinux)
    manifest = {"arch": arch, "release": release, "suite": suite, "build_id": bid,
                "packages": {"image": img.name, "dbg": dbg.name, "busybox": bb.name},
                "has_fw_cfg": k.fw_cfg_module.exists()}
    (k.root / "kernel.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _say(f"done: {k.root} (build-id {bid})")
    return k


def _extract_all(k: Kernel, img: Path, dbg: Path, bb: Path, tmp: Path) -> None:
    release = k.release
    names = _members(img)
    boot = next((n for n in names if re.fullmatch(rf"\./boot/vmlinu[xz]-{re.escape(release)}", n)), None)
    fwcfg = next((n for n in names if n.endswith("/qemu_fw_cfg.ko.xz") or n.endswith("/qemu_fw_cfg.ko")),
                 None)
    if boot is None:
        raise FetchError(f"no boot image in {img.name}")
    wanted = [boot, f"./boot/config-{release}"] + ([fwcfg] if fwcfg else [])
    _extract(img, wanted, tmp)
    _extract(dbg, [f"./usr/lib/debug/boot/vmlinux-{release}",
                   f"./usr/lib/debug/boot/System.map-{release}"], tmp)
    bbname = next((n for n in _members(bb) if n.endswith("bin/busybox")), None)
    if bbname is None:
        raise FetchError(f"no busybox binary in {bb.name}")
    _extract(bb, [bbname], tmp)

    os.replace(tmp / boot, k.boot_image)
    os.replace(tmp / f"./boot/config-{release}", k.config)
    os.replace(tmp / f"./usr/lib/debug/boot/vmlinux-{release}", k.vmlinux)
    os.replace(tmp / f"./usr/lib/debug/boot/System.map-{release}", k.system_map)
    os.replace(tmp / bbname, k.busybox)
    if fwcfg:
        if fwcfg.endswith(".xz"):
            _say("decompressing qemu_fw_cfg.ko.xz")
            with open(k.fw_cfg_module, "wb") as out:
                subprocess.run(["xz", "-dc", str(tmp / fwcfg)], stdout=out, check=True)
        else:
            os.replace(tmp / fwcfg, k.fw_cfg_module)
    shutil.rmtree(tmp)
