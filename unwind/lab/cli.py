"""``unwind kernels``, ``unwind lab`` and ``unwind capture`` subcommands."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from .boot import READY, BootOptions, LabError, boot, lab_state, parse_mem, stop
from unwind.core.memory import MemoryFault
from unwind.kernel.btf import BtfError
from unwind.kernel.model import KernelError
from .capture import Plan, add_gdb_oracles, default_breaks, parse_vmcore_formats, reparse_oracles, run_capture
from .console_oracles import FtraceStacktrace, SysrqOracle
from .guest import CaptureError, CaptureSession, GuestImage
from .fetch import ARCHES, FLAVOURS, HOST_CHANGES, FetchError, canonical_arch, fetch, find_kernel
from .rsp import RspClient, RspError

#: what a lab step may raise for bad input or a failed step: each becomes one line, never a traceback
LAB_ERRORS = (FetchError, LabError, CaptureError, RspError, MemoryFault, BtfError, KernelError, OSError,
              TimeoutError)


def _fail(msg: str, code: int = 2) -> int:
    print(f"unwind: error: {msg}", file=sys.stderr)
    return code


def cmd_kernels_fetch(args: argparse.Namespace) -> int:
    """Fetch (or find) a kernel and print its cache folder."""
    try:
        k = fetch(args.arch, args.suite, args.release, args.flavour)
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    print(k.root)
    return 0


def cmd_kernels_list(args: argparse.Namespace) -> int:
    """List fetched kernels."""
    from .fetch import cache_dir

    found = sorted((cache_dir() / "kernels").glob("*/kernel.json"))
    if not found:
        print(f"none fetched in {cache_dir() / 'kernels'} (unwind kernels fetch --arch ARCH)")
    for p in found:
        m = json.loads(p.read_text())
        print(f"{m['arch']:7} {m['release']:28} {m['build_id']}  {p.parent}")
    return 0


def cmd_lab_boot(args: argparse.Namespace) -> int:
    """Boot (or report) the lab guest of an arch; ``--stop`` quits it."""
    try:
        arch = canonical_arch(args.arch)
        if args.stop:
            stop(arch)
            return 0
        opts = BootOptions(mem=parse_mem(args.mem), smp=args.smp, init=args.init, append=args.append,
                           qemu_args=tuple(shlex.split(args.qemu_args)), fgraph=args.fgraph,
                           kretprobe=args.kretprobe, modules=args.modules, fill=args.fill)
        st = boot(find_kernel(arch, args.release, args.flavour), opts, timeout=args.timeout, restart=args.restart)
    except ValueError as e:
        return _fail(f"bad --qemu-args: {e}")
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    print(json.dumps({k: st[k] for k in ("arch", "release", "pid", "gdb", "monitor", "console",
                                          "console_log")}, indent=1))
    return 0


def cmd_lab_stop(args: argparse.Namespace) -> int:
    """Quit the lab guest of an arch."""
    try:
        stop(canonical_arch(args.arch))
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    """Capture dumps from a GDB stub (see ``unwind capture -h``)."""
    from .monitor import Console, Monitor
    from .oracles import SystemMap

    console = monitor = vmcore_monitor = None
    try:
        lab = lab_state(args.lab) if args.lab else None
        gdb = args.gdb or (lab["gdb"] if lab else None)
        vmlinux = args.vmlinux or (str(Path(lab["kernel"]) / "vmlinux") if lab else None)
        if not gdb or not vmlinux:
            return _fail("need --gdb HOST:PORT and --vmlinux V (or --lab ARCH)")
        host, _, port = gdb.rpartition(":")
        if not port.isdigit():
            return _fail(f"bad --gdb {gdb!r}: expected HOST:PORT")
        con_sock = args.console or (lab["console"] if lab else None)
        smap_path = args.system_map or (Path(vmlinux).parent / "System.map")
        Path(args.output).mkdir(parents=True, exist_ok=True)
        print(f"[capture] loading {vmlinux}", file=sys.stderr)
        img = GuestImage(vmlinux)
        formats = parse_vmcore_formats(args.vmcore, img.arch) if args.vmcore else []
        rsp = RspClient(host or "127.0.0.1", int(port), timeout=args.timeout)
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    try:
        if rsp.running:
            rsp.halt()
        s = CaptureSession(rsp, img)
        s.setup()
        release = args.release or (lab["release"] if lab else "") or _osrelease(s.vmcoreinfo)
        breaks = [("breakpoint", b) for b in args.breaks.split(",") if b] if args.breaks else \
            default_breaks(s.lab, img)
        for _, sym in breaks:
            img.addr(sym)
        plan = Plan(args.stops, breaks, random_share=0 if args.breaks else 2,
                    break_timeout=args.break_timeout, sysrq_l=0 if args.no_sysrq else args.sysrq_l,
                    ftrace=args.ftrace)
        sysrq = ftrace = None
        if (not args.no_sysrq or args.ftrace) and con_sock:
            console = Console(con_sock, Path(args.output) / "console.txt")
            smap = SystemMap(smap_path) if Path(smap_path).exists() else None
            sysrq = None if args.no_sysrq else SysrqOracle(console, smap)
            if args.ftrace:
                ftrace = FtraceStacktrace(console, smap, args.ftrace_event, args.ftrace_never)
        qemu = shlex.join(lab["qemu"]) if lab else ""
        if args.monitor:
            monitor = Monitor(args.monitor)
        if formats:
            mon_path = args.monitor or (lab["monitor"] if lab else None)
            if not mon_path:
                raise CaptureError("--vmcore needs the QEMU monitor: --monitor SOCKET (or --lab ARCH)")
            vmcore_monitor = Monitor(mon_path, timeout=900.0)
        written = run_capture(s, plan, Path(args.output), release, qemu, sysrq, args.sysrq_every,
                              seed=args.seed, monitor=monitor, ftrace=ftrace, first=args.first,
                              vmcore_monitor=vmcore_monitor, vmcore_formats=formats)
    except LAB_ERRORS as e:
        print(f"unwind: error: {str(e).splitlines()[0]} (dumps written so far are kept in {args.output})",
              file=sys.stderr)
        return 1
    finally:
        rsp.release()
        if console is not None:
            console.close()
        for m in (monitor, vmcore_monitor):
            if m is not None:
                m.close()
    if written and args.gdb_oracle:
        try:
            add_gdb_oracles(written, vmlinux)
        except (*LAB_ERRORS, subprocess.TimeoutExpired) as e:
            return _fail(f"gdb oracle: {str(e).splitlines()[0]}", 1)
    return 0 if written else 1


def cmd_reparse(args: argparse.Namespace) -> int:
    """Re-derive stored kernel-trace oracles from their raw text with the current parser."""
    try:
        n = reparse_oracles([Path(p) for p in args.dumps], args.system_map)
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    print(f"{n} oracle traces changed", file=sys.stderr)
    return 0


def cmd_gdb_oracle(args: argparse.Namespace) -> int:
    """Add gdb's ``bt`` per CPU to existing dumps."""
    try:
        add_gdb_oracles([Path(p) for p in args.dumps], args.vmlinux)
    except (*LAB_ERRORS, subprocess.TimeoutExpired) as e:
        return _fail(str(e).splitlines()[0])
    return 0


