"""Fetch a Debian kernel (image, debug vmlinux, System.map, config) and a static busybox.

Everything lands in a cache outside the repository (``$UNWIND_CACHE`` or
``~/.cache/unwind``)::

    <cache>/debs/*.deb                      downloaded packages
    <cache>/kernels/<release>/              extracted files, one folder per kernel
        boot-image  vmlinux  System.map  config  qemu_fw_cfg.ko  busybox  kernel.json

Versions are chosen from ``apt-cache madison`` and ordered by
``dpkg --compare-versions``; a suite includes its ``-security`` and
``-updates`` archives. Kernel packages are found by what they hold, so both
layouts work: one ``linux-image-<rel>`` with ``boot/`` (bookworm, trixie) and
sid's split ``linux-binary-<rel>`` / ``linux-base-<rel>`` / ``linux-modules-<rel>``
with ``usr/lib/modules/<rel>/``.

Host changes (printed as they happen): ``dpkg --add-architecture`` for a
foreign arch, ``/etc/apt/sources.list.d/unwind-<suite>.sources`` and
``/etc/apt/preferences.d/unwind-<suite>`` (pin 100, sid 50, so the host's own
packages never come from the added suite) when the suite is not configured,
``apt-get update`` after either, and ``apt-get install`` of QEMU,
gdb-multiarch and xz-utils when missing.
"""

from __future__ import annotations

import functools
import json
import lzma
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
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
#: suite aliases apt-cache madison may print for the same archive
_ALIASES = {"sid": ("unstable",), "unstable": ("sid",)}

HOST_CHANGES = (
    "Host changes it makes when needed (each is printed): dpkg --add-architecture for a foreign "
    "arch; /etc/apt/sources.list.d/unwind-SUITE.sources and /etc/apt/preferences.d/unwind-SUITE "
    "(Pin-Priority 100, sid 50) when SUITE is not configured; apt-get update after either; "
    "apt-get install of the QEMU system package (qemu-system-x86, qemu-system-arm or "
    "qemu-system-misc; riscv boots QEMU's bundled OpenSBI), gdb-multiarch and xz-utils "
    "when missing. Needs root for these steps; downloads go to $UNWIND_CACHE or ~/.cache/unwind.")


class FetchError(Exception):
    """A fetch step failed; the message is one line for the user."""


def cache_dir() -> Path:
    """The cache root: ``$UNWIND_CACHE`` or ``~/.cache/unwind``."""
    env = os.environ.get("UNWIND_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "unwind"


#: the other kernel flavours Debian builds per arch (``linux-image-<flavour>``) that the lab boots
FLAVOURS: dict[str, tuple[str, ...]] = {"x86_64": (), "arm64": ("arm64-16k",), "riscv": ()}


def canonical_flavour(arch: str, flavour: str | None) -> str:
    """The kernel flavour to fetch for ``arch``: ``flavour``, or the arch's default when None."""
    default = ARCHES[arch][1]
    if flavour is None or flavour == default:
        return default
    if flavour not in FLAVOURS[arch]:
        raise FetchError(f"unknown {arch} kernel flavour {flavour!r}; expected one of "
                         f"{', '.join((default, *FLAVOURS[arch]))}")
    return flavour


def release_flavour(arch: str, release: str) -> str:
    """The flavour a kernel release names by its suffix (``6.12.117+deb13-arm64-16k`` -> ``arm64-16k``)."""
    for flavour in sorted(FLAVOURS[arch], key=len, reverse=True):
        if release.endswith(f"-{flavour}"):
            return flavour
    return ARCHES[arch][1]


def canonical_arch(arch: str) -> str:
    """Map user spellings (amd64, aarch64, riscv64, ...) to our arch names."""
    aliases = {"amd64": "x86_64", "x86-64": "x86_64", "aarch64": "arm64", "riscv64": "riscv"}
    arch = aliases.get(arch, arch)
    if arch not in ARCHES:
        raise FetchError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")
    return arch


def _say(msg: str) -> None:
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], quiet: bool = False, **kw) -> subprocess.CompletedProcess:
    if not quiet:
        _say("$ " + shlex.join(cmd))
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)
    except FileNotFoundError as e:
        raise FetchError(f"{cmd[0]} not found: {e}") from None
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or "").strip().splitlines()[-1:]
        raise FetchError(f"{' '.join(cmd)} failed: {tail[0] if tail else e}") from None


