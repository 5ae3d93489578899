"""A true kdump in the lab: a guest panics, its kexec'd crash kernel copies ``/proc/vmcore`` to a disk.

``unwind lab kdump --arch ARCH -o DIR`` boots the fetched kernel under QEMU TCG with ``crashkernel=``,
KASLR as the kernel is built (``--nokaslr`` to turn it off), and a busybox ``/init`` that copies the same
kernel and the capture initramfs from the disk (past the room the vmcore takes), loads them with ``kexec -p``,
prints ``/proc/iomem`` and a few lines of ``/proc/kallsyms`` and crashes with sysrq ``c``. The capture kernel's
``/init`` loads ``virtio_blk`` and copies ``/proc/vmcore`` onto a raw virtio disk, then powers off. Written to
``DIR``:

* ``kdump-NNN.elf``: ``/proc/vmcore``, byte for byte (the disk cut to the ELF's last segment);
* ``kdump-NNN.console.txt``: what the panicking kernel printed from ``sysrq: Trigger a crash`` on,
  up to the capture kernel's first line (its panic trace is the oracle of the crash CPU);
* ``kdump-NNN.iomem.txt``: the first kernel's ``/proc/iomem`` (its RAM, as kexec-tools read it);
* ``kdump-NNN.kallsyms.txt``: the first kernel's ``/proc/kallsyms`` lines of :data:`KALLSYMS_NAMES` (where KASLR
  put them, as the running kernel says);
* ``kdump-NNN.console-full.txt``: the whole console of both kernels.

kexec comes from Debian's ``kexec-tools`` package of the guest's arch. Only the shared objects the
binary's ``DT_NEEDED`` entries ask for, transitively, are fetched (``SONAME_PACKAGES``), and they go
into the first kernel's initramfs with the dynamic loader at the binary's ``PT_INTERP`` path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from .boot import INIT_PRELUDE, MACHINE, GuestOptions, LabError, guest_command
from .fetch import (ARCHES, FetchError, Kernel, _download, _say, cache_dir, ensure_apt_source, ensure_tools,
                    newest_version)
from .modules import fetch_modules

#: the suite whose kexec-tools can load a crash kernel of the arch (RISC-V kdump came with 2.0.32)
KEXEC_SUITE = {"x86_64": "trixie", "arm64": "trixie", "riscv": "sid"}

#: the Debian package that ships each shared object kexec (or a library it needs) asks for
SONAME_PACKAGES = {
    "libc.so.6": "libc6", "libz.so.1": "zlib1g", "liblzma.so.5": "liblzma5", "libzstd.so.1": "libzstd1",
    "libxenctrl.so.4.20": "libxenmisc4.20", "libxentoollog.so.1": "libxentoollog1",
    "libxencall.so.1": "libxencall1", "libxenevtchn.so.1": "libxenevtchn1",
    "libxengnttab.so.1": "libxengnttab1", "libxenforeignmemory.so.1": "libxenforeignmemory1",
    "libxendevicemodel.so.1": "libxendevicemodel1", "libxentoolcore.so.1": "libxentoolcore1",
}

#: the capture kernel prints these around its copy of /proc/vmcore
SAVED = "UNWIND-KDUMP-SAVED"
FAILED = "UNWIND-KDUMP-FAILED"

#: the first kernel's /init prints /proc/iomem between two of these lines
IOMEM = "UNWIND-KDUMP-IOMEM"

#: the first kernel's /init prints these symbols' /proc/kallsyms lines between two of these lines
KALLSYMS = "UNWIND-KDUMP-KALLSYMS"

#: the symbols whose /proc/kallsyms lines are kept: the kernel's start and the functions of a sysrq c panic
KALLSYMS_NAMES = ("_text", "_stext", "panic", "__crash_kexec", "sysrq_handle_crash")

#: /init's wait for the virtio disk, its modules loaded
DISK_WAIT = r"""for m in $(cat /modules/order); do insmod /modules/$m.ko; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done
"""

#: the first kernel's /init: read the crash kernel and its initramfs from the disk past the vmcore's room (in the
#: initramfs they would leave a large freed initrd range, which kexec-tools keeps out of the crash ELF headers),
#: load them, leave a few tasks blocked, crash with sysrq c on the last CPU. @PAYLOAD@ is replaced by the
#: ``dd`` commands (:func:`payload_commands`).
FIRST_INIT = INIT_PRELUDE + DISK_WAIT + r"""mkdir -p /kdump
@PAYLOAD@
echo 1 > /proc/sys/kernel/sysrq
echo 8 > /proc/sys/kernel/printk
(while :; do cat /proc/meminfo /proc/stat > /dev/null; done) &
(while :; do dd if=/dev/urandom bs=4k count=16 2>/dev/null | md5sum > /dev/null; done) &
(while :; do sleep 1; done) &
sleep 100000 &
LD_LIBRARY_PATH=/lib/kexec /sbin/kexec -p /kdump/Image --initrd=/kdump/initrd.gz --append="@APPEND@" \
  || echo UNWIND-KDUMP-KEXEC-FAILED