def cmd_drgn_oracle(args: argparse.Namespace) -> int:
    """Add drgn's traces of the same stop (from QEMU's vmcore) to an existing dump."""
    from .drgn_oracle import add_drgn_oracles

    try:
        n = add_drgn_oracles(Path(args.dump), args.vmcore, args.vmlinux)
    except ImportError:
        return _fail("drgn is not installed (pip install drgn)")
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    print(f"{n} drgn traces stored in {args.dump}", file=sys.stderr)
    return 0


def cmd_drgn_tasks(args: argparse.Namespace) -> int:
    """Write drgn's task list and stack traces of a vmcore as JSON."""
    from .drgn_oracle import vmcore_tasks

    try:
        data = vmcore_tasks(args.vmcore, args.vmlinux, [Path(m) for m in args.module_debug],
                            canonical_arch(args.arch) if args.arch else None)
        Path(args.output).write_text(json.dumps(data, indent=1) + "\n")
    except ImportError:
        return _fail("drgn is not installed (pip install drgn)")
    except LAB_ERRORS as e:
        return _fail(str(e).splitlines()[0])
    n = len(data["tasks"])
    bad = sum(1 for t in data["tasks"] if "error" in t)
    print(f"{n} tasks ({bad} not unwound) -> {args.output}" + (f"; {data['error']}" if "error" in data else ""),
          file=sys.stderr)
    return 0


