"""The ``unwind`` command line.

Exit status: 0 when every walk ended cleanly, 1 when a walk stopped on an
error (its partial trace is still printed), 2 on unusable input. Errors are
one line on stderr; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Callable, Sequence

from .dump import DumpError
from .image import ImageError
from .registry import ArchError
from .replay import ReplayError, load_session
from .target import Options
from .walk import DEFAULT_MAX_FRAMES

#: modules that add subcommands: each has ``add_commands(subparsers)``
_COMMAND_MODULES = ("unwind.lab.cli", "unwind.tools", "unwind.bench", "unwind.triage", "unwind.vmtools")

#: the input errors every subcommand turns into exit status 2
INPUT_ERRORS: tuple[type[Exception], ...] = (DumpError, ImageError, ArchError, ReplayError, OSError)


class UsageError(Exception):
    """Bad arguments (exit status 2)."""


def cmd_replay(args: argparse.Namespace) -> int:
    """``unwind replay``: print each selected task's trace."""
    from .output import replay_json, replay_text

    session = load_session(args.dump, arch=args.arch, vmlinux=args.vmlinux, system_map=args.system_map)
    for w in session.warnings:
        print(f"unwind: warning: {w}", file=sys.stderr)
    options = Options(complete=args.complete, record=args.explain, user=args.user,
                      generation=args.generation, orc_version=args.orc_version)
    status = 0
    for task in session.select(pid=args.task, cpu=args.cpu, every=args.all):
        r = session.replay(task, options, reliable=args.reliable, max_frames=args.max_frames)
        if args.json:
            print(json.dumps(replay_json(session, r, args.explain)))
        else:
            print("\n".join(replay_text(session, r, args.explain)))
        if not r.stop.clean:
            status = 1
    return status


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand."""
    p = argparse.ArgumentParser(prog="unwind", description="Replay captured Linux kernel stacks "
                                "with the kernel's own unwinders (arm64, x86-64 ORC, RISC-V).")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("replay", help="print the kernel's trace of tasks in a dump")
    r.add_argument("dump", help="dump file (ELF core; .xz/.gz accepted)")
    r.add_argument("--arch", help="expected arch; an error if the dump disagrees")
    r.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (vmlinux or slim); default: found by build-id")
    r.add_argument("--system-map", metavar="MAP", help="take symbols from a System.map")
    sel = r.add_mutually_exclusive_group()
    sel.add_argument("--task", type=int, metavar="PID", help="replay the task with this pid")
    sel.add_argument("--cpu", type=int, metavar="N", help="replay the task running on CPU N")
    sel.add_argument("--all", action="store_true", help="replay every task (default: running ones)")
    r.add_argument("--reliable", action="store_true", help="also run the reliable walk and give its verdict")
    r.add_argument("--json", action="store_true", help="one JSON object per task (docs/json.md)")
    r.add_argument("--explain", action="store_true", help="show each frame's provenance")
    r.add_argument("--complete", action="store_true",
                   help="recover frames the kernel drops where the dump proves them (flagged)")
    r.add_argument("--user", action="store_true", help="walk the user stack (where the arch supports it)")
    r.add_argument("--generation", metavar="VER", help="kernel unwinder generation to follow, e.g. 6.12 or 6.13")
    r.add_argument("--orc-version", metavar="N", help="force the ORC format generation (x86-64): 1..4")
    r.add_argument("--max-frames", type=int, default=DEFAULT_MAX_FRAMES, metavar="N")
    r.set_defaults(func=cmd_replay)

    for name in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        mod.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``unwind`` console script and ``python -m unwind``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return func(args)
    except (*INPUT_ERRORS, UsageError) as e:
        if args.debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"unwind: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("unwind: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
