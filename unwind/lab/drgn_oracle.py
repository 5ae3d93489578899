"""drgn's stack traces as oracles: the same stopped kernel, read from QEMU's full memory dump.

drgn needs the whole memory of the guest (``dump-guest-memory``, ~1 GB, never committed) and the debug
vmlinux; the traces it gives are stored in our (small, committed) dump of the same stop, so CI needs
neither. On x86-64 ``DRGN_PREFER_ORC_UNWINDER=1`` makes drgn unwind with ORC alone, as the kernel does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from unwind.formats.dump import Dump

from .fetch import build_id

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
        addr = t.task_struct
        if t.running or addr is None:
            continue
        task = drgn.Object(prog, "struct task_struct *", value=addr)
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


#: drgn's platform per ELF e_machine name, for dumps that do not say (QEMU's kdump files: machine "Unknown")
DRGN_ARCH = {"x86_64": "X86_64", "arm64": "AARCH64", "riscv": "RISCV64"}


def _program(vmcore: str | Path, arch: str | None):
    """A drgn Program on ``vmcore``: first as drgn detects it, then with ``arch``'s platform; how it opened."""
    import drgn

    tries: list[tuple[str, Any]] = [("detected", None)]
    if arch is not None:
        platform = drgn.Platform(getattr(drgn.Architecture, DRGN_ARCH[arch]),
                                 drgn.PlatformFlags.IS_64_BIT | drgn.PlatformFlags.IS_LITTLE_ENDIAN)
        tries.append((f"platform {DRGN_ARCH[arch]}", platform))
    errors = []
    for how, platform in tries:
        prog = drgn.Program(platform) if platform is not None else drgn.Program()
        try:
            prog.set_core_dump(str(vmcore))
            return prog, how, errors
        except Exception as e:  # drgn raises ValueError, OSError or its own errors per format
            errors.append(f"{how}: {type(e).__name__}: {e}")
    raise OSError(f"drgn cannot open {Path(vmcore).name}: {'; '.join(errors)}")


def vmcore_tasks(vmcore: str | Path, vmlinux: str | Path, modules: list[Path] = (),
                 arch: str | None = None) -> dict[str, Any]:
    """drgn's ``for_each_task`` and ``stack_trace`` of every task of a vmcore, as JSON-ready data.

    Frames are the non-inline ones up to the first user-space pc (bit 63 clear), at most
    :data:`MAX_FRAMES`; a task drgn cannot unwind has ``error`` instead. ``modules`` are the
    modules' debug files, so drgn has their symbols and unwind tables.
    """
    os.environ.setdefault("DRGN_PREFER_ORC_UNWINDER", "1")
    import drgn
    from drgn.helpers.linux.pid import for_each_task
    from drgn.helpers.linux.sched import task_cpu, task_state_to_char

    prog, how, open_errors = _program(vmcore, arch)
    prog.load_debug_info([str(vmlinux), *map(str, modules)])
    out: dict[str, Any] = {"drgn": drgn.__version__, "vmcore": Path(vmcore).name, "opened": how,
                           "open_errors": open_errors, "vmlinux_build_id": build_id(Path(vmlinux)), "max_frames": MAX_FRAMES,
                           "env": {"DRGN_PREFER_ORC_UNWINDER": os.environ["DRGN_PREFER_ORC_UNWINDER"]},
                           "modules": [m.name for m in modules], "tasks": []}
    try:
        tasks = list(for_each_task(prog))
    except drgn.FaultError as e:
        out["error"] = f"for_each_task: {e}"
        return out
    for task in tasks:
        entry: dict[str, Any] = {"task": hex(task.value_()), "pid": int(task.pid),
                                 "comm": task.comm.string_().decode(errors="replace")}
        try:
            entry["state"] = task_state_to_char(task)
            entry["cpu"] = int(task_cpu(task))
            entry["on_cpu"] = bool(task.on_cpu)
            frames = []
            for f in prog.stack_trace(task):
                if f.is_inline:
                    continue
                if not f.pc >> 63 or len(frames) >= MAX_FRAMES:
                    break
                try:
                    sym = prog.symbol(f.pc)
                    name = f"{sym.name}+{f.pc - sym.address:#x}/{sym.size:#x}"
                except LookupError:
                    name = None
                frames.append({"pc": hex(f.pc), "sp": hex(f.sp) if f.sp is not None else None,
                               "symbol": name, "interrupted": f.interrupted})
            entry["frames"] = frames
        except (drgn.FaultError, ValueError, LookupError, NotImplementedError) as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out["tasks"].append(entry)
    return out