def cmd_lab_kdump(args: argparse.Namespace) -> int:
    """Crash a guest whose kexec'd crash kernel saves /proc/vmcore (see ``unwind lab kdump -h``)."""
    from .kdump import KdumpOptions, run_kdump

    try:
        opts = KdumpOptions(mem=parse_mem(args.mem), smp=args.smp, crashkernel=parse_mem(args.crashkernel),
                            kaslr=not args.nokaslr, timeout=args.timeout)
        for p in run_kdump(find_kernel(canonical_arch(args.arch), args.release, args.flavour), Path(args.output), opts,
                           args.index):
            print(p)
    except (*LAB_ERRORS, subprocess.CalledProcessError) as e:
        return _fail(str(e).splitlines()[0])
    return 0


def cmd_lab_kdump_slice(args: argparse.Namespace) -> int:
    """Cut a true kdump to the pages the project and drgn read, for the corpus."""
    from .vmcores import VmcoreToolError, kdump_slice

    elf = Path(args.vmcore)
    console = elf.with_name(elf.name.split(".")[0] + ".console.txt")
    try:
        if not console.exists():
            raise LabError(f"no {console.name} beside {elf.name}")
        for p in kdump_slice(elf, console, Path(args.vmlinux), Path(args.slim), canonical_arch(args.arch),
                             Path(args.output)):
            print(p)
    except (*LAB_ERRORS, VmcoreToolError) as e:
        return _fail(str(e).splitlines()[0])
    return 0


