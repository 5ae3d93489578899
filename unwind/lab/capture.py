"""Capture dumps of a stopped kernel through a GDB stub (see ``unwind capture``).

Per stop (:meth:`.guest.CaptureSession.capture_stop`): every CPU's registers
(trap-entry stops normalised by the arch's ``lab`` module), each running task
with its task stack and its CPU's typed per-CPU stacks, every blocked task with
its saved context and task stack trimmed to ``[sp, top)``, the function-graph
return stack and kretprobe/rethook instances per task, the loaded modules
(regions, kallsyms, x86-64 ORC tables), and VMCOREINFO read from guest
memory. Layouts come from the vmlinux's BTF; symbols from its ``.symtab``.
This module plans the stops, takes them, and writes each as a dump, with
QEMU's vmcores of the same stop and gdb's traces when asked.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from .console_oracles import FtraceStacktrace, SysrqOracle
from .guest import CaptureError, CaptureSession, GuestImage, arch_lab
from .oracles import SystemMap, gdb_backtraces, parse_ftrace_stack, parse_regs_backtrace, parse_task_traces
from .rsp import RspClient


#: ``--vmcore`` format -> (HMP ``dump-guest-memory`` flag, file suffix). QEMU 7.2 writes its kdump
#: formats flattened (makedumpfile -F layout; ``makedumpfile -R`` reassembles them).
VMCORE_FORMATS: dict[str, tuple[str, str]] = {
    "elf": ("", ".elf"),
    "paging": ("-p", ".paging.elf"),
    "kdump-zlib": ("-z", ".kdump-zlib.flat"),
    "kdump-lzo": ("-l", ".kdump-lzo.flat"),
    "kdump-snappy": ("-s", ".kdump-snappy.flat"),
}
#: QEMU fills the ``-p`` PT_LOADs from guest page tables only on x86 (qapi/dump.json)
PAGING_ARCHES = ("x86_64",)


def parse_vmcore_formats(spec: str, arch: str) -> list[str]:
    """The formats named in a ``--vmcore`` list (``elf,kdump-zlib``); CaptureError on unknown ones."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in VMCORE_FORMATS]
    if bad:
        raise CaptureError(f"unknown vmcore format {bad[0]!r}; expected some of {', '.join(VMCORE_FORMATS)}")
    if "paging" in names and arch not in PAGING_ARCHES:
        raise CaptureError(f"QEMU writes paging (-p) vmcores only for {', '.join(PAGING_ARCHES)}, not {arch}")
    return names


def write_qemu_vmcores(monitor, dump_path: Path, formats: list[str],
                       log: Callable[[str], None] | None = None) -> list[str]:
    """Have QEMU write each of ``formats`` of the current stop beside ``dump_path``; returns file names.

    The guest must still be halted at the stop that ``dump_path`` holds: HMP
    ``dump-guest-memory`` (synchronous without ``-d``) copies guest RAM and the
    vCPUs' registers as they are now. ``monitor`` is a :class:`~.monitor.Monitor`.
    """
    base = dump_path.resolve()
    stem = base.name.split(".")[0]
    names = []
    for fmt in formats:
        flag, suffix = VMCORE_FORMATS[fmt]
        out = base.with_name(stem + suffix)
        out.unlink(missing_ok=True)
        t0 = time.monotonic()
        reply = monitor.cmd(f"dump-guest-memory {flag} {out}".replace("  ", " "))
        if not out.exists() or out.stat().st_size == 0:
            raise CaptureError(f"QEMU wrote no {out.name}: {reply.splitlines()[0] if reply else 'no reply'}")
        if log is not None:
            log(f"[capture] {fmt}: {out.name} ({out.stat().st_size >> 20} MiB, {time.monotonic() - t0:.1f}s)"
                + (f"; QEMU: {reply.splitlines()[0]}" if reply else ""))
        names.append(out.name)
    return names




@dataclass
class Plan:
    """What to stop on: ``random`` stops and breakpoint stops (``(kind, symbol)``)."""

    stops: int
    breaks: list[tuple[str, str]]
    random_share: int = 2  # random stops per round of breakpoint stops
    delay: tuple[float, float] = (0.05, 1.5)
    break_timeout: float = 15.0
    sysrq_l: int = 0  # stops where sysrq-l prints a running CPU's trace, appended at the end
    ftrace: int = 0  # stops where an ftrace stacktrace trigger fires (FtraceStacktrace), appended at the end

    def kinds(self) -> list[tuple[str, str | None]]:
        """The sequence of stops: random ones interleaved with the breakpoints in turn."""
        seq: list[tuple[str, str | None]] = []
        bi = 0
        while len(seq) < self.stops:
            for _ in range(self.random_share if self.breaks else self.stops):
                if len(seq) < self.stops:
                    seq.append(("random", None))
            if self.breaks and len(seq) < self.stops:
                seq.append(self.breaks[bi % len(self.breaks)])
                bi += 1
        return seq + [("sysrq-l", None)] * self.sysrq_l + [("ftrace", None)] * self.ftrace


