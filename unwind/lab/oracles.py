"""Independent traces stored with each dump: the kernel's own output, and gdb's.

- ``sysrq-t``: the console text of ``echo t > /proc/sysrq-trigger``, split per
  task; ``sym+off/size`` resolved to addresses with System.map (kallsyms and
  DWARF disagree on names, addresses do not).
- ``sysrq-l``: the ``NMI backtrace for cpu N`` block printed from a running CPU's pt_regs.
- ``ftrace-stacktrace``: the ``<stack trace>`` block an ftrace ``stacktrace`` event trigger stored
  in one CPU's ring buffer (``per_cpu/cpuN/trace`` with ``sym-offset`` and ``sym-addr``).
- ``gdb``: ``bt`` of gdb-multiarch on a written dump, inline frames dropped.
"""

from __future__ import annotations

import bisect
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from unwind.formats.console import BlockKind, PrintedFrame, PrintedTrace, RegsPc, parse_traces

from .fetch import cache_dir


class SystemMap:
    """Name -> addresses, with kallsyms-style sizes (distance to the next symbol)."""

    def __init__(self, path: str | Path) -> None:
        self.by_name: dict[str, list[int]] = {}
        addrs: set[int] = set()
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                a = int(parts[0], 16)
                self.by_name.setdefault(parts[2], []).append(a)
                addrs.add(a)
        self._sorted = sorted(addrs)

    def size_at(self, addr: int) -> int:
        """Distance from ``addr`` to the next higher symbol."""
        i = bisect.bisect_right(self._sorted, addr)
        return self._sorted[i] - addr if i < len(self._sorted) else 0

    def resolve(self, sym: str, off: int, size: int) -> int | None:
        """Address of ``sym+off`` (the candidate whose kallsyms size is ``size`` when ambiguous)."""
        cands = self.by_name.get(sym)
        if not cands:
            return None
        if len(cands) > 1:
            exact = [a for a in cands if self.size_at(a) == size]
            cands = exact or cands
        return cands[0] + off


def _resolve_frame(fr: PrintedFrame, smap: SystemMap | None) -> tuple[str, str | None]:
    """(address or ``sym+off``, damage note) of one printed frame.

    riscv's ``[<addr>] sym+off/size`` and bare addresses (code without a symbol, e.g. ftrace
    trampolines) carry the address; ``sym+off/size`` is resolved with System.map (not a module's).
    """
    sym = fr.symbol
    if fr.address is not None or sym is None:
        assert fr.address is not None
        return f"{fr.address:#x}", None
    damage = None
    addr = None
    if smap is not None and sym.module is None:
        addr = smap.resolve(sym.name, sym.offset, sym.size)
        if addr is not None and (sym.offset > sym.size or smap.size_at(addr - sym.offset) != sym.size):
            damage = f"{fr.text.strip()} disagrees with System.map"
    return (f"{addr:#x}" if addr is not None else f"{sym.name}+{sym.offset:#x}"), damage


def _resolve_rip(rip: RegsPc, smap: SystemMap | None) -> str | None:
    """The pc of an x86 ``RIP: 0010:sym+off/size`` line printed where a trace crosses pt_regs."""
    if smap is None:
        return None
    a = smap.resolve(rip.symbol.name, rip.symbol.offset, rip.symbol.size)
    return f"{a:#x}" if a is not None else None


@dataclass
class TaskTrace:
    """One task's block of a sysrq-t (or similar) dump, its frames resolved to addresses."""

    pid: int
    comm: str
    state: str
    frames: list[str] = field(default_factory=list)
    unreliable: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    corrupt: str | None = None
    pt_regs: list[dict] = field(default_factory=list)


def _resolved(block: PrintedTrace, smap: SystemMap | None, damaged: bool) -> TaskTrace:
    """``block`` with its frames and ``RIP:`` crossings resolved; ``damaged``: its damaged lines mark it."""
    t = TaskTrace(block.pid if block.pid is not None else -1, block.comm or "", block.state or "")
    if damaged and block.damaged:
        t.corrupt = f"damaged line {block.damaged[0][1]!r}"
    for fr in block.frames:
        txt, damage = _resolve_frame(fr, smap)
        t.corrupt = t.corrupt or damage
        (t.unreliable if fr.guess else t.frames).append(txt)
    for rip in block.regs_pcs:
        pc = _resolve_rip(rip, smap)
        if pc:
            t.pt_regs.append({"after": rip.after, "pc": pc})
    return t


def parse_task_traces(text: str, smap: SystemMap | None) -> list[TaskTrace]:
    """Split console ``text`` into per-task traces (``task:... pid:N`` blocks, :mod:`unwind.formats.console`).

    Lines that look like a damaged frame (serial consoles drop and repeat bytes) and frames whose
    offset or size disagree with System.map mark the block ``corrupt`` instead of ending it early.
    """
    out = []
    for block in parse_traces(text):
        if block.kind is BlockKind.TASK:
            t = _resolved(block, smap, damaged=True)
            t.lines = [line for line in block.lines if line.strip()]
            out.append(t)
    return out


def sysrq_oracles(text: str, smap: SystemMap | None) -> list[dict]:
    """Oracle entries (JSON note schema) for every task block of a sysrq-t dump."""
    out = []
    for t in parse_task_traces(text, smap):
        e = {"source": "sysrq-t", "pid": t.pid, "cpu": None, "comm": t.comm, "state": t.state,
             "frames": t.frames, "unreliable": t.unreliable, "text": "\n".join(t.lines)}
        if t.pt_regs:
            e["pt_regs"] = t.pt_regs
        bad = [f for f in t.frames if not f.startswith("0x")]
        if bad or t.corrupt:
            e["stale"] = True
            e["why"] = t.corrupt or f"unresolved frame {bad[0]}"
        out.append(e)
    return out


