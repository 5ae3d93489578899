"""gdb's ``bt`` on a lab guest, with and without unwind's unwinder, against the kernel's own trace of the
same stop.

A stop is an ftrace ``stacktrace:1`` trigger caught as it fires (the lab's ftrace oracle,
:class:`~.console_oracles.FtraceStacktrace`): gdb-multiarch, started by ``unwind gdb`` on the guest's
gdbstub, puts a hardware breakpoint on ``stacktrace_trigger``, the trigger is armed on the console, and
the first CPU to run it stops there. gdb walks that CPU twice (``disable unwinder`` / ``enable
unwinder``; ``frame N`` and ``$pc`` for each level but inline ones: :func:`frame_pcs`), then detaches; the guest runs on, the trigger saves the
kernel's walk of the same state, and the console prints it.

Two events, in the lab guest's workloads (``unwind lab boot``):

- ``irq``: ``timer/hrtimer_expire_entry``, inside the timer interrupt handler;
- ``hijack``: a kprobe event on ``read_zero`` (the ``dd if=/dev/zero`` loop), called by ``vfs_read``,
  which function_graph traces (its return is ``return_to_handler``'s), under ``ksys_read``, which the
  lab's kretprobe hijacks (``__kretprobe_trampoline`` or the rethook trampoline).

The kernel's walk skips its own top frames (``STACK_SKIP``): both of gdb's walks are compared from the
oracle's first pc on (:func:`matched`).

A probe the guest refuses, or a trigger that does not fire in time, is reported as such (the stop's
``refused``), not waited on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .console_oracles import FTRACE_INSTANCE, FTRACE_TRIGGER_FN
from .monitor import Console
from .oracles import SystemMap, parse_ftrace_stack

#: where the gdb script prints its findings (one JSON line)
_MARK = "@@unwind-gdbcompare "
_U64 = (1 << 64) - 1
#: the name the unwinder is registered under (``info unwinder``)
_UNWINDER = "unwind-kernel"
#: the script gdb runs: stop at the trigger, walk the CPU without and with the unwinder, detach
_GDB_SCRIPT = '''
import json, gdb
from unwind.lab.gdbcompare import frame_pcs
def pcs():
    return frame_pcs(gdb)
gdb.execute("target remote {gdbstub}")
gdb.execute("hbreak *{trigger:#x}")
print("{mark}" + json.dumps({{"ready": True}}), flush=True)
gdb.execute("continue")
thread = gdb.selected_thread()
cpu = (thread.ptid[1] or thread.num) - 1
pc = int(gdb.parse_and_eval("$pc")) & (2**64 - 1)
gdb.execute("disable unwinder global {unwinder}", to_string=True)
gdb.invalidate_cached_frames()
without = pcs()
gdb.execute("enable unwinder global {unwinder}", to_string=True)
gdb.invalidate_cached_frames()
with_unwind = pcs()
gdb.execute("delete")
print("{mark}" + json.dumps({{"cpu": cpu, "pc": pc, "without": without, "with": with_unwind}}), flush=True)
gdb.execute("detach")
'''


#: the frames of a ``bt`` taken, at most
_MAX_LEVELS = 200


def frame_pcs(gdb: Any, limit: int = _MAX_LEVELS) -> list[int]:
    """The pc of each frame gdb's ``bt`` shows for the selected thread, inline frames left out: frame by
    frame (``frame N``, as ``bt`` goes: a Python ``Frame`` of the last one would ask for the one after it).

    An inline frame (``gdb.INLINE_FRAME``) has the pc of the frame it is inlined in, which follows it; the
    walk has one frame for both. Two real frames with the same pc are both kept: the kernel's walk prints
    a hijacked return it does not recover (``return_to_handler+0x0``) once per hijacked frame.
    """
    out = []
    for level in range(limit):
        try:
            gdb.execute(f"frame {level}", to_string=True)
            if gdb.selected_frame().type() == gdb.INLINE_FRAME:
                continue
            out.append(int(gdb.parse_and_eval("$pc")) & _U64)
        except gdb.error:
            break
    return out


@dataclass(frozen=True)
class Event:
    """An ftrace event the trigger is put on: its ``events/`` path, the probe that makes it (if any) and
    a filter no record passes (the trigger still fires: only its stack trace lands in the buffer)."""

    name: str
    path: str
    probe: str | None
    never: str
    #: the trigger's own filter (``stacktrace:1 if ...``): the records it fires on
    when: str | None = None

    @property
    def trigger(self) -> str:
        """What is written to the event's ``trigger`` file to arm it."""
        return "stacktrace:1" + (f" if {self.when}" if self.when else "")


