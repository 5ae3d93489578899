"""unwind: the Linux kernel's stack unwinders (arm64, x86-64 ORC, RISC-V), replayed in Python.

Library use::

    from unwind import Session, Options
    s = Session.load("dump.bin")            # finds the image by build-id
    for task in s.select(every=True):
        r = s.replay(task, Options())
        print(task.describe(), [f.symbol for f in r.frames], r.stop)

The names below are imported from their modules when first used, so that ``import unwind``
(and the ``unwind`` program, which imports only what its command uses) costs no more than it must.
``python -m unwind.dev.apidoc OUT`` writes their reference (the ``docs`` extra: pdoc).
"""

from __future__ import annotations

import os
import sys
from importlib.util import module_from_spec, spec_from_file_location
from typing import TYPE_CHECKING

from . import accel
from .lazy import lazy_exports

accel.install()  # the compiled build of the walk's hot modules, where one is made (unwind.accel)

if TYPE_CHECKING:
    from .core.errors import DumpError
    from .formats.dump import Dump, DumpWriter
    from .core.frame import Flag, Frame, Provenance, Source, SourceLine
    from .session.replay import ReplayError, Session
    from .session.result import Replay
    from .core.stackinfo import StackInfo, StackSet
    from .core.target import Options, SavedRegs, Target, Task
    from .core.walk import (Stop, StopReason, Unwinder, UnwindStop, bpf_stack_walk, collect, iter_frames,
                            kunwind_stack_walk, stack_walk, stack_walk_reliable)

#: each public name and the module that defines it
_FROM = {
    "core.errors": ("DumpError",),
    "formats.dump": ("Dump", "DumpWriter"),
    "core.frame": ("Flag", "Frame", "Provenance", "Source", "SourceLine"),
    "session.replay": ("ReplayError", "Session"),
    "session.result": ("Replay",),
    "core.stackinfo": ("StackInfo", "StackSet"),
    "core.target": ("Options", "SavedRegs", "Target", "Task"),
    "core.walk": ("Stop", "StopReason", "Unwinder", "UnwindStop", "bpf_stack_walk", "collect", "iter_frames",
             "kunwind_stack_walk", "stack_walk", "stack_walk_reliable"),
}

__all__ = [
    "Dump", "DumpError", "DumpWriter", "Flag", "Frame", "Provenance", "Source", "SourceLine", "Replay", "ReplayError",
    "Session", "StackInfo", "StackSet", "Options", "SavedRegs", "Target", "Task", "Stop", "StopReason", "Unwinder",
    "UnwindStop", "bpf_stack_walk", "collect", "iter_frames", "kunwind_stack_walk", "stack_walk",
    "stack_walk_reliable",
]
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, globals(), _FROM)


def _arch_of_checkout() -> None:
    """Name a checkout's ``arch/`` folder ``unwind.arch``.

    Installed, the arch backends are ``unwind/arch`` (pyproject's package-dir maps ``arch/`` there). A
    checkout keeps them beside this folder, as the design card has it; when ``unwind`` is imported from
    a checkout (its root is the current folder, as in ``python3 -c`` or ``python3 -m unwind`` there),
    the same backends are found as ``unwind.arch`` all the same.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    beside = os.path.join(os.path.dirname(here), "arch")
    init = os.path.join(beside, "__init__.py")
    if os.path.isdir(os.path.join(here, "arch")) or not os.path.isfile(init) or "unwind.arch" in sys.modules:
        return
    spec = spec_from_file_location("unwind.arch", init, submodule_search_locations=[beside])
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["unwind.arch"] = module
    spec.loader.exec_module(module)


_arch_of_checkout()