def parse_regs_backtrace(text: str, cpu: int, smap: SystemMap | None) -> dict:
    """The ``NMI backtrace for cpu N`` block of sysrq-l: reliable frames, pt_regs crossings, raw lines.

    The trace starts after the interrupted pc (printed as ``pc :``/``epc :``/``RIP:``), so
    ``frames`` hold what the kernel printed as trace lines only.
    """
    block = next((b for b in parse_traces(text) if b.kind is BlockKind.NMI and b.cpu == cpu), None)
    t = _resolved(block, smap, damaged=False) if block is not None else TaskTrace(-1, "", "")
    out: dict = {"frames": t.frames, "unreliable": t.unreliable, "text": "\n".join(block.lines if block else [])}
    if t.pt_regs:
        out["pt_regs"] = t.pt_regs
    if t.corrupt:
        out["stale"], out["why"] = True, t.corrupt
    return out


_FT_STACK = re.compile(r"^\s*=> (?:(?P<sym>[A-Za-z_.$][\w.$]*)\+0x(?P<off>[0-9a-f]+)/0x(?P<size>[0-9a-f]+)"
                       r"(?:\s+\[(?P<mod>[\w-]+)\])?|0x[0-9a-f]+|\[FTRACE TRAMPOLINE\])(?:\s+<(?P<addr>[0-9a-f]+)>)?\s*$")


def parse_ftrace_stack(text: str, smap: SystemMap | None) -> list[dict]:
    """Every ``<stack trace>`` block of an ftrace trace file, as oracle fields.

    The lines are `` => sym+off/size <addr>`` (options ``sym-offset`` and ``sym-addr``): the
    address is the frame; ``sym+off/size`` is checked against System.map and a disagreement
    (a damaged console line) marks the block stale. ``[FTRACE TRAMPOLINE]`` and a line without an
    address also make it stale: there is no pc to compare. Each entry holds the block's header line
    (task-pid, CPU, flags, timestamp) and lines as ``text``.
    """
    out: list[dict] = []
    cur: dict | None = None
    for raw in text.replace("\r", "").split("\n"):
        line = raw.rstrip()
        if line.endswith("<stack trace>"):
            m = re.search(r"\[(\d+)\]", line)
            cur = {"frames": [], "text": [line], "cpu": int(m.group(1)) if m else None}
            out.append(cur)
            continue
        if cur is None:
            continue
        if not line.lstrip().startswith("=>"):
            cur = None
            continue
        cur["text"].append(line)
        f = _FT_STACK.match(line)
        if f is None or f.group("addr") is None:
            cur.setdefault("why", f"no address in {line.strip()!r}")
            continue
        addr = int(f.group("addr"), 16)
        cur["frames"].append(f"{addr:#x}")
        if f.group("sym") and smap is not None and not f.group("mod"):
            want = smap.resolve(f.group("sym"), int(f.group("off"), 16), int(f.group("size"), 16))
            if want != addr:
                cur.setdefault("why", f"{line.strip()} disagrees with System.map")
    for e in out:
        e["text"] = "\n".join(e["text"])
        if "why" in e:
            e["stale"] = True
    return out


_GDB_SCRIPT = """
import gdb, sys
cores = sys.argv_cores
lo, hi = {lo}, {hi}
for core in cores:
    try:
        gdb.execute("core-file " + core, to_string=True)
    except gdb.error as e:
        print("UNWIND-ERR", core, str(e).splitlines()[0])
        continue
    for th in gdb.selected_inferior().threads():
        th.switch()
        pcs = []
        try:
            f = gdb.newest_frame()
            while f is not None and len(pcs) < 64:
                if f.type() != gdb.INLINE_FRAME:
                    if not lo <= f.pc() < hi:
                        break
                    pcs.append(f.pc())
                f = f.older()
        except gdb.error:
            pass
        print("UNWIND-BT", core, th.ptid[1], " ".join(hex(p) for p in pcs))
"""


def gdb_backtraces(vmlinux: str | Path, cores: list[Path], gdb_arch: str, text: tuple[int, int],
                   timeout: float = 900.0, gdb: str = "gdb-multiarch") -> dict[str, list[dict]]:
    """``bt`` of every thread of every core with one gdb process, as oracle entries per core.

    Inline frames are dropped and each trace stops at the first pc outside
    kernel text (gdb runs on past the end of a C stack segment).
    """
    script = Path(cores[0]).parent / "unwind-gdb-bt.py"
    script.write_text(("import sys\nsys.argv_cores = %r\n" % [str(c) for c in cores])
                      + _GDB_SCRIPT.format(lo=text[0], hi=text[1]))
    try:
        index = Path(cache_dir()) / "gdb-index"  # cuts a cold vmlinux load from minutes to seconds
        index.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([gdb, "-q", "-batch", "-nx", "-iex", f"set index-cache directory {index}",
                            "-iex", "set index-cache enabled on", "-ex", f"set architecture {gdb_arch}",
                            "-ex", f"file {vmlinux}", "-x", str(script)],
                           capture_output=True, text=True, timeout=timeout)
    finally:
        script.unlink(missing_ok=True)
    out: dict[str, list[dict]] = {str(c): [] for c in cores}
    for line in r.stdout.splitlines():
        if line.startswith("UNWIND-BT"):
            parts = line.split()
            out[parts[1]].append({"source": "gdb", "pid": None, "cpu": int(parts[2]) - 1,
                                  "frames": parts[3:],
                                  "text": "gdb-multiarch bt on this dump (inline frames dropped, "
                                          "cut at the first pc outside kernel text)"})
    return out
