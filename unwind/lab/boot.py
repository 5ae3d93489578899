"""Boot a fetched kernel under QEMU TCG with a busybox initramfs, a gdbstub and a monitor.

One guest per arch lives in ``<cache>/run/<arch>/``: ``qemu.pid``, ``mon.sock``
(HMP), ``con.sock`` (serial console, takes input), ``console.log`` (everything
the console printed) and ``lab.json`` (ports and paths, read by ``capture``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .fetch import ARCHES, Kernel, cache_dir, canonical_arch, ensure_tools
from .modules import LAB_MODULE_QEMU_ARGS, fetch_modules

READY = "UNWIND-LAB-READY"

#: the start of every lab guest's /init: busybox's applets, /proc, /sys and /dev
INIT_PRELUDE = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
"""

#: /init: workloads, sysrq, then (by option) function_graph and a kretprobe; @TRACING@ is replaced.
INIT_SCRIPT = INIT_PRELUDE + r"""mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
echo 1 > /proc/sys/kernel/sysrq
echo 8 > /proc/sys/kernel/printk
[ -f /qemu_fw_cfg.ko ] && insmod /qemu_fw_cfg.ko
[ -f /modules/order ] && for m in $(cat /modules/order); do insmod /modules/$m.ko; done
[ -c /dev/uhid ] && dd if=/dev/uhid of=/dev/null bs=64 count=1 2>/dev/null &
T=/sys/kernel/tracing
if [ -d $T/events ]; then
  echo 64 > $T/buffer_size_kb
@TRACING@
fi
@FILL@
(while :; do cat /proc/meminfo /proc/stat /proc/interrupts /proc/self/maps > /dev/null; done) &
(while :; do dd if=/dev/zero of=/dev/null bs=4k count=200 2>/dev/null; done) &
(while :; do dd if=/dev/urandom bs=4k count=16 2>/dev/null | md5sum > /dev/null; done) &
(while :; do ls -R /sys/kernel > /dev/null 2>&1; sleep 1; done) &
(while :; do sleep 1; done) &
sleep 100000 &
echo UNWIND-LAB-READY
exec setsid cttyhack sh
"""

#: a kretprobe on ksys_read (arm64: kretprobe trampoline; x86/riscv: rethook)
KRETPROBE = """  echo 'r:krp_ksys_read ksys_read' >> $T/kprobe_events
  echo 1 > $T/events/kprobes/krp_ksys_read/enable"""

#: function_graph on a few hot functions, shallow, so stacks hold return_to_handler
FGRAPH = """  echo vfs_read > $T/set_graph_function
  echo vfs_write >> $T/set_graph_function
  echo do_sys_openat2 >> $T/set_graph_function
  echo 4 > $T/max_graph_depth
  echo function_graph > $T/current_tracer"""


#: fill a tmpfs of @MIB@ MiB with copies of 64 MiB from /dev/urandom, so guest RAM holds data, not zero pages
FILL = """mkdir -p /fill && mount -t tmpfs -o size=@MIB@m fill /fill
dd if=/dev/urandom of=/fill/seed bs=1M count=64 2>/dev/null
i=0; while cat /fill/seed > /fill/$i 2>/dev/null; do i=$((i+1)); done
echo "UNWIND-LAB-FILLED $(du -sm /fill)"
"""


def init_script(fgraph: bool = True, kretprobe: bool = True, fill: int = 0) -> str:
    """The built-in /init, with the kretprobe, function_graph and ``fill`` MiB of RAM filled when asked for."""
    parts = [KRETPROBE] * kretprobe + [FGRAPH] * fgraph
    return (INIT_SCRIPT.replace("@TRACING@", "\n".join(parts) or "  :")
            .replace("@FILL@", FILL.replace("@MIB@", str(fill)) if fill else ":"))


@dataclass(frozen=True)
class GuestOptions:
    """The machine every lab guest is: its memory, its CPUs, KASLR."""

    mem: str = "1G"
    smp: int = 2
    #: leave KASLR on (no ``nokaslr``): the capture refuses such a guest, ``unwind gdb`` reads it
    kaslr: bool = False


@dataclass(frozen=True)
class BootOptions(GuestOptions):
    """How to boot the lab guest; a running guest is reused only when booted with the same options."""

    #: a user /init (a file whose last step prints UNWIND-LAB-READY), else the built-in one
    init: str | None = None
    #: extra kernel command-line arguments
    append: str = ""
    #: extra QEMU arguments
    qemu_args: tuple[str, ...] = ()
    fgraph: bool = True
    kretprobe: bool = True
    #: load the lab modules (unwind.lab.modules) and give QEMU the devices they drive
    modules: bool = False
    #: built-in /init: MiB of guest RAM filled with data (a tmpfs) before it reports ready
    fill: int = 0

    def to_json(self) -> dict:
        """The options as stored in lab.json (``kaslr`` and ``fill`` only when on: a guest booted without is the same)."""
        d = asdict(self)
        d["qemu_args"] = list(self.qemu_args)
        for off in ("kaslr", "fill"):
            if not d[off]:
                del d[off]
        return d


