"""The ``UNWIND`` note's facts as :class:`unwind.core.dumpinfo.DumpInfo`, and back (``docs/dump-format.md``).

:func:`dump_info` reads a validated note (addresses already ints) once, when the dump
is opened; :func:`note_keys` writes a :class:`DumpInfo`'s modules, BPF symbols, symbol
hints and ftrace trampolines as the note stores them (``unwind convert`` of a vmcore).
"""

from __future__ import annotations

from typing import Any

from unwind.core.dumpinfo import (BlockedContext, BpfSymbol, CpuNote, DumpInfo, FtraceTrampoline, ModuleInfo,
                                  ModuleOrc, ModuleRegion, StackNote, StructOffsets)

from .note import Note


def dump_info(note: Note, release: str | None) -> DumpInfo:
    """The validated ``note`` as typed values; ``release`` is the dump's (the note's, else VMCOREINFO's)."""
    kernel = note["kernel"] or {}
    offsets = note["offsets"]
    return DumpInfo(
        release=release, generation=kernel.get("generation"), build_id=note["build_id"],
        symbols=note["symbols"],
        modules=tuple(_module(m) for m in note["modules"]),
        bpf_symbols=tuple(BpfSymbol(lo, hi, name) for lo, hi, name in note["bpf_symbols"]),
        ftrace_trampolines=tuple(FtraceTrampoline(t["addr"], t["size"], t["ops"], t["save_regs"])
                                 for t in note["ftrace_trampolines"]),
        offsets=None if offsets is None else {k: StructOffsets(v["size"], v["members"]) for k, v in offsets.items()},
        cpus=tuple(CpuNote(c["cpu"], c["pid"], c["mode"], c["sysregs"] or {}, c["normalised"]) for c in note["cpus"]),
        stacks=tuple(StackNote(s["kind"], s["low"], s["high"], s["cpu"], s["pid"], s["task"]) for s in note["stacks"]),
        blocked=tuple(BlockedContext(t["pid"], t["context"]) for t in note["tasks"]
                      if t["cpu"] is None and t["context"] is not None),
    )


def _module(m: Note) -> ModuleInfo:
    orc = m["orc"]
    return ModuleInfo(m["name"], m["addr"], m["state"],
                      tuple(ModuleRegion(r["kind"], r["base"], r["size"]) for r in m["regions"]),
                      tuple((a, n) for a, n in m["symbols"]),
                      None if orc is None else ModuleOrc(orc["orc_unwind_ip"], orc["orc_unwind"], orc["num_orcs"],
                                                          orc["entry_size"]))


def note_keys(info: DumpInfo) -> dict[str, Any]:
    """The note's ``modules``, ``bpf_symbols``, ``symbols`` and (when known) ``ftrace_trampolines`` of ``info``."""
    out: dict[str, Any] = {
        "modules": [module_json(m) for m in info.modules],
        "bpf_symbols": [bpf_json(b) for b in info.bpf_symbols],
        "symbols": {n: f"{a:#x}" for n, a in info.symbols.items()},
    }
    if info.ftrace_trampolines is not None:
        out["ftrace_trampolines"] = [trampoline_json(t) for t in info.ftrace_trampolines]
    return out


def module_json(m: ModuleInfo) -> dict[str, Any]:
    """The ``modules[]`` entry of ``m``."""
    out: dict[str, Any] = {"name": m.name, "addr": _hex(m.addr), "state": m.state,
                           "regions": [{"kind": r.kind, "base": f"{r.base:#x}", "size": r.size} for r in m.regions],
                           "symbols": [[f"{a:#x}", n] for a, n in m.symbols]}
    if m.orc is not None:
        out["orc"] = {"orc_unwind_ip": f"{m.orc.orc_unwind_ip:#x}", "orc_unwind": f"{m.orc.orc_unwind:#x}",
                      "num_orcs": m.orc.num_orcs, "entry_size": m.orc.entry_size}
    return out


def bpf_json(b: BpfSymbol) -> list[str]:
    """The ``bpf_symbols[]`` entry of ``b``."""
    return [f"{b.start:#x}", f"{b.end:#x}", b.name]


def trampoline_json(t: FtraceTrampoline) -> dict[str, Any]:
    """The ``ftrace_trampolines[]`` entry of ``t``."""
    return {"ops": _hex(t.ops), "addr": f"{t.addr:#x}", "size": t.size, "save_regs": t.save_regs}


def _hex(v: int | None) -> str | None:
    return None if v is None else f"{v:#x}"
