"""The ``unwind`` command line.

Exit status: 0 when every walk ended cleanly (a walk cut short where the
kernel's own unwinder stops too is clean: its stop says ``truncated``), 1 when
a walk stopped on an error (its partial trace is still printed), 2 on unusable
input. Errors are one line on stderr; ``--debug`` (before or after the
subcommand) shows the traceback. A reader that closes the pipe early
(``unwind replay ... | head``) ends the run quietly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import TYPE_CHECKING, Callable, Sequence

from unwind.core.errors import DumpError
from unwind.formats.cachefile import CACHE_ENV
from unwind.formats.image import IMAGE_PATH_ENV, ImageError
from unwind.core.registry import ArchError
from unwind.session.replay import ReplayError, Session, load_session
from unwind.core.target import Options, Task

if TYPE_CHECKING:
    from unwind.session.filters import TaskFilter

#: the distribution the ``unwind`` package ships in
DISTRIBUTION = "kernel-unwind"

#: modules that add subcommands: each has ``add_commands(subparsers)``
_COMMAND_MODULES = ("unwind.lab.cli", "unwind.cli.corpus", "unwind.dev.bench.cli", "unwind.cli.triage",
                    "unwind.cli.tasks", "unwind.dev.fuzz.cli", "unwind.cli.gdb", "unwind.cli.decode",
                    "unwind.cli.accel")

#: the input errors every subcommand turns into exit status 2
INPUT_ERRORS: tuple[type[Exception], ...] = (DumpError, ImageError, ArchError, ReplayError, OSError)

#: shown under ``unwind --help`` and ``unwind replay --help``
ENVIRONMENT = f"""environment:
  {IMAGE_PATH_ENV}  folders ({os.pathsep}-separated) searched, with their subfolders, for a kernel
                     image whose build-id matches the dump
  {CACHE_ENV}       cache folder (default ~/.cache/unwind): unpacked images, symbol tables, and
                     the kernels `unwind kernels fetch` downloaded (searched by build-id too)"""


class UsageError(Exception):
    """Bad arguments (exit status 2)."""


def max_frames_arg(text: str) -> int:
    """``--max-frames``: a whole number of at least 1."""
    try:
        n = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1 frame")
    return n


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """``--state``, ``--comm``, ``--function`` and ``--task``: the task filters (``unwind.session.filters``)."""
    g = p.add_argument_group("task filters", "Each selects, of every task, those a full replay shows with "
                             "that property; given together, a task needs them all.")
    g.add_argument("--state", metavar="S[,D...]", action="append",
                   help="tasks in one of these states, ps's letters (R S D T t X Z P I); repeatable")
    g.add_argument("--comm", metavar="REGEX", help="tasks whose command matches REGEX (searched, as pgrep does)")
    g.add_argument("--function", metavar="NAME",
                   help="tasks with a frame in function NAME (walks every task the other filters keep)")
    g.add_argument("--task", metavar="PID[,PID...]", action="append",
                   help="the tasks with these pids; repeatable")


def task_filter(args: argparse.Namespace) -> "TaskFilter":
    """The :class:`TaskFilter` of the parsed filter arguments."""
    from unwind.session.filters import FilterError, TaskFilter

    try:
        return TaskFilter.of(args.state, args.comm, args.function, args.task)
    except FilterError as e:
        raise UsageError(str(e)) from None


def selected(session: Session, args: argparse.Namespace, f: "TaskFilter", options: Options | None = None) -> list[Task]:
    """The tasks the selection arguments (``--cpu``, ``--all``) and the filter ``f`` name; a note on stderr for
    each filter value that matched no task."""
    sel = session.selection(cpu=getattr(args, "cpu", None), every=getattr(args, "all", False), filters=f,
                            options=options)
    for note in sel.notes(f):
        print(f"unwind: note: {note}", file=sys.stderr)
    return sel.tasks


def cmd_replay(args: argparse.Namespace) -> int:
    """``unwind replay``: print each selected task's trace."""
    from unwind.session.output import replay_json, replay_text

    if args.modules is not None and not args.lines:
        raise UsageError("--modules DIR gives the modules' source lines: it needs --lines")
    if args.modules is not None and not os.path.isdir(args.modules):
        raise UsageError(f"--modules {args.modules}: not a folder")
    f = task_filter(args)
    session = load_session(args.dump, arch=args.arch, vmlinux=args.vmlinux, system_map=args.system_map)
    options = Options(complete=args.complete, record=args.explain, user=args.user,
                      generation=args.generation, orc_version=args.orc_version)
    session.check_options(options)
    for w in session.warnings:
        print(f"unwind: warning: {w}", file=sys.stderr)
    tasks = selected(session, args, f, options)
    sources = None
    if args.lines:
        sources = session.source_lines(args.modules)
        if sources.note:
            print(f"unwind: note: {sources.note}", file=sys.stderr)
    status = 0
    # --all and the filters but --task walk the tasks in one batch (unwind.session.batch, numpy); the running
    # tasks and the tasks of pids walk one by one, so a replay of them starts without numpy
    batch = args.all or (bool(f) and not f.pids)
    replays = (session.replay_all(options, tasks, reliable=args.reliable, max_frames=args.max_frames,
                                  lines=args.lines) if batch
               else (session.replay(t, options, reliable=args.reliable, max_frames=args.max_frames, lines=args.lines)
                     for t in tasks))
    for r in replays:
        if args.json:
            print(json.dumps(replay_json(session, r, args.explain, sources=sources, regs=args.regs)))
        else:
            print("\n".join(replay_text(session, r, args.explain, sources=sources, regs=args.regs)))
        if not r.stop.clean:
            status = 1
    for name, why in sources.modules.problems.items() if sources is not None and sources.modules is not None else ():
        print(f"unwind: note: --lines: module {name}: {why}: its frames have no source lines", file=sys.stderr)
    return status