def _mib(text: str) -> int:
    """A ``--fill`` size in MiB: a whole number, 0 for none."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected MiB as a whole number, not {text!r}")
    return int(text)


def _osrelease(vmcoreinfo: str) -> str:
    for line in vmcoreinfo.splitlines():
        if line.startswith("OSRELEASE="):
            return line.split("=", 1)[1]
    return ""


#: what --flavour accepts, per arch
FLAVOUR_HELP = "; ".join(f"{arch}: {', '.join((ARCHES[arch][1], *FLAVOURS[arch]))}" for arch in ARCHES)


def _add_flavour(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--flavour", "--flavor", dest="flavour", metavar="FLAVOUR",
                   help=f"Debian kernel flavour {what} (default: the arch's own; {FLAVOUR_HELP})")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``kernels``, ``lab`` and ``capture`` to the top-level parser."""
    k = sub.add_parser("kernels", help="fetch Debian kernels into the cache")
    ksub = k.add_subparsers(dest="kernels_cmd", required=True)
    f = ksub.add_parser("fetch", help="download and extract a kernel, its vmlinux and busybox",
                        description="Download a Debian kernel (image, -dbg vmlinux, System.map, config, "
                        "qemu_fw_cfg.ko) and busybox-static of SUITE into the cache. " + HOST_CHANGES)
    f.add_argument("--arch", required=True, help="x86_64, arm64 or riscv")
    f.add_argument("--suite", default="trixie",
                   help="Debian suite: bookworm (with bookworm-security), trixie, sid (default trixie)")
    f.add_argument("--release", help="kernel release (default: the suite's current one)")
    _add_flavour(f, "to fetch (linux-image-FLAVOUR)")
    f.set_defaults(func=cmd_kernels_fetch)
    ksub.add_parser("list", help="list fetched kernels").set_defaults(func=cmd_kernels_list)

    lab = sub.add_parser("lab", help="boot a fetched kernel under QEMU TCG")
    lsub = lab.add_subparsers(dest="lab_cmd", required=True)
    b = lsub.add_parser("boot", help="boot the guest (gdbstub, monitor, logged console)")
    b.add_argument("--arch", required=True)
    b.add_argument("--release", help="which fetched kernel (default: the newest version fetched)")
    _add_flavour(b, "to boot when no --release is given")
    b.add_argument("--mem", default="1G", help="guest memory, QEMU -m (default 1G; 512M is enough)")
    b.add_argument("--smp", type=int, default=2)
    b.add_argument("--init", metavar="FILE",
                   help=f"use FILE as /init (busybox is /bin/busybox; print {READY} when ready)")
    b.add_argument("--append", default="", metavar="ARGS", help="extra kernel command-line arguments")
    b.add_argument("--qemu-args", default="", metavar="ARGS", help="extra QEMU arguments (shell words)")
    b.add_argument("--fgraph", action=argparse.BooleanOptionalAction, default=True,
                   help="built-in /init: function_graph on vfs_read/vfs_write/do_sys_openat2 (default on)")
    b.add_argument("--kretprobe", action=argparse.BooleanOptionalAction, default=True,
                   help="built-in /init: a kretprobe on ksys_read (default on)")
    b.add_argument("--modules", action="store_true",
                   help="load uhid and virtio_scsi (with dependencies) from the image package; /init leaves "
                        "a dd blocked reading /dev/uhid; QEMU gets -device virtio-scsi-pci")
    b.add_argument("--restart", action="store_true",
                   help="stop a running guest of another release or other options (else: refuse)")
    b.add_argument("--fill", type=_mib, default=0, metavar="MIB",
                   help="built-in /init: fill a tmpfs with MIB MiB of data (copies of 64 MiB from /dev/urandom) "
                        "before it is ready, so a vmcore of the guest holds that much data, not zero pages")
    b.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for /init")
    b.add_argument("--stop", action="store_true", help="quit the running guest instead")
    b.set_defaults(func=cmd_lab_boot)
    g = lsub.add_parser("gdb-oracle", help="store gdb-multiarch's bt per CPU in existing dumps")
    g.add_argument("--vmlinux", required=True)
    g.add_argument("dumps", nargs="+")
    g.set_defaults(func=cmd_gdb_oracle)
    dg = lsub.add_parser("drgn-oracle", help="store drgn's traces of the same stop, read from QEMU's vmcore")
    dg.add_argument("--vmcore", required=True, help="dump-guest-memory file of the same stop")
    dg.add_argument("--vmlinux", required=True, help="the debug vmlinux")
    dg.add_argument("dump")
    dg.set_defaults(func=cmd_drgn_oracle)
    dt = lsub.add_parser("drgn-tasks", help="drgn's for_each_task and stack_trace of every task of a vmcore, as JSON")
    dt.add_argument("--vmlinux", required=True, help="the debug vmlinux")
    dt.add_argument("--module-debug", action="append", default=[], metavar="KO",
                    help="a module's debug file (repeat), so drgn has its symbols and unwind tables")
    dt.add_argument("--arch", help="platform to retry with when drgn cannot tell (QEMU kdump files)")
    dt.add_argument("-o", "--output", required=True, help="JSON file to write")
    dt.add_argument("vmcore")
    dt.set_defaults(func=cmd_drgn_tasks)
    rp = lsub.add_parser("reparse-oracles", help="re-derive stored sysrq-t/sysrq-l frames from their text")
    rp.add_argument("--system-map", required=True)
    rp.add_argument("dumps", nargs="+")
    rp.set_defaults(func=cmd_reparse)
    kd = lsub.add_parser("kdump", help="a true kdump: panic a guest, its kexec'd crash kernel saves /proc/vmcore",
                         description="Boot the fetched kernel with crashkernel= and KASLR as built; /init loads "
                         "the same kernel with Debian's kexec -p and crashes with sysrq c; the capture kernel "
                         "copies /proc/vmcore to a virtio disk. Writes kdump-NNN.elf, kdump-NNN.console.txt "
                         "(the panicking kernel's console from the sysrq line on), kdump-NNN.iomem.txt and "
                         "kdump-NNN.kallsyms.txt (its /proc/iomem and a few /proc/kallsyms lines) and the full "
                         "console.")
    kd.add_argument("--arch", required=True)
    kd.add_argument("--release", help="which fetched kernel (default: the newest version fetched)")
    _add_flavour(kd, "to crash when no --release is given")
    kd.add_argument("--mem", default="1G", help="guest memory (default 1G)")
    kd.add_argument("--smp", type=int, default=2)
    kd.add_argument("--crashkernel", default="256M", help="memory reserved for the crash kernel (default 256M)")
    kd.add_argument("--nokaslr", action="store_true", help="boot the panicking kernel with nokaslr")
    kd.add_argument("--index", type=int, default=0, help="number the files kdump-NNN (default 0)")
    kd.add_argument("--timeout", type=float, default=1800.0, help="seconds until the guest must power off")
    kd.add_argument("-o", "--output", required=True, help="folder for the vmcore and the console")
    kd.set_defaults(func=cmd_lab_kdump)
    ks = lsub.add_parser("kdump-slice", help="cut a true kdump to what unwind and drgn read, for the corpus",
                         description="Write VMCORE's slice (xz; the pages ps and replay --all read with either "
                         "image, the page tables behind every page they translate, and what drgn reads), its "
                         "console and drgn's task oracle to OUTPUT.")
    ks.add_argument("--arch", required=True)
    ks.add_argument("--vmlinux", required=True, help="the debug vmlinux")
    ks.add_argument("--slim", required=True, help="the committed slim image")
    ks.add_argument("-o", "--output", required=True, help="the corpus folder (corpora/ARCH/RELEASE/vmcore)")
    ks.add_argument("vmcore", help="kdump-NNN.elf, with kdump-NNN.console.txt beside it")
    ks.set_defaults(func=cmd_lab_kdump_slice)
    st = lsub.add_parser("stop", help="quit the guest")
    st.add_argument("--arch", required=True)
    st.set_defaults(func=cmd_lab_stop)

    c = sub.add_parser("capture", help="capture dumps from a GDB stub")
    c.add_argument("--gdb", help="HOST:PORT of the GDB stub")
    c.add_argument("--vmlinux", help="the debug vmlinux of the running kernel")
    c.add_argument("--lab", metavar="ARCH", help="take stub, vmlinux and console from `unwind lab boot`")
    c.add_argument("--monitor", help="HMP socket: random stops via HMP 'stop' (default: the stub's ^C)")
    c.add_argument("--console", help="serial console socket (for sysrq-t)")
    c.add_argument("--system-map", help="System.map (default: next to the vmlinux)")
    c.add_argument("--stops", type=int, default=20)
    c.add_argument("--break", dest="breaks", metavar="F1,F2", help="breakpoint stops only, on these functions")
    c.add_argument("--break-timeout", type=float, default=15.0)
    c.add_argument("--no-sysrq", action="store_true", help="no sysrq-t oracle")
    c.add_argument("--sysrq-l", type=int, default=0, metavar="N",
                   help="then N stops where sysrq-l prints a running CPU's trace (kernel oracle)")
    c.add_argument("--ftrace", type=int, default=0, metavar="N",
                   help="then N stops where an ftrace stacktrace trigger fires (kernel oracle 'ftrace-stacktrace')")
    c.add_argument("--ftrace-event", default="timer/hrtimer_expire_entry", metavar="SYS/EVENT",
                   help="the trace event that carries the trigger (default timer/hrtimer_expire_entry)")
    c.add_argument("--ftrace-never", default="now < 0", metavar="FILTER",
                   help="an event filter no record passes, so the buffer holds only the stack traces")
    c.add_argument("--vmcore", metavar="FORMATS",
                   help="also have QEMU write these vmcores of each stop beside its dump, e.g. elf,kdump-zlib "
                        "(elf, paging [x86 only], kdump-zlib, kdump-lzo, kdump-snappy; needs the monitor)")
    c.add_argument("--first", type=int, default=0, metavar="N", help="number the dumps from N (stop-NNN-...)")
    c.add_argument("--sysrq-every", type=int, default=1, help="sysrq-t after every N-th stop")
    c.add_argument("--gdb-oracle", action="store_true", help="then store gdb-multiarch's bt in each dump")
    c.add_argument("--release", help="kernel release to record (default: VMCOREINFO OSRELEASE)")
    c.add_argument("--timeout", type=float, default=20.0, help="stub reply timeout")
    c.add_argument("--seed", type=int)
    c.add_argument("-o", "--output", required=True, help="folder for the dumps")
    c.set_defaults(func=cmd_capture)