def default_breaks(lab: ModuleType, img: GuestImage) -> list[tuple[str, str]]:
    """IRQ-context, syscall-entry and hijack-live breakpoints known for the arch (present ones)."""
    out = []
    for kind, names in (("irq", lab.IRQ_BREAKS), ("syscall-entry", lab.SYSCALL_ENTRY),
                        ("hijack", lab.HIJACK_BREAKS)):
        out += [(kind, n) for n in names if img.get(n)]
    return out

def run_capture(s: CaptureSession, plan: Plan, out: Path, release: str, qemu: str = "",
                sysrq: SysrqOracle | None = None, sysrq_every: int = 1,
                suffix: str = ".bin.xz", seed: int | None = None, monitor=None,
                ftrace: FtraceStacktrace | None = None, first: int = 0,
                vmcore_monitor=None, vmcore_formats: list[str] | None = None) -> list[Path]:
    """Take ``plan.stops`` stops into ``out``; returns the dumps written.

    Each dump is written as soon as its stop is done, so a guest that dies
    mid-run loses only the stop in progress. Random stops are requested with
    the stub's ``^C``, or with HMP ``stop`` when a ``monitor`` is given.
    With ``vmcore_formats``, QEMU writes those vmcores of each stop (through
    the HMP ``vmcore_monitor``) beside the dump before the guest runs again.
    """
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    written = skipped = 0
    paths: list[Path] = []
    t_start = time.monotonic()
    seq = plan.kinds()
    i = 0
    attempts = 0
    while i < len(seq) and attempts < len(seq) * 6:
        attempts += 1
        kind, sym = seq[i]
        hit = None
        if kind == "sysrq-l":
            if sysrq is None:
                i += 1
                continue
            got = sysrq.regs_printer_stop(s, plan.break_timeout)
            if isinstance(got, str):
                s.log(f"[capture] sysrq-l: skipped ({got})")
                skipped += 1
                i += 1
                continue
            res, reply, label = got
        elif kind == "ftrace":
            got = ftrace.stop(s, plan.break_timeout) if ftrace is not None else "no console"
            if isinstance(got, str):
                s.log(f"[capture] ftrace: skipped ({got})")
                skipped += 1
                continue
            res, reply, label = got
        elif kind == "random":
            s.rsp.cont()
            time.sleep(rng.uniform(*plan.delay))
            reply = None
            if monitor is not None:  # HMP stop: the stub then reports the stop itself
                monitor.cmd("stop")
                reply = s.rsp.wait_stop(5.0)
            if reply is None:
                reply = s.rsp.halt()
            label = "random"
        else:
            addr = s.img.addr(sym)
            s.rsp.breakpoint(addr, s.lab.BREAK_KIND)
            s.rsp.cont()
            reply = s.rsp.wait_stop(plan.break_timeout)
            if reply is None:
                s.rsp.halt()
            s.rsp.breakpoint(addr, s.lab.BREAK_KIND, insert=False)
            if reply is None:
                s.log(f"[capture] {kind} {sym}: no hit in {plan.break_timeout:.0f}s, skipped")
                skipped += 1
                i += 1
                continue
            hit = RspClient.stop_thread(reply)
            label = f"{kind}:{sym}"
        if kind not in ("sysrq-l", "ftrace"):
            res = s.capture_stop(label, hit)
        if isinstance(res, str):
            skipped += 1
            s.log(f"[capture] {label}: skipped ({res})")
            continue
        extra: dict[str, Any] = {"qemu": qemu, "stop_reply": reply.decode(errors="replace")}
        path = out / f"stop-{first + written:03d}-{label.replace(':', '-')}{suffix}"
        if vmcore_formats:
            extra["vmcores"] = write_qemu_vmcores(vmcore_monitor, path, vmcore_formats, s.log)
        oracles: list[dict] = res.meta.pop("pending_oracles", [])
        notes = []
        if sysrq is not None and (written % max(1, sysrq_every) == 0):
            try:
                ents, note = sysrq.collect(s, res)
                oracles += ents
                notes.append(note)
            except TimeoutError as e:
                notes.append(f"sysrq-t: {e}")
        res.meta["oracles"] = [o for o in oracles if not o.get("stale")]
        res.meta["oracles_excluded"] = [o for o in oracles if o.get("stale")]
        extra["notes"] = "; ".join(notes) if notes else None
        s.write_dump(res, path, release, extra)
        paths.append(path)
        written += 1
        i += 1
        nblocked = sum(1 for t in res.meta["tasks"] if t["cpu"] is None)
        size = sum(len(v) for v in res.memory.values())
        s.log(f"[capture] {written}/{len(seq)} {label}: {len(res.cpus)} cpus "
              f"({','.join(c.mode for c in res.cpus)}), {nblocked} blocked, {size // 1024} KiB, "
              f"{res.seconds:.2f}s" + (f"; {notes[0]}" if notes else "") + f" -> {path.name}")
    s.log(f"[capture] {written} dumps, {skipped} skipped, {time.monotonic() - t_start:.1f}s")
    return paths