EVENTS = (
    Event("irq", "timer/hrtimer_expire_entry", None, "now < 0"),
    Event("hijack", "kprobes/unwind_read_zero", "p:unwind_read_zero read_zero", "common_pid < 0"),
)
#: riscv v6.12 takes a kernel ebreak, a kprobe's, as an NMI (do_trap_break(): irqentry_nmi_enter()), and
#: its ring buffer reserves nothing in NMI context (no ARCH_HAVE_NMI_SAFE_CMPXCHG:
#: rb_reserve_next_event()), so a kprobe event's stacktrace trigger records nothing; it has no fprobe
#: events (FPROBE needs DYNAMIC_FTRACE_WITH_REGS) and no kretprobe on an ftrace-able function. Its hijack
#: stop is dd's runtime accounted (sched_stat_runtime, from update_curr()): as dd is switched out at
#: read_zero()'s cond_resched(), under the function_graph-traced vfs_read, or at a tick.
RISCV_HIJACK = Event("hijack", "sched/sched_stat_runtime", None, "common_pid < 0", 'comm == "dd"')
ARCH_EVENTS = {"riscv": (EVENTS[0], RISCV_HIJACK)}


def events_for(arch: str) -> tuple[Event, ...]:
    """The stops taken on ``arch``."""
    return ARCH_EVENTS.get(arch, EVENTS)

#: where a probe on a function goes, past its start, per arch. riscv v6.12 has no HAVE_KPROBES_ON_FTRACE
#: (arch/riscv/Kconfig), and a function's start is its ftrace patch site (-fpatchable-function-entry, the
#: MCOUNT_INSN_SIZE = 8 bytes of nops, arch/riscv/include/asm/ftrace.h): check_ftrace_location()
#: (kernel/kprobes.c) refuses a kprobe there with -EINVAL ("Failed to register probe event"). The first
#: instruction after the nops is an ordinary (ebreak) kprobe.
PROBE_OFFSET = {"riscv": 8}
#: seconds a stop may take from arming the trigger to gdb's report
STOP_TIMEOUT = 300.0


def probe_definition(probe: str, arch: str) -> str:
    """``probe`` (``p:NAME SYMBOL``) at the offset :data:`PROBE_OFFSET` gives for ``arch``."""
    offset = PROBE_OFFSET.get(arch, 0)
    return f"{probe}+{offset}" if offset else probe


#: what :meth:`GdbCompare.prepare` prints when the guest refused the probe (then its error_log's error)
_REFUSED = "UNWIND-GC-REFUSED"


def probe_refusal(text: str) -> str | None:
    """The guest's reason (its tracing ``error_log`` line) when the shell output of
    :meth:`GdbCompare.prepare` says the probe was refused; ``None`` when it was taken."""
    lines = text.replace("\r", "").split("\n")
    at = [i for i, line in enumerate(lines) if line.strip() == _REFUSED]
    if not at:
        return None
    errors = [line.split("error:", 1)[1].strip() for line in lines[at[-1] + 1:] if "error:" in line]
    return errors[-1] if errors else "no reason in the guest's tracing error_log"