echo "kexec_crash_loaded: $(cat /sys/kernel/kexec_crash_loaded)"
echo @IOMEM@; cat /proc/iomem; echo @IOMEM@
echo @KALLSYMS@; grep -E ' (@NAMES@)$' /proc/kallsyms; echo @KALLSYMS@
sleep 3
echo CRASHING NOW
# from the last CPU, so the crash CPU is not simply the first one
taskset $((1 << ($(nproc) - 1))) sh -c 'echo c > /proc/sysrq-trigger'
echo c > /proc/sysrq-trigger
""".replace("@IOMEM@", IOMEM).replace("@KALLSYMS@", KALLSYMS).replace("@NAMES@", "|".join(KALLSYMS_NAMES))

#: the capture kernel's /init: copy /proc/vmcore to the virtio disk, then power off
CAPTURE_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs dev /dev
""" + DISK_WAIT + r"""if [ -b /dev/vda ] && dd if=/proc/vmcore of=/dev/vda bs=1M conv=fsync 2>/dev/null; then
  echo "@SAVED@ $(stat -c %s /proc/vmcore)"
else
  echo @FAILED@
fi
sync
poweroff -f
""".replace("@SAVED@", SAVED).replace("@FAILED@", FAILED)

@dataclass(frozen=True)
class KdumpOptions(GuestOptions):
    """How the panicking guest is booted: the lab's guest (KASLR as the kernel is built) with a crash kernel."""

    kaslr: bool = True
    #: memory reserved for the crash kernel (``crashkernel=``)
    crashkernel: str = "256M"
    #: seconds until the guest must power off
    timeout: float = 1800.0


