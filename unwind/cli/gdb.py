"""``unwind gdb``: gdb with the kernel's own unwinders registered (:mod:`unwind.cli.gdbtarget`).

gdb embeds a Python of its own: the script gdb sources puts this
installation's folders on its ``sys.path`` and registers the unwinder and the
``unwind-bt``/``unwind-ps`` commands. ``unwind gdb --script`` prints the
script's path, to ``source`` in a gdb started by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Sequence

import unwind
from unwind.core import registry
from unwind.formats.cachefile import cache_dir
from unwind.cli.gdbtarget import VMLINUX_PARAMETER

#: the gdb programs tried, the one that reads every architecture first
GDB_PROGRAMS = ("gdb-multiarch", "gdb")

class GdbSetupError(Exception):
    """No gdb that can run the script, or no place to write it; the message is one line (exit 2)."""


SCRIPT = '''\
# Sourced by gdb (`source {path}`): the kernel's own unwinders from unwind {version}.
import site
import sys

import gdb

if sys.version_info[:2] != {python}:
    raise gdb.GdbError("unwind: this gdb embeds Python %d.%d, unwind is installed for Python {python_text} "
                       "(its compiled dependencies load in that version only)" % sys.version_info[:2])
sys.path[:0] = [p for p in {paths!r} if p not in sys.path]
for folder in {sites!r}:
    site.addsitedir(folder)

import gdb.unwinder  # noqa: E402  (the folders above first)
from unwind.cli import gdbtarget

gdbtarget.install(gdb)
'''


def _folders() -> tuple[list[str], list[str]]:
    """The folders gdb's Python needs: this installation's site-packages (their ``.pth`` files map an
    editable install), then the folder the ``unwind`` package is in."""
    sites = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    package = str(Path(unwind.__file__).resolve().parent.parent)
    return list(dict.fromkeys([*sites, package])), sites


def script_path() -> Path:
    """Write the script gdb sources (in the cache, or beside the package when the cache cannot be made) and
    return its path."""
    folder = cache_dir("gdb") or Path(unwind.__file__).resolve().parent
    path = folder / "unwind-gdb.py"
    paths, sites = _folders()
    text = SCRIPT.format(path=path, version=unwind.__version__, python=tuple(sys.version_info[:2]),
                         python_text="%d.%d" % sys.version_info[:2], paths=paths, sites=sites)
    try:
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    except OSError as e:
        raise GdbSetupError(f"cannot write the gdb script {path}: {e.strerror}") from None
    return path


def _elf_arch(args: Sequence[str]) -> registry.ArchBackend | None:
    """The arch of the first ELF file among gdb's arguments (the vmlinux, the core)."""
    for arg in args:
        try:
            with open(arg, "rb") as f:
                head = f.read(20)
        except OSError:
            continue
        if head[:4] == b"\x7fELF" and head[5] == 1:
            try:
                return registry.for_e_machine(int.from_bytes(head[18:20], "little"))
            except registry.ArchError:
                continue
    return None