def kernel_walk(text: str, smap: SystemMap, cpu: int) -> tuple[list[int], list[str]]:
    """The kernel's walk in ``cpu``'s ftrace buffer ``text``: its pcs and its lines (one ``<stack trace>``
    block, checked against System.map)."""
    blocks = [b for b in parse_ftrace_stack(text, smap) if b.get("cpu") == cpu]
    if len(blocks) != 1 or blocks[0].get("why"):
        raise RuntimeError(f"cpu{cpu}: {len(blocks)} usable <stack trace> blocks"
                           + (f" ({blocks[0]['why']})" if len(blocks) == 1 else ""))
    return [int(p, 16) for p in blocks[0]["frames"]], blocks[0]["text"].splitlines()


@dataclass
class Stop:
    """One stop: the kernel's trace, gdb's pcs without and with the unwinder, and how many of the kernel's
    frames each gets, in order from the kernel's first."""

    arch: str
    event: str
    cpu: int
    kernel: list[int]
    without: list[int]
    with_unwind: list[int]
    kernel_text: list[str] = field(default_factory=list)
    #: why there is no stop: the guest refused the probe, or the trigger did not fire
    refused: str | None = None

    @property
    def counts(self) -> tuple[int, int]:
        """(frames matched without the unwinder, with it)."""
        return matched(self.kernel, self.without), matched(self.kernel, self.with_unwind)

    def to_json(self) -> dict:
        """The stop as one JSON record."""
        without, with_unwind = self.counts
        return {"arch": self.arch, "event": self.event, "cpu": self.cpu, "refused": self.refused,
                "kernel_frames": len(self.kernel), "matched_without": without, "matched_with": with_unwind,
                "kernel": [hex(p) for p in self.kernel], "gdb_without": [hex(p) for p in self.without],
                "gdb_with": [hex(p) for p in self.with_unwind], "kernel_text": self.kernel_text}

    def summary(self) -> str:
        """One line: the counts, or why there are none."""
        if self.refused is not None:
            return f"{self.arch} {self.event}: no stop: {self.refused}"
        without, with_unwind = self.counts
        return (f"{self.arch} {self.event} cpu{self.cpu}: kernel {len(self.kernel)} frames; gdb without unwind "
                f"{without}, with unwind {with_unwind}")


def matched(kernel: list[int], gdb: list[int]) -> int:
    """How many of the kernel's frames gdb has, pc for pc from the kernel's first one (the frames above
    it are the tracer's own, which the kernel's walk skips); 0 when gdb never reaches it."""
    if not kernel or kernel[0] not in gdb:
        return 0
    rest = gdb[gdb.index(kernel[0]):]
    n = 0
    while n < min(len(kernel), len(rest)) and kernel[n] == rest[n]:
        n += 1
    return n