# -- versions and suites ------------------------------------------------------

def compare_versions(a: str, b: str) -> int:
    """Debian version order of ``a`` and ``b`` (-1, 0, 1), as ``dpkg --compare-versions`` says."""
    if a == b:
        return 0
    try:
        lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0
    except FileNotFoundError:
        raise FetchError("dpkg not found: version order needs dpkg --compare-versions") from None
    return -1 if lt else 1


def parse_madison(text: str) -> list[tuple[str, str]]:
    """``(version, archive)`` pairs of ``apt-cache madison`` output (archive e.g. ``bookworm-security``)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3:
            continue
        where = parts[2].split()
        if len(where) >= 2 and where[-1] == "Packages":
            out.append((parts[1], where[-3].split("/")[0] if len(where) >= 3 else where[0]))
    return out


def suite_archives(suite: str) -> set[str]:
    """The archives that make up ``suite``: itself, its aliases, ``-security`` and ``-updates``."""
    names = {suite, *_ALIASES.get(suite, ())}
    return {f"{n}{tail}" for n in names for tail in ("", "-security", "-updates")}


def newest_in_suite(entries: list[tuple[str, str]], suite: str) -> str | None:
    """The highest version (Debian order) among ``entries`` from ``suite``'s archives."""
    archives = suite_archives(suite)
    versions = sorted({v for v, a in entries if a in archives}, key=functools.cmp_to_key(compare_versions))
    return versions[-1] if versions else None


def newest_version(pkg: str, suite: str) -> str:
    """The newest version of ``pkg`` (``name:arch``) that apt knows in ``suite``."""
    entries = parse_madison(_run(["apt-cache", "madison", pkg], quiet=True).stdout)
    v = newest_in_suite(entries, suite)
    if v is None:
        have = ", ".join(sorted({a for _, a in entries})) or "none"
        raise FetchError(f"{pkg} is not in suite {suite} (apt knows it in: {have})")
    return v


def depends(pkg: str, version: str) -> list[str]:
    """Package names in the ``Depends`` of ``pkg`` (``name:arch``) at ``version``."""
    text = _run(["apt-cache", "show", f"{pkg}={version}"], quiet=True).stdout
    return parse_depends(text)


def parse_depends(show: str) -> list[str]:
    """Package names in the first ``Depends:`` field of ``apt-cache show`` output (alternatives too)."""
    m = re.search(r"^Depends:(.*)$", show, re.M)
    if not m:
        return []
    return [alt.split("(")[0].split(":")[0].strip() for dep in m.group(1).split(",") for alt in dep.split("|")]


def release_from_depends(names: list[str], flavor: str) -> str:
    """The kernel release a ``linux-image-<flavor>`` meta package depends on."""
    for n in names:
        m = re.fullmatch(r"linux-image-(.+?)(?:-unsigned)?", n)
        if m and m.group(1) != flavor:
            return m.group(1)
    raise FetchError(f"no linux-image-<release> in the Depends of linux-image-{flavor}: {', '.join(names)}")


def kernel_packages(release: str, image_depends: list[str]) -> list[str]:
    """Packages holding ``release``'s files: sid's split ones (base, binary, modules) then the image."""
    split = [f"linux-{part}-{release}" for part in ("base", "binary", "modules")]
    return [n for n in split if n in image_depends] + [f"linux-image-{release}"]


# -- apt sources and tools ----------------------------------------------------

