"""unwind: the Linux kernel's stack unwinders (arm64, x86-64 ORC, RISC-V), replayed in Python.

Library use::

    from unwind import Session, Options
    s = Session.load("dump.bin")            # finds the image by build-id
    for task in s.select(every=True):
        r = s.replay(task, Options())
        print(task.describe(), [f.symbol for f in r.frames], r.stop)
"""

from .dump import Dump, DumpError, DumpWriter
from .frame import Flag, Frame, Provenance, Source
from .replay import Replay, ReplayError, Session
from .stackinfo import StackInfo, StackSet
from .target import Options, Target, Task
from .walk import (Stop, StopReason, Unwinder, UnwindStop, bpf_stack_walk, collect, iter_frames,
                   kunwind_stack_walk, stack_walk, stack_walk_reliable)

__all__ = [
    "Dump", "DumpError", "DumpWriter", "Flag", "Frame", "Provenance", "Source", "Replay", "ReplayError",
    "Session", "StackInfo", "StackSet", "Options", "Target", "Task", "Stop", "StopReason", "Unwinder",
    "UnwindStop", "bpf_stack_walk", "collect", "iter_frames", "kunwind_stack_walk", "stack_walk",
    "stack_walk_reliable",
]
__version__ = "0.1.0"