class GdbCompare:
    """The lab guest of one arch (booted, its console free) and the kernel it runs."""

    def __init__(self, lab: dict, vmlinux: Path, system_map: Path, record: Path, gdb: str = "gdb-multiarch",
                 timeout: float = 600.0, stop_timeout: float = STOP_TIMEOUT) -> None:
        self.lab = lab
        self.stop_timeout = stop_timeout
        self.vmlinux = vmlinux
        self.system_map = system_map
        self.smap = SystemMap(system_map)
        self.gdb = shutil.which(gdb) or gdb
        self.timeout = timeout
        self.console = Console(lab["console"], record)
        self.trigger = self.smap.by_name[FTRACE_TRIGGER_FN][0]

    def relocate(self, out: Path) -> int:
        """Shift System.map by the guest's KASLR slide (``_text`` in ``/proc/kallsyms`` against the map's),
        written to ``out`` and used from then on; the slide. (``-m1``: all of ``/proc/kallsyms`` takes
        minutes under TCG, ``_text`` is near its start.)"""
        m = re.search(r"^([0-9a-f]{16}) [Tt] _text$", self.shell("grep -m1 ' _text$' /proc/kallsyms"), re.M)
        if m is None:
            raise RuntimeError("no _text in the guest's /proc/kallsyms")
        slide = int(m.group(1), 16) - self.smap.by_name["_text"][0]
        lines = []
        for line in self.system_map.read_text().splitlines():
            addr, _, rest = line.partition(" ")
            lines.append(f"{int(addr, 16) + slide:016x} {rest}")
        out.write_text("\n".join(lines) + "\n")
        self.smap = SystemMap(out)
        self.trigger = self.smap.by_name[FTRACE_TRIGGER_FN][0]
        return slide

    def close(self) -> None:
        """Let the console go."""
        self.console.close()

    def shell(self, cmd: str, done: str = "UNWIND-GC-DONE") -> str:
        """Run ``cmd`` in the guest's shell; its output."""
        mark = self.console.mark()
        half = len(done) // 2
        self.console.type(f"{cmd}; echo {done[:half]}''{done[half:]}")
        return self.console.wait_for(mark, rf"^{done}\b", self.timeout, quiet=0.3)

    def prepare(self, event: Event, arch: str) -> str | None:
        """The ftrace instance, the probe and the filtered event (the trigger not yet armed); the guest's
        reason when it refused the probe (:func:`probe_refusal`)."""
        i, ev = FTRACE_INSTANCE, f"{FTRACE_INSTANCE}/events/{event.path}"
        if event.probe:
            t = "/sys/kernel/tracing"
            out = self.shell(f"echo > {t}/error_log; echo '{probe_definition(event.probe, arch)}' >> "
                             f"{t}/kprobe_events 2>/dev/null || {{ echo {_REFUSED[:4]}''{_REFUSED[4:]}; "
                             f"cat {t}/error_log; }}")
            refused = probe_refusal(out)
            if refused is not None:
                return f"the guest refused the probe {probe_definition(event.probe, arch)!r}: {refused}"
        self.shell(f"mkdir -p {i} && echo 1 > {i}/options/sym-offset && echo 1 > {i}/options/sym-addr && "
                   f"echo '{event.never}' > {ev}/filter && echo 1 > {ev}/enable && "
                   f"echo '!stacktrace:1' > {ev}/trigger 2>/dev/null; echo > {i}/trace")
        return None

    def stop(self, event: Event, arch: str) -> Stop:
        """One stop at ``event``'s trigger: gdb's two walks, then the kernel's; a refused probe or a trigger
        that does not fire within :attr:`stop_timeout` is a stop with ``refused`` set."""
        refused = self.prepare(event, arch)
        if refused is not None:
            return Stop(arch, event.name, -1, [], [], [], refused=refused)
        script = _GDB_SCRIPT.format(gdbstub=self.lab["gdb"], trigger=self.trigger, mark=_MARK, unwinder=_UNWINDER)
        argv = [sys.executable, "-m", "unwind", "gdb", "--gdb", self.gdb, "-nx", "-batch", "-ex",
                "set pagination off", "-ex", f"python exec({script!r})", str(self.vmlinux)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            got = self._gdb_report(proc, event)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if got is None:
            self.release()
            self.shell(f"echo 0 > {FTRACE_INSTANCE}/events/{event.path}/enable")
            return Stop(arch, event.name, -1, [], [], [], refused=f"the trigger on {event.path} did not fire "
                        f"within {self.stop_timeout:g}s")
        if not got:
            err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            raise RuntimeError(f"{arch} {event.name}: gdb reported no stop ({err[-1] if err else proc.returncode})")
        if got["pc"] != self.trigger:
            raise RuntimeError(f"{arch} {event.name}: cpu{got['cpu']} stopped at {got['pc']:#x}, not at "
                               f"{FTRACE_TRIGGER_FN}")
        time.sleep(1.0)  # the trigger saves its walk as the guest runs on
        text = self.shell(f"cat {FTRACE_INSTANCE}/per_cpu/cpu{got['cpu']}/trace")
        try:
            kernel, lines = kernel_walk(text, self.smap, got["cpu"])
        except RuntimeError as e:
            raise RuntimeError(f"{arch} {event.name}: {e}") from None
        self.shell(f"echo 0 > {FTRACE_INSTANCE}/events/{event.path}/enable")
        return Stop(arch, event.name, got["cpu"], kernel, got["without"], got["with"], lines)

    def release(self) -> None:
        """Let the guest run again after its gdb was killed: QEMU's gdbstub keeps the VM stopped, with the
        breakpoint in, until a gdb detaches (``D`` removes every breakpoint and continues)."""
        subprocess.run([self.gdb, "-nx", "-batch", "-ex", f"target remote {self.lab['gdb']}", "-ex", "detach"],
                       capture_output=True, timeout=120, check=False)

    def _gdb_report(self, proc: subprocess.Popen, event: Event) -> dict | None:
        """gdb's report of the stop (``{}`` when gdb ended without one); ``None`` when none came within
        :attr:`stop_timeout` of arming the trigger. gdb's output is read as it comes, from the pipe itself
        (a buffered reader would hold lines the pipe no longer signals)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        got: dict = {}
        pending = b""
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    if not line.startswith(_MARK):
                        continue
                    record = json.loads(line[len(_MARK):])
                    if record.get("ready"):
                        self.console.type(f"echo '{event.trigger}' > {FTRACE_INSTANCE}/events/{event.path}/trigger")
                        deadline = time.monotonic() + self.stop_timeout
                    else:
                        got = record
        proc.wait(self.timeout)
        return got


def run(arch: str, events: tuple[Event, ...] | None = None, log: Path | None = None,
        kaslr: bool = False) -> list[Stop]:
    """Boot (or reuse) the lab guest of ``arch`` and take one stop per event. With ``kaslr`` the guest boots
    without ``nokaslr``: the kernel's trace is checked against System.map shifted by the slide the guest's
    ``/proc/kallsyms`` gives for ``_text`` (gdb and unwind find it on their own)."""
    from .boot import BootOptions, boot
    from .fetch import find_kernel

    k = find_kernel(arch)
    lab = boot(k, BootOptions(kaslr=kaslr), restart=True)
    record = log or Path(lab["console_log"]).with_name("gdbcompare-console.txt")
    cmp = GdbCompare(lab, k.vmlinux, k.system_map, record)
    try:
        if kaslr:
            cmp.relocate(Path(lab["console_log"]).with_name("System.map.kaslr"))
        stops = []
        for event in events_for(arch) if events is None else events:
            try:
                stops.append(cmp.stop(event, arch))
            except RuntimeError as e:  # this stop says why it has no counts; the others are kept
                stops.append(Stop(arch, event.name, -1, [], [], [], refused=str(e)))
        return stops
    finally:
        cmp.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m unwind.lab.gdbcompare [--kaslr] ARCH...``: one JSON line per stop, the counts on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m unwind.lab.gdbcompare",
        description="Boot the lab guest of each ARCH under QEMU (UNWIND_CACHE), stop it in an interrupt handler "
        "and in a kprobed function under a function_graph-traced (and, where the guest allows, kretprobed) "
        "caller, and count the kernel's own frames gdb-multiarch's bt has, without and with unwind's "
        "unwinder. One JSON line per stop on stdout, one summary line per stop on stderr.")
    parser.add_argument("arch", nargs="*", default=["arm64"], help="x86_64, arm64 or riscv (default arm64)")
    parser.add_argument("--kaslr", action="store_true", help="boot without nokaslr")
    args = parser.parse_args(argv)
    from .boot import LabError
    from .fetch import FetchError

    for arch in args.arch:
        try:
            stops = run(arch, kaslr=args.kaslr)
        except (FetchError, LabError, RuntimeError, TimeoutError, OSError) as e:
            print(f"gdbcompare: error: {arch}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                  file=sys.stderr)
            return 2
        for stop in stops:
            print(json.dumps(stop.to_json()), flush=True)
            print(f"# {stop.summary()}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