def ensure_apt_source(suite: str, dpkg_arch: str) -> None:
    """Add ``suite`` (low pin) and the foreign ``dpkg_arch`` to apt when missing, then update."""
    changed = False
    native = _run(["dpkg", "--print-architecture"], quiet=True).stdout.strip()
    if dpkg_arch != native:
        foreign = _run(["dpkg", "--print-foreign-architectures"], quiet=True).stdout.split()
        if dpkg_arch not in foreign:
            _say(f"host change: adding dpkg architecture {dpkg_arch}")
            _run(["dpkg", "--add-architecture", dpkg_arch])
            changed = True
    src_dir = Path("/etc/apt/sources.list.d")
    have = any(re.search(rf"^Suites:.*\b{re.escape(suite)}\b", p.read_text(errors="replace"), re.M)
               or re.search(rf"^deb\s.*\s{re.escape(suite)}\s", p.read_text(errors="replace"), re.M)
               for p in list(src_dir.glob("*.sources")) + list(src_dir.glob("*.list"))
               + [Path("/etc/apt/sources.list")] if p.exists())
    if not have:
        src = src_dir / f"unwind-{suite}.sources"
        _say(f"host change: adding apt source {src} (suite {suite})")
        src.write_text(f"Types: deb\nURIs: {_MIRROR}\nSuites: {suite}\nComponents: main\n"
                       "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        pin = Path("/etc/apt/preferences.d") / f"unwind-{suite}"
        prio = _PINS.get(suite, 100)
        _say(f"host change: pinning {suite} at {prio} in {pin}")
        pin.write_text(f"Package: *\nPin: release n={suite}\nPin-Priority: {prio}\n")
        changed = True
    if changed:
        _run(["apt-get", "update", "-q"])


def ensure_tools(arch: str) -> None:
    """Install the QEMU system emulator for ``arch`` (and gdb-multiarch) when missing."""
    _, _, qemu, qpkg = ARCHES[arch]
    missing = [pkg for binary, pkg in ((qemu, qpkg), ("gdb-multiarch", "gdb-multiarch"),
                                       ("xz", "xz-utils"))
               if shutil.which(binary) is None]
    if missing:
        _say(f"host change: installing {' '.join(missing)}")
        _run(["apt-get", "install", "-y", "-q", *missing],
             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


# -- packages -----------------------------------------------------------------

def deb_file_name(name: str, version: str, dpkg_arch: str) -> str:
    """The file name ``apt-get download`` gives ``name`` at ``version`` (epoch colon as ``%3a``)."""
    return f"{name}_{version.replace(':', '%3a')}_{dpkg_arch}.deb"


def _download(name: str, version: str, dpkg_arch: str, debs: Path) -> Path:
    """``apt-get download name:arch=version`` into ``debs`` unless that exact file is there."""
    path = debs / deb_file_name(name, version, dpkg_arch)
    if path.exists():
        _say(f"have {path.name}")
        return path
    _run(["apt-get", "download", f"{name}:{dpkg_arch}={version}"], cwd=debs)
    if not path.exists():
        raise FetchError(f"apt-get download {name}:{dpkg_arch}={version} produced no {path.name}")
    return path


def wanted_members(release: str) -> dict[str, list[str]]:
    """Per role, the archive member names that may hold it, in either package layout."""
    r = release
    mod = [f"./usr/lib/modules/{r}", f"./lib/modules/{r}"]
    fw = "kernel/drivers/firmware/qemu_fw_cfg.ko"
    return {
        "boot-image": [f"./boot/vmlinuz-{r}", f"./boot/vmlinux-{r}"]
                      + [f"{m}/{n}" for m in mod for n in ("vmlinuz", "vmlinux")],
        "config": [f"./boot/config-{r}"] + [f"{m}/config" for m in mod],
        "qemu_fw_cfg.ko": [f"{m}/{fw}{x}" for m in mod for x in (".xz", "")],
    }


def wanted_debug_members(release: str) -> dict[str, list[str]]:
    """Per role, the members of the ``-dbg`` package that may hold the vmlinux and System.map."""
    r = release
    dirs = ["./usr/lib/debug/boot", f"./usr/lib/debug/lib/modules/{r}", f"./usr/lib/debug/usr/lib/modules/{r}"]
    return {"vmlinux": [f"{dirs[0]}/vmlinux-{r}"] + [f"{d}/vmlinux" for d in dirs[1:]],
            "System.map": [f"{dirs[0]}/System.map-{r}"] + [f"{d}/System.map" for d in dirs[1:]]}


WANTED_BUSYBOX = {"busybox": ["./bin/busybox", "./usr/bin/busybox"]}


def extract_roles(stream, wanted: dict[str, list[str]], dest: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Copy the first regular member of each role in the tar ``stream`` to ``dest/<role>``.

    Returns the roles found and, for roles met only as a symlink, the member its target names
    (for a second pass). Reading stops as soon as every role has a file.
    """
    found: dict[str, Path] = {}
    links: dict[str, str] = {}
    names = {n: role for role, cands in wanted.items() for n in cands}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            role = names.get(m.name)
            if role is None or role in found:
                continue
            if m.issym():
                base = "." if m.linkname.startswith("/") else posixpath.dirname(m.name)
                links[role] = "./" + posixpath.normpath(posixpath.join(base, m.linkname.lstrip("/")))
                names.setdefault(links[role], role)
                continue
            if not m.isfile():
                continue
            dest.mkdir(parents=True, exist_ok=True)
            out = dest / role
            with tar.extractfile(m) as src, open(out, "wb") as f:
                shutil.copyfileobj(src, f, 1 << 20)
            found[role] = out
            if len(found) == len(wanted):
                break
    return found, {r: t for r, t in links.items() if r not in found}


def extract_from_deb(deb: Path, wanted: dict[str, list[str]], dest: Path) -> dict[str, Path]:
    """:func:`extract_roles` on a .deb's data archive, following symlinks with a second pass."""
    _say(f"reading {deb.name} for {', '.join(wanted)}")
    found: dict[str, Path] = {}
    for _ in range(2):
        todo = {r: c for r, c in wanted.items() if r not in found}
        if not todo:
            break
        p = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        try:
            got, links = extract_roles(p.stdout, todo, dest)
        except tarfile.TarError as e:
            raise FetchError(f"cannot read {deb.name}: {e}") from None
        finally:
            p.kill()  # stop the decompressor once we have what we need
            p.wait()
        found.update(got)
        if not links:
            break
        wanted = {**wanted, **{r: [t] for r, t in links.items()}}
    return found


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

    @property
    def flavour(self) -> str:
        """The Debian kernel flavour (``arm64``, ``arm64-16k``, ...), from the release's suffix."""
        return release_flavour(self.arch, self.release)

    def manifest(self) -> dict:
        """The kernel.json written by :func:`fetch` (empty dict when absent)."""
        p = self.root / "kernel.json"
        return json.loads(p.read_text()) if p.exists() else {}


def find_kernel(arch: str, release: str | None = None, flavour: str | None = None) -> Kernel:
    """The fetched kernel for ``arch`` (the newest package version unless ``release`` is given).

    Without ``release`` only kernels of ``flavour`` (the arch's default flavour when None) are candidates.
    """
    arch = canonical_arch(arch)
    flavour = canonical_flavour(arch, flavour)
    root = cache_dir() / "kernels"
    cands: list[tuple[str, Kernel]] = []
    for p in sorted(root.glob("*/kernel.json")) if root.exists() else []:
        m = json.loads(p.read_text())
        if m.get("arch") != arch:
            continue
        if (m.get("release") == release if release is not None
                else release_flavour(arch, m["release"]) == flavour):
            cands.append((m.get("version") or m["release"], Kernel(arch, m["release"], p.parent)))
    if not cands:
        hint = "" if flavour == ARCHES[arch][1] else f" --flavour {flavour}"
        raise FetchError(f"no fetched kernel for {arch}"
                         + (f" {release}" if release else hint)
                         + f" in {root}; run: unwind kernels fetch --arch {arch}{hint}")
    cands.sort(key=functools.cmp_to_key(lambda a, b: compare_versions(a[0], b[0])))
    return cands[-1][1]


def fetch(arch: str, suite: str, release: str | None = None, flavour: str | None = None) -> Kernel:
    """Download and extract one kernel for ``arch`` from ``suite``; idempotent.

    Without ``release``, the suite's current kernel of ``flavour`` (``linux-image-<flavour>``;
    the arch's default flavour when None).
    """
    arch = canonical_arch(arch)
    flavor = canonical_flavour(arch, flavour)
    dpkg_arch = ARCHES[arch][0]
    if not re.fullmatch(r"[a-z][a-z0-9-]*", suite):
        raise FetchError(f"bad suite name {suite!r}")
    if release is not None and not re.fullmatch(r"[0-9][A-Za-z0-9.+~-]*", release):
        raise FetchError(f"bad kernel release {release!r}")
    if release is not None and flavour is not None and release_flavour(arch, release) != flavor:
        raise FetchError(f"kernel release {release} is not of flavour {flavor}")
    cache = cache_dir()
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    ensure_apt_source(suite, dpkg_arch)
    ensure_tools(arch)
    if release is None:
        meta = f"linux-image-{flavor}:{dpkg_arch}"
        release = release_from_depends(depends(meta, newest_version(meta, suite)), flavor)
    image = f"linux-image-{release}"
    version = newest_version(f"{image}:{dpkg_arch}", suite)
    _say(f"kernel release {release}, version {version}")
    k = Kernel(arch, release, cache / "kernels" / release)
    bb_version = newest_version(f"busybox-static:{dpkg_arch}", suite)
    if (k.root / "kernel.json").exists() and k.manifest().get("busybox_version", bb_version) == bb_version:
        _say(f"already fetched: {k.root}")
        return k
    pkgs = kernel_packages(release, depends(f"{image}:{dpkg_arch}", version))
    kdebs = [_download(n, newest_version(f"{n}:{dpkg_arch}", suite), dpkg_arch, debs) for n in pkgs]
    dbg = _download(f"{image}-dbg", newest_version(f"{image}-dbg:{dpkg_arch}", suite), dpkg_arch, debs)
    bb = _download("busybox-static", bb_version, dpkg_arch, debs)

    tmp = k.root / "x"
    found: dict[str, Path] = {}
    wanted = wanted_members(release)
    for deb in kdebs:
        todo = {r: c for r, c in wanted.items() if r not in found}
        if todo:
            found.update(extract_from_deb(deb, todo, tmp))
    for role in ("boot-image", "config"):
        if role not in found:
            raise FetchError(f"no {role} for {release} in {', '.join(d.name for d in kdebs)}")
    found.update(extract_from_deb(dbg, wanted_debug_members(release), tmp))
    if "vmlinux" not in found or "System.map" not in found:
        raise FetchError(f"no vmlinux and System.map in {dbg.name}")
    found.update(extract_from_deb(bb, WANTED_BUSYBOX, tmp))
    if "busybox" not in found:
        raise FetchError(f"no busybox binary in {bb.name}")
    fw = found.pop("qemu_fw_cfg.ko", None)
    for role, path in found.items():
        os.replace(path, k.root / role)
    k.fw_cfg_module.unlink(missing_ok=True)
    if fw is not None:
        data = fw.read_bytes()
        k.fw_cfg_module.write_bytes(lzma.decompress(data) if data[:6] == b"\xfd7zXZ\0" else data)
    shutil.rmtree(tmp, ignore_errors=True)
    bid = build_id(k.vmlinux)
    manifest = {"arch": arch, "release": release, "flavour": k.flavour, "suite": suite, "version": version, "build_id": bid,
                "packages": {"kernel": [d.name for d in kdebs], "dbg": dbg.name, "busybox": bb.name},
                "busybox_version": bb_version, "has_fw_cfg": k.fw_cfg_module.exists()}
    (k.root / "kernel.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _say(f"done: {k.root} (build-id {bid})")
    return k


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