def parse_mem(mem: str) -> str:
    """Check a QEMU ``-m`` size (``512M``, ``1G``, ``1024``); LabError when it is not one."""
    if not re.fullmatch(r"[1-9][0-9]*[MG]?", mem):
        raise LabError(f"bad --mem {mem!r}: expected a size such as 512M or 1G")
    return mem


class LabError(Exception):
    """A lab step failed; the message is one line for the user."""


def run_dir(arch: str) -> Path:
    """Runtime folder of the guest for ``arch``."""
    return cache_dir() / "run" / canonical_arch(arch)


#: the folders of the initramfs, parents first
INITRAMFS_DIRS = ("bin", "proc", "sys", "dev", "tmp", "sys/kernel", "sys/kernel/tracing")


def initramfs_files(k: Kernel, opts: BootOptions) -> list[tuple[str, Path | bytes, int]]:
    """What the initramfs holds besides its folders: ``(name, file or bytes, mode)`` in archive order."""
    files: list[tuple[str, Path | bytes, int]] = [("bin/busybox", k.busybox, 0o755)]
    if k.fw_cfg_module.exists():
        files.append(("qemu_fw_cfg.ko", k.fw_cfg_module, 0o644))
    if opts.modules:
        files += [(f"modules/{name}.ko", k.root / "modules" / f"{name}.ko", 0o644) for name in fetch_modules(k)]
        files.append(("modules/order", k.root / "modules" / "order", 0o644))
    if opts.init:
        try:
            files.append(("init", Path(opts.init).read_bytes(), 0o755))
        except OSError as e:
            raise LabError(f"cannot read --init {opts.init}: {e.strerror}") from None
    else:
        files.append(("init", init_script(opts.fgraph, opts.kretprobe, opts.fill).encode(), 0o755))
    return files


def build_initramfs(k: Kernel, out: Path, opts: BootOptions = BootOptions()) -> Path:
    """Write a gzip'ed newc cpio with busybox, /init and qemu_fw_cfg.ko to ``out`` (with libarchive)."""
    files = initramfs_files(k, opts)
    try:
        import libarchive
        from libarchive.entry import FileType
    except (ImportError, OSError, AttributeError) as e:
        raise LabError(f"writing the initramfs needs libarchive (Debian package libarchive13): {e}") from None
    with libarchive.file_writer(str(out), "cpio_newc", "gzip", options="compression-level=9") as archive:
        for name in INITRAMFS_DIRS + (("modules",) if opts.modules else ()):
            archive.add_file_from_memory(name, 0, b"", filetype=FileType.DIRECTORY, permission=0o755)
        for name, src, mode in files:
            data = src if isinstance(src, bytes) else src.read_bytes()
            archive.add_file_from_memory(name, len(data), data, permission=mode)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: arch -> (console device, QEMU machine arguments)
MACHINE = {"x86_64": ("ttyS0", []), "arm64": ("ttyAMA0", ["-M", "virt", "-cpu", "max,pauth-impdef=on"]),
           "riscv": ("ttyS0", ["-M", "virt", "-bios", "default"])}


def guest_command(k: Kernel, opts: GuestOptions, initrd: Path) -> list[str]:
    """QEMU under TCG with the arch's machine, ``opts``' memory and CPUs, no display nor default devices,
    booting ``k`` with ``initrd``: the start of every lab guest's command line."""
    return [ARCHES[k.arch][2], *MACHINE[k.arch][1], "-accel", "tcg", "-m", opts.mem, "-smp", str(opts.smp),
            "-display", "none", "-nodefaults", "-kernel", str(k.boot_image), "-initrd", str(initrd)]