def add_gdb_oracles(paths: list[Path], vmlinux: str | Path, log=None) -> int:
    """Store gdb-multiarch's ``bt`` per CPU in each dump (one gdb run for all); returns traces added."""
    import tempfile

    from unwind.formats.dump import Dump, DumpWriter

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    dumps = [Dump.open(p) for p in paths]
    if not dumps:
        return 0
    lab = arch_lab(dumps[0].arch)
    syms = dumps[0].meta.get("symbols", {})
    text = (int(syms.get("_stext", "0"), 0), int(syms.get("_etext", "0"), 0))
    fix = getattr(lab, "gdb_fixup", None)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        cores = []
        for i, dump in enumerate(dumps):
            w = DumpWriter(dump.arch)
            segs = {seg.start: seg.data for seg in dump.memory.segments}
            cpus = [(c.cpu, dict(c.regs)) for c in dump.cpus]
            if fix is not None:
                segs, cpus = fix(segs, cpus, dump.vmcoreinfo, text)
            for a, data in segs.items():
                w.add_memory(a, data)
            for cpu, regs in cpus:
                w.add_cpu(cpu, regs)
            core = Path(d) / f"core{i}"
            w.write(core)
            cores.append(core)
        found = gdb_backtraces(vmlinux, cores, lab.GDB_ARCH, text)
    added = 0
    for p, dump, core in zip(paths, dumps, cores):
        ents = found.get(str(core), [])
        meta = dict(dump.meta)
        meta["oracles"] = [o for o in meta.get("oracles", []) if o.get("source") != "gdb"] + ents
        rewrite_dump(dump, p, meta)
        added += len(ents)
    log(f"[capture] gdb bt: {added} traces for {len(paths)} dumps in {time.monotonic() - t0:.1f}s")
    return added


def rewrite_dump(dump, path: Path, meta: dict[str, Any]) -> None:
    """Write ``dump`` back to ``path`` with a new JSON note."""
    from unwind.formats.dump import DumpWriter

    w = DumpWriter(dump.arch)
    for seg in dump.memory.segments:
        w.add_memory(seg.start, seg.data)
    for c in dump.cpus:
        w.add_cpu(c.cpu, c.regs, c.pid)
    w.vmcoreinfo = dump.vmcoreinfo_text
    w.meta = meta
    w.write(path)


def reparse_oracles(paths: list[Path], system_map: str | Path) -> int:
    """Re-derive the frames of stored sysrq-t/sysrq-l oracles from their raw text; returns changes."""
    from unwind.formats.dump import Dump

    smap = SystemMap(system_map)
    changed = 0
    for p in paths:
        dump = Dump.open(p)
        meta = dict(dump.meta)
        every = meta.get("oracles", []) + meta.get("oracles_excluded", [])
        for o in every:
            before = (o.get("frames"), o.get("stale"))
            if o.get("source") == "sysrq-t":
                (t, *_) = parse_task_traces(o["text"], smap) or [None]
                if t is None:
                    continue
                o["frames"], o["unreliable"] = t.frames, t.unreliable
                o.pop("pt_regs", None)
                if t.pt_regs:
                    o["pt_regs"] = t.pt_regs
                parse_bad = o.get("stale") and not o.get("why", "").startswith(("ran between", "not a blocked"))
                if t.corrupt:
                    o["stale"], o["why"] = True, t.corrupt
                elif parse_bad:
                    o.pop("stale", None)
                    o.pop("why", None)
            elif o.get("source") == "sysrq-l":
                for k in ("pt_regs", "stale", "why"):
                    o.pop(k, None)
                o.update(parse_regs_backtrace("NMI backtrace for cpu %d\n" % o["cpu"] + o["text"], o["cpu"], smap))
            elif o.get("source") == "ftrace-stacktrace":
                blocks = parse_ftrace_stack(o["text"], smap)
                if not blocks:
                    continue
                b = blocks[0]
                o["frames"] = b["frames"]
                o.pop("stale", None)
                o.pop("why", None)
                if b.get("stale"):
                    o["stale"], o["why"] = True, b["why"]
            changed += before != (o.get("frames"), o.get("stale"))
        meta["oracles"] = [o for o in every if not o.get("stale")]
        meta["oracles_excluded"] = [o for o in every if o.get("stale")]
        rewrite_dump(dump, Path(p), meta)
    return changed