def version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib import metadata  # not at the top: it imports zipfile, email, ... (~15 ms)

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from unwind import __version__
        return __version__


class _VersionAction(argparse.Action):
    """``--version``: the distribution's version, read only when asked (``importlib.metadata`` is slow)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"unwind ({DISTRIBUTION}) {version()}")
        parser.exit()


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand; for ``argv`` naming a command of this module
    (``replay``), without the other modules' commands, which are then not imported."""
    p = argparse.ArgumentParser(prog="unwind", description="Replay captured Linux kernel stacks "
                                "with the kernel's own unwinders (arm64, x86-64 ORC, RISC-V).",
                                epilog=ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_VersionAction)
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("replay", help="print the kernel's trace of tasks in a dump",
                       description="Print the trace each selected task's kernel would print. Exit status: "
                       "0 clean (also a walk the kernel itself cuts short: 'truncated'), 1 a walk stopped "
                       "on an error, 2 bad input.",
                       epilog=ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("dump", help="dump file (ELF core; .xz/.gz accepted)")
    r.add_argument("--arch", help="expected arch (x86_64/x86/amd64, arm64/aarch64, riscv/riscv64); "
                   "an error if the dump disagrees")
    r.add_argument("--vmlinux", metavar="IMAGE", help="kernel image (vmlinux or slim); default: found by build-id")
    r.add_argument("--system-map", metavar="MAP", help="take symbols from a System.map")
    sel = r.add_mutually_exclusive_group()
    sel.add_argument("--cpu", type=int, metavar="N", help="replay the task running on CPU N")
    sel.add_argument("--all", action="store_true", help="replay every task (default: running ones, or the "
                     "filters' tasks)")
    r.add_argument("--reliable", action="store_true", help="also run the reliable walk and give its verdict")
    r.add_argument("--json", action="store_true", help="one JSON object per task (docs/json.md)")
    r.add_argument("--explain", action="store_true", help="show each frame's provenance")
    r.add_argument("--lines", action="store_true", help="show each frame's source file:line and inline chain "
                   "(from the image's DWARF: a -dbg vmlinux)")
    r.add_argument("--modules", metavar="DIR", help="with --lines: folder searched for the modules' .ko files "
                   "with DWARF, by name (a module frame's lines come from its .ko)")
    r.add_argument("--regs", action="store_true", help="show a blocked task's saved context (arm64 "
                   "thread.cpu_context, x86-64 thread.sp and its inactive_task_frame, riscv thread.ra/sp/s0-s11)")
    r.add_argument("--complete", action="store_true",
                   help="recover frames the kernel drops where the dump proves them (flagged)")
    r.add_argument("--user", action="store_true", help="walk the user stack (riscv)")
    r.add_argument("--generation", metavar="VER", help="kernel unwinder generation to follow, e.g. 6.12 or 6.13")
    r.add_argument("--orc-version", metavar="N", help="force the ORC format generation (x86-64): 1..4; "
                   "refused where the image's .orc_header names another")
    r.add_argument("--max-frames", type=max_frames_arg, default=None, metavar="N",
                   help="stop a walk after N frames with 'frame limit reached' "
                   "(default: what the task's captured stack bytes allow, docs/dump-format.md)")
    add_filter_arguments(r)
    r.set_defaults(func=cmd_replay)

    own = argv is not None and _command(argv) in sub.choices
    for name in () if own else _COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        mod.add_commands(sub)
    _add_debug_everywhere(sub)
    return p


def _add_debug_everywhere(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Accept ``--debug`` after any subcommand too (unset there unless given)."""
    for parser in sub.choices.values():
        if "--debug" not in parser._option_string_actions:
            parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                help="show tracebacks on errors")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_debug_everywhere(action)


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the exit's flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file (a test's capture): nothing to flush at exit
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``unwind`` command line (the program is :func:`unwind.__main__.console`); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status = func(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:  # the reader went away (`| head`): not an input error
        _quiet_stdout()
        return 0
    except (*INPUT_ERRORS, UsageError) as e:
        if args.debug:
            raise
        for w in getattr(e, "warnings", ()):
            print(f"unwind: warning: {w}", file=sys.stderr)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"unwind: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("unwind: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