def qemu_command(k: Kernel, run: Path, initrd: Path, port: int, opts: BootOptions = BootOptions()) -> list[str]:
    """The QEMU command line for ``k`` (TCG, gdbstub, HMP socket, logged console socket)."""
    common = ["-chardev", f"socket,id=con,path={run}/con.sock,server=on,wait=off,"
                          f"logfile={run}/console.log",
              "-serial", "chardev:con",
              "-gdb", f"tcp:127.0.0.1:{port}",
              "-monitor", f"unix:{run}/mon.sock,server=on,wait=off",
              "-pidfile", f"{run}/qemu.pid", "-daemonize"]
    tail = " ".join([*([] if opts.kaslr else ["nokaslr"]), "panic=-1 rdinit=/init loglevel=7 log_buf_len=4M",
                     opts.append]).strip()
    # the device QEMU's dumps take VMCOREINFO from; QEMU writes none of a riscv guest (docs/vmcore.md)
    vmcoreinfo = ["-device", "vmcoreinfo"] if k.arch != "riscv" else []
    cmd = [*guest_command(k, opts, initrd), *common, *vmcoreinfo, "-append", f"console={MACHINE[k.arch][0]} {tail}"]
    return cmd + list(LAB_MODULE_QEMU_ARGS) * opts.modules + list(opts.qemu_args)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def lab_state(arch: str) -> dict:
    """The running guest's lab.json for ``arch``; LabError when none is running."""
    run = run_dir(arch)
    p = run / "lab.json"
    if not p.exists():
        raise LabError(f"no lab guest for {arch}; run: unwind lab boot --arch {arch}")
    st = json.loads(p.read_text())
    if not _alive(st["pid"]):
        raise LabError(f"lab guest for {arch} (pid {st['pid']}) is not running")
    return st


def boot(k: Kernel, opts: BootOptions = BootOptions(), timeout: float = 180.0, restart: bool = False) -> dict:
    """Boot ``k`` and wait until /init reports ready; returns the lab state.

    A guest already running for the arch is returned only when it runs ``k``
    with the same options; otherwise LabError, or with ``restart`` it is
    stopped and ``k`` booted.
    """
    run = run_dir(k.arch)
    parse_mem(opts.mem)
    try:
        st = lab_state(k.arch)
    except LabError:
        st = None
    if st is not None:
        differs = running_differs(st, k, opts)
        if not differs:
            print(f"[lab] {k.arch} guest already running {k.release} (pid {st['pid']})", file=sys.stderr)
            return st
        if not restart:
            raise LabError(f"the running {k.arch} guest (pid {st['pid']}) {differs}; "
                           f"stop it (unwind lab stop --arch {k.arch}) or pass --restart")
        print(f"[lab] restarting the {k.arch} guest: it {differs}", file=sys.stderr)
        stop(k.arch)
    ensure_tools(k.arch)
    run.mkdir(parents=True, exist_ok=True)
    for f in ("console.log", "qemu.pid", "lab.json", "mon.sock", "con.sock"):
        (run / f).unlink(missing_ok=True)
    initrd = build_initramfs(k, run / "initrd.gz", opts)
    port = _free_port()
    cmd = qemu_command(k, run, initrd, port, opts)
    print("[lab] $ " + shlex.join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"qemu failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    pid = int((run / "qemu.pid").read_text())
    st = {"arch": k.arch, "release": k.release, "kernel": str(k.root), "pid": pid,
          "gdb": f"127.0.0.1:{port}", "monitor": str(run / "mon.sock"),
          "console": str(run / "con.sock"), "console_log": str(run / "console.log"),
          "qemu": cmd, "options": opts.to_json(), "booted": time.time()}
    (run / "lab.json").write_text(json.dumps(st, indent=1) + "\n")
    t0 = time.time()
    log = run / "console.log"
    while time.time() - t0 < timeout:
        if log.exists() and READY.encode() in log.read_bytes():
            print(f"[lab] {k.arch} guest ready in {time.time() - t0:.1f}s (pid {pid}, gdb {st['gdb']})",
                  file=sys.stderr)
            return st
        if not _alive(pid):
            raise LabError(f"qemu exited during boot; see {log}")
        time.sleep(0.5)
    raise LabError(f"guest not ready after {timeout:.0f}s; see {log}")


def running_differs(st: dict, k: Kernel, opts: BootOptions) -> str:
    """Why the running guest's lab state ``st`` is not ``k`` booted with ``opts`` ('' when it is)."""
    if st.get("release") != k.release:
        return f"runs {st.get('release')}, not {k.release}"
    if st.get("options", BootOptions().to_json()) != opts.to_json():
        return "was booted with other options"
    return ""


def stop(arch: str, timeout: float = 15.0) -> None:
    """Quit the guest for ``arch`` through its monitor (SIGTERM if the monitor does not answer)."""
    from .monitor import Monitor

    st = lab_state(arch)
    try:
        with Monitor(st["monitor"]) as mon:
            mon.send_quit()
    except OSError:
        pass
    t0 = time.time()
    while _alive(st["pid"]) and time.time() - t0 < timeout:
        time.sleep(0.2)
    if _alive(st["pid"]):
        os.kill(st["pid"], signal.SIGTERM)
    (run_dir(arch) / "lab.json").unlink(missing_ok=True)
    print(f"[lab] {arch} guest stopped", file=sys.stderr)