def _probe(gdb: str, *commands: str) -> subprocess.CompletedProcess[str]:
    argv = [gdb, "-nx", "-batch"] + [x for c in commands for x in ("-ex", c)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def find_gdb(arch: registry.ArchBackend | None) -> str:
    """``gdb-multiarch``, else ``gdb`` when it reads ``arch``: the one line saying why when neither will do."""
    tried = []
    for name in GDB_PROGRAMS:
        path = shutil.which(name)
        if path is None:
            tried.append(f"{name}: not found")
            continue
        if name == "gdb" and arch is not None and arch.gdb_arch:
            r = _probe(path, f"set architecture {arch.gdb_arch}")
            if r.returncode != 0 or "Undefined item" in r.stderr:
                tried.append(f"{name}: does not read {arch.name}")
                continue
        return path
    raise GdbSetupError(f"no gdb for {arch.name if arch else 'the kernel'} ({'; '.join(tried)}): install gdb-multiarch "
                     "(Debian package gdb-multiarch)")


def check_python(gdb: str) -> None:
    """Refuse a gdb whose Python is not this one's version (the script could not import unwind there)."""
    r = _probe(gdb, "python import sys; print('python=%d.%d' % sys.version_info[:2])")
    found = [line[7:] for line in r.stdout.splitlines() if line.startswith("python=")]
    ours = "%d.%d" % sys.version_info[:2]
    if not found:
        raise GdbSetupError(f"{gdb} has no Python (`python` fails: {(r.stderr.strip() or 'no output').splitlines()[0]})")
    if found[0] != ours:
        raise GdbSetupError(f"{gdb} embeds Python {found[0]}, unwind runs on Python {ours}: install unwind for "
                         f"Python {found[0]} (its compiled dependencies load in one version only)")


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``unwind gdb``'s own leading options, and gdb's arguments (everything from the first other one)."""
    own: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--script", "--debug", "-h", "--help"):
            own.append(arg)
        elif arg in ("--vmlinux", "--gdb") and i + 1 < len(argv):
            own += argv[i:i + 2]
            i += 1
        elif arg.startswith(("--vmlinux=", "--gdb=")):
            own.append(arg)
        elif arg == "--":
            i += 1
            break
        else:
            break
        i += 1
    return own, list(argv[i:])


class _GdbParser(argparse.ArgumentParser):
    """Parses ``unwind gdb``'s own leading options and hands every later argument to gdb untouched."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        own, rest = split_args(sys.argv[1:] if args is None else list(args))
        ns, extra = super().parse_known_args(own, namespace)
        ns.gdb_args = [*extra, *rest]
        return ns, []


def cmd_gdb(args: argparse.Namespace) -> int:
    """``unwind gdb``: exec gdb with the script sourced first (``--script``: print its path)."""
    try:
        script = script_path()
        if args.script:
            print(script)
            return 0
        gdb = args.gdb or find_gdb(_elf_arch([*([args.vmlinux] if args.vmlinux else []), *args.gdb_args]))
        check_python(gdb)
    except (GdbSetupError, OSError, subprocess.SubprocessError) as e:
        print(f"unwind: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    argv = [gdb, "-iex", f"source {script}"]
    if args.vmlinux:
        argv += ["-iex", f"set {VMLINUX_PARAMETER} {args.vmlinux}"]
    sys.stdout.flush()
    os.execv(gdb, argv + args.gdb_args)
    return 0  # not reached: gdb replaced this process


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``gdb`` to the top-level parser."""
    p = sub.add_parser("gdb", help="gdb with the kernel's own unwinders (bt, unwind-bt, unwind-ps)",
                       usage="unwind gdb [--script] [--vmlinux IMAGE] [--gdb GDB] [GDB ARGS...]",
                       description="Start gdb-multiarch (or gdb, when it reads the target's arch) with "
                       "unwind's frame unwinders registered: `bt` walks each CPU (gdb thread) as the kernel "
                       "does; `unwind-bt [PID|all] [--complete] [--explain]` prints any task's trace in the "
                       "kernel's style, `unwind-ps` the task list. Every argument after unwind's own options "
                       "goes to gdb: e.g. `unwind gdb vmlinux -ex 'target remote :1234'`, or `unwind gdb "
                       "IMAGE DUMP` for a dump or vmcore (uncompressed).")
    p.__class__ = _GdbParser  # its own options first, then gdb's arguments verbatim
    p.add_argument("--script", action="store_true",
                   help="print the path of the script to `source` in a gdb started by hand, and exit")
    p.add_argument("--vmlinux", metavar="IMAGE", help="kernel image, when gdb's file is not one")
    p.add_argument("--gdb", metavar="GDB", help="the gdb program (default: gdb-multiarch, else gdb)")
    p.set_defaults(func=cmd_gdb)
