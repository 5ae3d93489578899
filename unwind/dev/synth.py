"""Synthetic dumps whose correct trace is known by construction.

The builder lays out stacks word by word, registers and saved contexts, and
writes a real dump through :class:`~unwind.formats.dump.DumpWriter`, so tests go
through the same reader as real captures. Arch packages add their scenario
helpers (frame-record chains, pt_regs, ORC tables) on top of it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from unwind.formats.dump import Dump, DumpWriter
from unwind.core.registry import ArchBackend
from unwind.session.replay import Session
from unwind.kernel.symbols import SymbolTable


@dataclass
class SynthStack:
    """A stack ``[low, low + size)`` being filled in; unwritten words are zero."""

    low: int
    size: int
    kind: str
    cpu: int | None = None
    pid: int | None = None
    captured: bool = True
    data: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        if not self.data:
            self.data = bytearray(self.size)

    @property
    def high(self) -> int:
        """First address past the stack."""
        return self.low + self.size

    def put(self, addr: int, *values: int) -> int:
        """Write consecutive 64-bit words from ``addr``; return the address past them."""
        for v in values:
            if not self.low <= addr <= self.high - 8:
                raise ValueError(f"{addr:#x} is outside the {self.kind} stack")
            struct.pack_into("<Q", self.data, addr - self.low, v & (2**64 - 1))
            addr += 8
        return addr

    def put_bytes(self, addr: int, raw: bytes) -> None:
        """Write raw bytes at ``addr``."""
        self.data[addr - self.low:addr - self.low + len(raw)] = raw


def _h(v: int) -> str:
    return hex(v)


class SynthDump:
    """Build a dump from stacks, tasks and CPUs; open it again as a :class:`Session`."""

    def __init__(self, arch: str | ArchBackend, release: str = "6.12.0-synthetic") -> None:
        self.writer = DumpWriter(arch)
        self.stacks: list[SynthStack] = []
        self.tasks: list[dict[str, Any]] = []
        self.cpus: list[dict[str, Any]] = []
        self.symbol_hints: dict[str, str] = {}
        self.release = release
        self.vmcoreinfo: dict[str, str] = {"OSRELEASE": release, "PAGESIZE": "4096"}
        self.build_id = "00" * 20
        self.oracles: list[dict[str, Any]] = []
        self.extra_meta: dict[str, Any] = {}

    def stack(self, kind: str, low: int, size: int, *, cpu: int | None = None,
              pid: int | None = None, capture: bool = True) -> SynthStack:
        """Declare a stack range; with ``capture`` its bytes go into the dump."""
        s = SynthStack(low, size, kind, cpu, pid, capture)
        self.stacks.append(s)
        return s

    def memory(self, addr: int, data: bytes) -> None:
        """Capture arbitrary memory (text, data structures)."""
        self.writer.add_memory(addr, data)

    def blocked_task(self, pid: int, comm: str, context: dict[str, int], **extra: Any) -> None:
        """A task that is not running: it unwinds from its saved context."""
        self.tasks.append({"pid": pid, "comm": comm, "state": "S", "cpu": None,
                           "context": {k: _h(v) for k, v in context.items()}, **_encode(extra)})

    def running_task(self, pid: int, comm: str, cpu: int, regs: dict[str, int], **extra: Any) -> None:
        """A task running on ``cpu`` with these registers."""
        self.tasks.append({"pid": pid, "comm": comm, "state": "R", "cpu": cpu, **_encode(extra)})
        self.cpus.append({"cpu": cpu, "pid": pid, "mode": extra.pop("mode", "kernel")})
        self.writer.add_cpu(cpu, regs, pid)

    def to_bytes(self) -> bytes:
        """The dump file's bytes."""
        stacks_meta = []
        for s in self.stacks:
            stacks_meta.append({"kind": s.kind, "low": _h(s.low), "high": _h(s.high), "cpu": s.cpu, "pid": s.pid})
            if s.captured:
                self.writer.add_memory(s.low, bytes(s.data))
        self.writer.vmcoreinfo = "".join(f"{k}={v}\n" for k, v in self.vmcoreinfo.items())
        self.writer.meta.update({
            "kernel": {"release": self.release}, "build_id": self.build_id,
            "capture": {"tool": "unwind.dev.synth"}, "cpus": self.cpus, "stacks": stacks_meta,
            "tasks": self.tasks, "symbols": self.symbol_hints, "oracles": self.oracles,
            **self.extra_meta,
        })
        return self.writer.to_bytes()

    def dump(self) -> Dump:
        """Write and read back the dump."""
        return Dump(self.to_bytes(), "<synthetic>")

    def session(self, symbols: list[tuple[int, str]] | None = None) -> Session:
        """A replay session over the dump, with ``(addr, name)`` text symbols."""
        table = SymbolTable((a, "T", n) for a, n in symbols) if symbols else None
        return Session(self.dump(), None, table)


def _encode(extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(extra)
    out.pop("mode", None)
    for key in ("fgraph", "kretprobes"):
        if key in out:
            out[key] = [{k: _h(v) for k, v in e.items()} for e in out[key]]
    if "user_regs" in out:
        out["user_regs"] = {k: _h(v) for k, v in out["user_regs"].items()}
    return out