def _needed(path: Path) -> list[str]:
    """The ``DT_NEEDED`` names of an ELF file."""
    with open(path, "rb") as f:
        for sec in ELFFile(f).iter_sections():
            if isinstance(sec, DynamicSection):
                return [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    return []


def _interp(path: Path) -> str:
    """The ``PT_INTERP`` path of an ELF executable."""
    with open(path, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            if seg["p_type"] == "PT_INTERP":
                return seg.get_interp_name()
    raise FetchError(f"{path.name} has no PT_INTERP")


def _find_lib(root: Path, soname: str) -> Path | None:
    """The file an extracted package tree holds for ``soname`` (merged /usr: any lib folder)."""
    for d in ("usr/lib", "lib", "usr/lib64", "lib64"):
        for p in sorted((root / d).glob(f"**/{soname}")):
            return p
    return None


def kexec_tree(arch: str) -> tuple[Path, list[Path], str]:
    """Debian's kexec for ``arch``, unpacked with just the libraries it needs.

    Returns the binary, the shared objects it loads (transitively, by ``DT_NEEDED``) and its
    ``PT_INTERP``; the loader is among the objects. Unpacked into ``<cache>/tools/kexec-<dpkg arch>/``.
    """
    dpkg_arch = ARCHES[arch][0]
    suite = KEXEC_SUITE[arch]
    root = cache_dir() / "tools" / f"kexec-{dpkg_arch}"
    debs = cache_dir() / "tools" / f"debs-{dpkg_arch}"
    debs.mkdir(parents=True, exist_ok=True)
    ensure_apt_source(suite, dpkg_arch)

    def unpack(pkg: str) -> None:
        deb = _download(pkg, newest_version(f"{pkg}:{dpkg_arch}", suite), dpkg_arch, debs)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)

    binary = root / "usr" / "sbin" / "kexec"
    if not binary.exists() and not (root / "sbin" / "kexec").exists():
        unpack("kexec-tools")
    binary = binary if binary.exists() else root / "sbin" / "kexec"
    interp = _interp(binary)
    libs: dict[str, Path] = {}
    todo = [binary]
    while todo:
        for soname in _needed(todo.pop()):
            if soname in libs:
                continue
            lib = _find_lib(root, soname)
            if lib is None:
                pkg = "libc6" if soname == Path(interp).name else SONAME_PACKAGES.get(soname)
                if pkg is None:
                    raise FetchError(f"kexec needs {soname}: no Debian package for it in SONAME_PACKAGES")
                unpack(pkg)
                lib = _find_lib(root, soname)
                if lib is None:
                    raise FetchError(f"package {pkg} has no {soname}")
            libs[soname] = lib
            todo.append(lib)
    loader = _find_lib(root, Path(interp).name)
    if loader is None:
        unpack("libc6")
        loader = _find_lib(root, Path(interp).name)
    if loader is None:
        raise FetchError(f"no dynamic loader {interp} in libc6:{dpkg_arch}")
    libs[Path(interp).name] = loader
    return binary, list(libs.values()), interp


def _config(k: Kernel, name: str) -> str:
    """A ``CONFIG_`` value of ``k`` ('' when unset)."""
    for line in k.config.read_text().splitlines():
        if line.startswith(f"CONFIG_{name}="):
            return line.split("=", 1)[1]
    return ""


def disk_transport(k: Kernel) -> tuple[str, tuple[str, ...]]:
    """The QEMU virtio-blk device for ``k`` and the modules its capture kernel loads to see the disk."""
    mods = ("virtio_blk",) if _config(k, "VIRTIO_BLK") == "m" else ()
    if _config(k, "VIRTIO_PCI") in ("y", "m"):
        return "virtio-blk-pci", mods + (("virtio_pci",) if _config(k, "VIRTIO_PCI") == "m" else ())
    if k.arch != "x86_64" and _config(k, "VIRTIO_MMIO") in ("y", "m"):
        return "virtio-blk-device", mods + (("virtio_mmio",) if _config(k, "VIRTIO_MMIO") == "m" else ())
    raise LabError(f"{k.release} has neither virtio PCI nor virtio MMIO")


def _cpio(out: Path, dirs: list[str], files: list[tuple[str, bytes, int]],
          links: list[tuple[str, str]] = ()) -> Path:
    """A gzip'ed newc cpio of ``dirs``, ``files`` (name, data, mode) and symlinks (name, target)."""
    try:
        import libarchive
        from libarchive.entry import FileType
    except (ImportError, OSError, AttributeError) as e:
        raise LabError(f"writing the initramfs needs libarchive (Debian package libarchive13): {e}") from None
    with libarchive.file_writer(str(out), "cpio_newc", "gzip", options="compression-level=6") as archive:
        for name in dirs:
            archive.add_file_from_memory(name, 0, b"", filetype=FileType.DIRECTORY, permission=0o755)
        for name, data, mode in files:
            archive.add_file_from_memory(name, len(data), data, permission=mode)
        for name, target in links:
            archive.add_file_from_memory(name, 0, b"", filetype=FileType.SYMBOLIC_LINK, permission=0o777,
                                         symlink=target)
    return out


def capture_initramfs(k: Kernel, modules: list[str], out: Path) -> Path:
    """The capture kernel's initramfs: busybox, the disk's modules and :data:`CAPTURE_INIT`."""
    files = [("bin/busybox", k.busybox.read_bytes(), 0o755), ("init", CAPTURE_INIT.encode(), 0o755),
             ("modules/order", ("\n".join(modules) + "\n").encode(), 0o644)]
    files += [(f"modules/{m}.ko", (k.root / "kdump-modules" / f"{m}.ko").read_bytes(), 0o644) for m in modules]
    return _cpio(out, ["bin", "proc", "dev", "modules"], files)


def payload_commands(first_mib: int, files: list[tuple[str, int]]) -> str:
    """/init's ``dd`` commands that copy ``files`` (name, size), each at the next MiB of the disk from
    ``first_mib`` on, out of ``/dev/vda`` into ``/kdump``."""
    out, mib = [], first_mib
    for name, size in files:
        count = -(-size // (1 << 20))
        out.append(f"dd if=/dev/vda bs=1M skip={mib} count={count} 2>/dev/null | head -c {size} > /kdump/{name}")
        mib += count
    return "\n".join(out)


def write_payload(disk: Path, first_mib: int, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` (name, bytes) into ``disk``, each at the next MiB from ``first_mib`` on (as
    :func:`payload_commands` reads them)."""
    with open(disk, "r+b") as f:
        mib = first_mib
        for _, data in files:
            f.seek(mib << 20)
            f.write(data)
            mib += -(-len(data) // (1 << 20))


def first_initramfs(k: Kernel, modules: list[str], payload: str, append: str, out: Path) -> Path:
    """The panicking kernel's initramfs: busybox, kexec and its libraries, the disk's modules; its /init copies
    the crash kernel and its initramfs from the disk with the ``payload`` commands."""
    binary, libs, interp = kexec_tree(k.arch)
    init = FIRST_INIT.replace("@APPEND@", append).replace("@PAYLOAD@", payload)
    files = [("bin/busybox", k.busybox.read_bytes(), 0o755), ("init", init.encode(), 0o755),
             ("sbin/kexec", binary.read_bytes(), 0o755),
             ("modules/order", ("\n".join(modules) + "\n").encode(), 0o644)]
    files += [(f"modules/{m}.ko", (k.root / "kdump-modules" / f"{m}.ko").read_bytes(), 0o644) for m in modules]
    loader = Path(interp)
    files += [(f"lib/kexec/{lib.name}", lib.read_bytes(), 0o755) for lib in libs if lib.name != loader.name]
    files.append((str(loader).lstrip("/"), next(lib for lib in libs if lib.name == loader.name).read_bytes(), 0o755))
    dirs = ["bin", "sbin", "proc", "sys", "dev", "modules", "lib", "lib/kexec"]
    parent = str(loader.parent).lstrip("/")
    if parent not in dirs:
        dirs.append(parent)
    return _cpio(out, dirs, files)


def qemu_command(k: Kernel, opts: KdumpOptions, initrd: Path, disk: Path, console: Path, device: str) -> list[str]:
    """QEMU for the panicking guest: TCG, no reboot (the capture kernel's poweroff ends QEMU)."""
    append = (f"console={MACHINE[k.arch][0]} rdinit=/init loglevel=7 log_buf_len=1M "
              f"crashkernel={opts.crashkernel} panic=-1")
    if not opts.kaslr:
        append += " nokaslr"
    return [*guest_command(k, opts, initrd), "-no-reboot",
            "-append", append, "-chardev", f"file,id=con,path={console}", "-serial", "chardev:con",
            "-drive", f"file={disk},format=raw,if=none,id=vmcore", "-device", f"{device},drive=vmcore"]


def _mem_bytes(mem: str) -> int:
    n = int(mem.rstrip("MG"))
    return n << (30 if mem.endswith("G") else 20)


def elf_size(path: Path) -> int:
    """Where the ELF file at the start of ``path`` ends: its last segment's or header's end."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        h = elf.header
        end = h["e_phoff"] + h["e_phnum"] * h["e_phentsize"]
        for seg in elf.iter_segments():
            end = max(end, seg["p_offset"] + seg["p_filesz"])
    return end


def panic_console(text: str) -> str:
    """The panicking kernel's lines from ``sysrq: Trigger a crash`` up to the capture kernel's first line."""
    lines = text.replace("\r", "").splitlines()
    start = next((i for i, ln in enumerate(lines) if "sysrq: Trigger a crash" in ln), None)
    if start is None:
        raise LabError("the console has no 'sysrq: Trigger a crash'")
    end = next((i for i in range(start, len(lines))
                if "Booting Linux on physical CPU" in lines[i] or "Linux version " in lines[i]), len(lines))
    return "\n".join(lines[start:end]) + "\n"


#: a kernel message on the console (printk's timestamp), which may come between the lines /init prints
_KERNEL_LINE = re.compile(r"^\[ *\d+\.\d+\] ")


def between_markers(text: str, marker: str) -> str:
    """What the first kernel's /init printed between two ``marker`` lines (:data:`IOMEM`, :data:`KALLSYMS`), the
    kernel's own messages left out; '' when none."""
    parts = text.replace("\r", "").split(marker + "\n")
    if len(parts) < 3:
        return ""
    return "".join(ln for ln in parts[1].splitlines(keepends=True) if not _KERNEL_LINE.match(ln))


def run_kdump(k: Kernel, out_dir: Path, opts: KdumpOptions = KdumpOptions(), index: int = 0) -> list[Path]:
    """Boot ``k``, crash it, let its crash kernel save ``/proc/vmcore``; returns the files written."""
    ensure_tools(k.arch)
    device, modules = disk_transport(k)
    order = fetch_modules(k, modules, folder="kdump-modules") if modules else []
    out_dir.mkdir(parents=True, exist_ok=True)
    work = cache_dir() / "run" / f"kdump-{k.arch}"
    work.mkdir(parents=True, exist_ok=True)
    tty = MACHINE[k.arch][0]
    capture = capture_initramfs(k, order, work / "capture.gz")
    append = f"console={tty} rdinit=/init nr_cpus=1 reset_devices irqpoll loglevel=7"
    payload = [("Image", k.boot_image.read_bytes()), ("initrd.gz", capture.read_bytes())]
    first_mib = (_mem_bytes(opts.mem) >> 20) + 64
    initrd = first_initramfs(k, order, payload_commands(first_mib, [(n, len(d)) for n, d in payload]), append,
                             work / "initrd.gz")
    disk, console = work / "disk.raw", work / "console.log"
    disk.unlink(missing_ok=True)
    with open(disk, "wb") as f:
        f.truncate((first_mib << 20) + sum(-(-len(d) // (1 << 20)) << 20 for _, d in payload))
    write_payload(disk, first_mib, payload)
    console.unlink(missing_ok=True)
    cmd = qemu_command(k, opts, initrd, disk, console, device)
    _say("$ " + " ".join(cmd))
    t0 = time.time()
    try:
        subprocess.run(cmd, check=False, timeout=opts.timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LabError(f"the kdump guest did not power off in {opts.timeout:.0f}s; see {console}") from None
    text = console.read_bytes().decode(errors="replace")
    _say(f"guest ran {time.time() - t0:.0f}s")
    if SAVED not in text:
        why = "kexec -p failed" if "UNWIND-KDUMP-KEXEC-FAILED" in text else \
            "the capture kernel could not write the disk" if FAILED in text else "no capture kernel ran"
        raise LabError(f"no vmcore: {why}; see {console}")
    stem = f"kdump-{index:03d}"
    elf = out_dir / f"{stem}.elf"
    size = elf_size(disk)
    saved = int(text.split(SAVED, 1)[1].split()[0])
    if saved != size:
        raise LabError(f"/proc/vmcore was {saved} bytes, its ELF headers say {size}")
    with open(disk, "rb") as src, open(elf, "wb") as dst:
        remaining = size
        while remaining:
            chunk = src.read(min(remaining, 1 << 22))
            dst.write(chunk)
            remaining -= len(chunk)
    disk.unlink()
    (out_dir / f"{stem}.console.txt").write_text(panic_console(text))
    (out_dir / f"{stem}.iomem.txt").write_text(between_markers(text, IOMEM))
    (out_dir / f"{stem}.kallsyms.txt").write_text(between_markers(text, KALLSYMS))
    shutil.copyfile(console, out_dir / f"{stem}.console-full.txt")
    print(f"[kdump] {elf} ({size} bytes)", file=sys.stderr)
    return [elf, *(out_dir / f"{stem}.{kind}.txt" for kind in ("console", "iomem", "kallsyms", "console-full"))]
