"""drgn's stack traces as oracles: the same stopped kernel, read from QEMU's full memory dump.

drgn needs the whole memory of the guest (``dump-guest-memory``, ~1 GB, never committed) and the debug
vmlinux; the traces it gives are stored in our (small, committed) dump of the same stop, so CI needs
neither. On x86-64 ``DRGN_PREFER_ORC_UNWINDER=1`` makes drgn unwind with ORC alone, as the kernel does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from unwind.dump import Dump

#: drgn has no loop detection on arm64 (real-kernels.md §6): traces are cut here
MAX_FRAMES = 64
DRGN_NOTE = ("drgn {version} stack_trace on the QEMU vmcore of this stop (DRGN_PREFER_ORC_UNWINDER=1), "
             "inline frames dropped, cut at the first pc outside kernel text")


def _kernel_text(dump: Dump) -> tuple[int, int]:
    syms = dump.meta.get("symbols", {})
    return int(syms.get("_stext", "0"), 0), int(syms.get("_etext", "0"), 0)


def drgn_traces(dump: Dump, vmcore: str | Path, vmlinux: str | Path) -> list[dict[str, Any]]:
    """One ``drgn`` oracle per kernel-mode CPU and per blocked task of ``dump``."""
    os.environ.setdefault("DRGN_PREFER_ORC_UNWINDER", "1")
    import drgn
    from drgn.helpers.linux.sched import cpu_curr

    prog = drgn.Program()
    prog.set_core_dump(str(vmcore))
    prog.load_debug_info([str(vmlinux)])
    lo, hi = _kernel_text(dump)
    note = DRGN_NOTE.format(version=drgn.__version__)

    def frames(task: Any) -> list[str]:
        out: list[str] = []
        for f in prog.stack_trace(task):
            if f.is_inline:
                continue
            if not lo <= f.pc < hi or len(out) >= MAX_FRAMES:
                break
            out.append(hex(f.pc))
        return out

    oracles: list[dict[str, Any]] = []
    for c in dump.cpus:
        if c.mode == "kernel":
            oracles.append({"source": "drgn", "cpu": c.cpu, "pid": None,
                            "frames": frames(cpu_curr(prog, c.cpu)), "text": note})
    for t in dump.tasks():
        addr = t.extra.get("task")
        if t.running or addr is None:
            continue
        task = drgn.Object(prog, "struct task_struct *", value=int(addr, 0))
        oracles.append({"source": "drgn", "cpu": None, "pid": t.pid, "comm": t.comm,
                        "frames": frames(task), "text": note})
    return oracles


def add_drgn_oracles(path: Path, vmcore: str | Path, vmlinux: str | Path) -> int:
    """Replace the ``drgn`` oracles stored in the dump at ``path``; returns how many were stored."""
    from .capture import rewrite_dump

    dump = Dump.open(path)
    found = drgn_traces(dump, vmcore, vmlinux)
    meta = dict(dump.meta)
    meta["oracles"] = [o for o in meta.get("oracles", []) if o.get("source") != "drgn"] + found
    rewrite_dump(dump, path, meta)
    return len(found)
