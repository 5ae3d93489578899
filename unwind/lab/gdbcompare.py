"""gdb's ``bt`` on a lab guest, with and without unwind's unwinder, against the kernel's own trace of the
same stop.

A stop is an ftrace ``stacktrace:1`` trigger caught as it fires (the lab's ftrace oracle,
:class:`~.console_oracles.FtraceStacktrace`): gdb-multiarch, started by ``unwind gdb`` on the guest's
gdbstub, puts a hardware breakpoint on ``stacktrace_trigger``, the trigger is armed on the console, and
the first CPU to run it stops there. gdb walks that CPU twice (``disable unwinder`` / ``enable
unwinder``; ``frame N`` and ``$pc`` for each level, an inline frame's pc once), then detaches; the guest runs on, the trigger saves the
kernel's walk of the same state, and the console prints it.

Two events, in the lab guest's workloads (``unwind lab boot``):

- ``irq``: ``timer/hrtimer_expire_entry``, inside the timer interrupt handler;
- ``hijack``: a kprobe event on ``read_zero`` (the ``dd if=/dev/zero`` loop), called by ``vfs_read``,
  which function_graph traces (its return is ``return_to_handler``'s), under ``ksys_read``, which the
  lab's kretprobe hijacks (``__kretprobe_trampoline`` or the rethook trampoline).

The kernel's walk skips its own top frames (``STACK_SKIP``): both of gdb's walks are compared from the
oracle's first pc on (:func:`matched`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .console_oracles import FTRACE_INSTANCE, FTRACE_TRIGGER_FN
from .monitor import Console
from .oracles import SystemMap, parse_ftrace_stack

#: where the gdb script prints its findings (one JSON line)
_MARK = "@@unwind-gdbcompare "
#: the name the unwinder is registered under (``info unwinder``)
_UNWINDER = "unwind-kernel"
#: the script gdb runs: stop at the trigger, walk the CPU without and with the unwinder, detach
_GDB_SCRIPT = '''
import json, gdb
def pcs():
    # frame by frame as `bt` goes (a Python Frame of the last one would ask for the one after it), an inline
    # frame's pc being its caller's
    out = []
    for level in range(200):
        try:
            gdb.execute("frame %d" % level, to_string=True)
            pc = int(gdb.parse_and_eval("$pc")) & (2**64 - 1)
        except gdb.error:
            break
        if not out or out[-1] != pc:
            out.append(pc)
    return out
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


@dataclass(frozen=True)
class Event:
    """An ftrace event the trigger is put on: its ``events/`` path, the probe that makes it (if any) and
    a filter no record passes (the trigger still fires: only its stack trace lands in the buffer)."""

    name: str
    path: str
    probe: str | None
    never: str


EVENTS = (
    Event("irq", "timer/hrtimer_expire_entry", None, "now < 0"),
    Event("hijack", "kprobes/unwind_read_zero", "p:unwind_read_zero read_zero", "common_pid < 0"),
)


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

    @property
    def counts(self) -> tuple[int, int]:
        """(frames matched without the unwinder, with it)."""
        return matched(self.kernel, self.without), matched(self.kernel, self.with_unwind)

    def to_json(self) -> dict:
        """The stop as one JSON record."""
        without, with_unwind = self.counts
        return {"arch": self.arch, "event": self.event, "cpu": self.cpu, "kernel_frames": len(self.kernel),
                "matched_without": without, "matched_with": with_unwind,
                "kernel": [hex(p) for p in self.kernel], "gdb_without": [hex(p) for p in self.without],
                "gdb_with": [hex(p) for p in self.with_unwind], "kernel_text": self.kernel_text}


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
                 timeout: float = 600.0) -> None:
        self.lab = lab
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

    def prepare(self, event: Event) -> None:
        """The ftrace instance, the probe and the filtered event (the trigger not yet armed)."""
        i, ev = FTRACE_INSTANCE, f"{FTRACE_INSTANCE}/events/{event.path}"
        probe = f"echo '{event.probe}' >> /sys/kernel/tracing/kprobe_events 2>/dev/null; " if event.probe else ""
        self.shell(f"{probe}mkdir -p {i} && echo 1 > {i}/options/sym-offset && echo 1 > {i}/options/sym-addr && "
                   f"echo '{event.never}' > {ev}/filter && echo 1 > {ev}/enable && "
                   f"echo '!stacktrace:1' > {ev}/trigger 2>/dev/null; echo > {i}/trace")

    def stop(self, event: Event, arch: str) -> Stop:
        """One stop at ``event``'s trigger: gdb's two walks, then the kernel's."""
        self.prepare(event)
        script = _GDB_SCRIPT.format(gdbstub=self.lab["gdb"], trigger=self.trigger, mark=_MARK, unwinder=_UNWINDER)
        argv = [sys.executable, "-m", "unwind", "gdb", "--gdb", self.gdb, "-nx", "-batch", "-ex",
                "set pagination off", "-ex", f"python exec({script!r})", str(self.vmlinux)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        got: dict = {}
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not line.startswith(_MARK):
                    continue
                record = json.loads(line[len(_MARK):])
                if record.get("ready"):
                    self.console.type(f"echo 'stacktrace:1' > {FTRACE_INSTANCE}/events/{event.path}/trigger")
                else:
                    got = record
            proc.wait(self.timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if not got:
            err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            raise RuntimeError(f"{arch} {event.name}: gdb reported no stop ({err[-1] if err else proc.returncode})")
        if got["pc"] != self.trigger:
            raise RuntimeError(f"{arch} {event.name}: cpu{got['cpu']} stopped at {got['pc']:#x}, not at "
                               f"{FTRACE_TRIGGER_FN}")
        time.sleep(1.0)  # the trigger saves its walk as the guest runs on
        text = self.shell(f"cat {FTRACE_INSTANCE}/per_cpu/cpu{got['cpu']}/trace")
        blocks = [b for b in parse_ftrace_stack(text, self.smap) if b.get("cpu") == got["cpu"]]
        if len(blocks) != 1 or blocks[0].get("why"):
            raise RuntimeError(f"{arch} {event.name}: cpu{got['cpu']}: {len(blocks)} usable <stack trace> blocks")
        self.shell(f"echo 0 > {FTRACE_INSTANCE}/events/{event.path}/enable")
        return Stop(arch, event.name, got["cpu"], [int(p, 16) for p in blocks[0]["frames"]], got["without"],
                    got["with"], blocks[0]["text"])


def run(arch: str, events: tuple[Event, ...] = EVENTS, log: Path | None = None, kaslr: bool = False) -> list[Stop]:
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
        return [cmp.stop(e, arch) for e in events]
    finally:
        cmp.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m unwind.lab.gdbcompare [--kaslr] ARCH...``: one JSON line per stop, the counts on stderr."""
    args = list(argv if argv is not None else sys.argv[1:])
    kaslr = "--kaslr" in args
    arches = [a for a in args if a != "--kaslr"] or ["arm64"]
    for arch in arches:
        for stop in run(arch, kaslr=kaslr):
            record = stop.to_json()
            print(json.dumps(record), flush=True)
            print(f"# {arch} {stop.event} cpu{stop.cpu}: kernel {len(stop.kernel)} frames; gdb without unwind "
                  f"{record['matched_without']}, with unwind {record['matched_with']}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
