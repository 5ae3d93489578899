"""``unwind accel``: make the compiled build of the walk's hot modules, or say which build runs."""

from __future__ import annotations

import argparse
import sys

from unwind import accel


def cmd_build(args: argparse.Namespace) -> int:
    """``unwind accel build``: compile the modules (nothing to do when this source's build exists)."""
    try:
        folder = accel.build(jobs=args.jobs)
    except accel.AccelError as e:
        print(f"unwind accel: {e}", file=sys.stderr)
        return 2
    print(f"compiled build of {len(accel.MODULES)} modules: {folder}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """``unwind accel status``: each module and the file it runs from."""
    for name, file in accel.status().items():
        print(f"{'compiled' if not file.endswith('.py') else 'pure':9} {name:32} {file}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``accel build`` and ``accel status`` to the top-level parser."""
    a = sub.add_parser("accel", help="compile the walk's hot modules (Cython), or show which build runs",
                       description="The walk's hot modules compiled from their own source with Cython (a C "
                       "compiler and `pip install cython` needed), kept in $UNWIND_ACCEL or $UNWIND_CACHE/accel "
                       "and used by every later run of this source; UNWIND_PURE=1 runs the interpreted modules.")
    what = a.add_subparsers(dest="accel_command", metavar="ACTION", required=True)
    b = what.add_parser("build", help="compile the modules for this Python and source")
    b.add_argument("-j", "--jobs", type=int, default=0, help="parallel compiler jobs (default: one)")
    b.set_defaults(func=cmd_build)
    s = what.add_parser("status", help="each module and the file it runs from")
    s.set_defaults(func=cmd_status)
