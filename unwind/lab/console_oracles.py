"""Stops whose oracle the guest prints on its serial console: sysrq-t, sysrq-l and an ftrace trigger.

:class:`SysrqOracle` resumes the guest after a stop, has it print every task's
trace (sysrq-t) and keeps the traces of tasks that did not run meanwhile; it
also stops on the arch's regs printer while sysrq-l walks a running CPU.
:class:`FtraceStacktrace` stops where an ftrace ``stacktrace`` trigger fires and
reads the walk it saved. The text is parsed by :mod:`.oracles`.
"""

from __future__ import annotations

from unwind.core.memory import MemoryFault
from unwind.kernel.model import KernelError
from .guest import CaptureSession, StopResult
from .oracles import parse_ftrace_stack, parse_regs_backtrace, sysrq_oracles
from .rsp import RspClient


class SysrqOracle:
    """sysrq-t through the guest's serial console, checked for tasks that ran meanwhile."""

    def __init__(self, console, smap, timeout: float = 120.0) -> None:
        self.console = console
        self.smap = smap
        self.timeout = timeout

    def collect(self, s: CaptureSession, res: StopResult) -> tuple[list[dict], str]:
        """Resume, trigger sysrq-t, stop again; oracle entries for the stop in ``res``."""
        mark = self.console.mark()
        s.rsp.cont()
        self.console.type("echo t > /proc/sysrq-trigger")
        text = ""
        try:
            text = self.console.wait_for(mark, r"Showing busy workqueues",
                                         self.timeout, quiet=1.5)
        finally:
            s.rsp.halt()
        s.repick_memory_thread()
        ents = sysrq_oracles(text, self.smap)
        by_pid = {t["pid"]: t for t in res.meta["tasks"]}
        stale = 0
        with s.guest.held():
            for e in ents:
                t = by_pid.get(e["pid"])
                if e.get("stale"):  # the parser already knows (e.g. the task that wrote the sysrq)
                    stale += 1
                    continue
                if t is None or t["cpu"] is not None:
                    e["stale"] = True
                    e["why"] = "not a blocked task of the dump"
                    stale += 1
                    continue
                try:
                    now = s.kernel.task(int(t["task"], 16)).switches
                except (MemoryFault, KernelError):
                    now = -1
                if now != t["switches"]:
                    e["stale"] = True
                    e["why"] = f"ran between capture and sysrq ({now - t['switches']} switches)"
                    stale += 1
        return ents, f"sysrq-t: {len(ents)} tasks, {stale} stale"

    def regs_printer_stop(self, s: CaptureSession, timeout: float) -> tuple[StopResult, bytes, str] | str:
        """sysrq-l with a breakpoint on the arch's regs printer: capture the first CPU that reaches it
        with a ``struct pt_regs``, record those registers, then store the trace the kernel prints."""
        fn, argreg = s.lab.REGS_PRINTER
        addr = s.img.addr(fn)
        mark = self.console.mark()
        s.rsp.breakpoint(addr, s.lab.BREAK_KIND)
        s.rsp.cont()
        self.console.type("echo l > /proc/sysrq-trigger")
        ptr, hit, reply = 0, None, b""
        try:
            for _ in range(2 * s.ncpu):
                r = s.rsp.wait_stop(timeout)
                if r is None:
                    s.rsp.halt()
                    break
                reply, hit = r, RspClient.stop_thread(r)
                s.rsp.select_thread(hit)
                ptr = s.rsp.read_registers([argreg]).get(argreg, 0)
                if ptr:
                    break
                s.rsp.cont()
        finally:
            s.rsp.breakpoint(addr, s.lab.BREAK_KIND, insert=False)
        if not ptr or hit not in s.threads:
            return f"no CPU reached {fn} with a pt_regs in {timeout:.0f}s (idle CPUs are skipped)"
        res = s.capture_stop(f"sysrq-l:{fn}", hit)
        if isinstance(res, str):
            return res
        mode, regs = s.lab.regs_from_pt_regs(s.kernel, ptr)
        if mode != "kernel":
            return "the interrupted CPU was in user mode (the kernel prints registers only)"
        c = next(c for c in res.cpus if c.tid == hit)
        cpu = c.cpu
        c.regs, c.mode = regs, mode
        c.normalised = f"struct pt_regs at {argreg}={ptr:#x} of {fn} (sysrq-l)"
        cmeta = next(m for m in res.meta["cpus"] if m["cpu"] == cpu)
        cmeta.update(mode=mode, normalised=c.normalised)
        _, psp = s.lab.pc_sp(regs)
        pid = cmeta["pid"]
        for st in res.meta["stacks"]:
            lo, hi = int(st["low"], 16), int(st["high"], 16)
            if (st["pid"] == pid or st["cpu"] == cpu) and lo <= psp <= hi:
                res.memory[psp] = s.kernel.read(psp, hi - psp)
                break
        s.rsp.cont()
        try:
            text = self.console.wait_for(mark, rf"NMI backtrace for cpu {cpu}\b(?:(?!skipped).)*$", timeout,
                                         quiet=1.5)
        finally:
            s.rsp.halt()
        ent = {"source": "sysrq-l", "cpu": cpu, "pid": pid, **parse_regs_backtrace(text, cpu, self.smap)}
        res.meta["pending_oracles"] = [ent]
        return res, reply, f"sysrq-l:{fn}"


#: tracefs instance the ftrace oracle uses (its own buffer: the lab's function_graph stays out of it)
FTRACE_INSTANCE = "/sys/kernel/tracing/instances/unwind"
#: the function the ``stacktrace`` trigger runs (kernel/trace/trace_events_trigger.c); not traceable
FTRACE_TRIGGER_FN = "stacktrace_trigger"


class FtraceStacktrace:
    """The kernel's own walk at a trace event: an ftrace ``stacktrace:1`` trigger, caught as it fires.

    Once per session (console): a tracefs instance with options ``sym-offset`` and ``sym-addr``, the
    event enabled with a filter no record passes (``now < 0`` for ``timer/hrtimer_expire_entry``: the
    event is discarded, its post-call triggers still run), so the instance's buffer holds only stack
    traces. Per stop: a hardware breakpoint on ``stacktrace_trigger`` (entry, before its frame), then
    the trigger is re-armed with count 1 after clearing the buffer; the first CPU to run it stops the
    guest there. The dump is captured, the guest resumes (the trigger now saves its walk, and being
    ``:1`` fires nowhere else), and ``per_cpu/cpuN/trace`` of that CPU is read and parsed
    (:func:`.oracles.parse_ftrace_stack`): exactly one ``<stack trace>`` block is expected.

    The kernel's walk skips its own top frames (``STACK_SKIP`` 4 in trace_events_trigger.c, +1 in
    ``__ftrace_trace_stack`` without ORC, +1 in ``stack_trace_save``); the stop is above them, so the
    replay of that CPU holds ``stacktrace_trigger+0`` (and, on arches whose walk from regs drops an
    ra/lr-held caller, not ``event_triggers_post_call``) on top of the oracle: ``unwind diff`` compares
    from the oracle's first pc (:func:`unwind.cli.corpus.compare_oracle`).
    """

    def __init__(self, console, smap, event: str = "timer/hrtimer_expire_entry",
                 never: str = "now < 0", timeout: float = 60.0) -> None:
        self.console = console
        self.smap = smap
        self.event = event
        self.never = never
        self.timeout = timeout
        self.ready = False

    def _run(self, s: CaptureSession, cmd: str, done: str = "UNWIND-FT-DONE") -> str:
        """Type ``cmd`` into the running guest's shell; its output (up to an end mark)."""
        mark = self.console.mark()
        # the echoed command shows the mark split ('X''Y'), only the shell's output has it whole
        half = len(done) // 2
        self.console.type(f"{cmd}; echo {done[:half]}''{done[half:]}")
        text = self.console.wait_for(mark, rf"^{done}\b", self.timeout, quiet=0.3)
        return text

    def setup(self, s: CaptureSession) -> None:
        """Create the instance and enable the filtered event (guest running)."""
        i, ev = FTRACE_INSTANCE, f"{FTRACE_INSTANCE}/events/{self.event}"
        self._run(s, f"mkdir -p {i} && echo 1 > {i}/options/sym-offset && echo 1 > {i}/options/sym-addr && "
                     f"echo '{self.never}' > {ev}/filter && echo 1 > {ev}/enable")
        self.ready = True

    def stop(self, s: CaptureSession, timeout: float) -> tuple[StopResult, bytes, str] | str:
        """One stop at the trigger and its oracle (the guest is halted on entry and on return)."""
        i, ev = FTRACE_INSTANCE, f"{FTRACE_INSTANCE}/events/{self.event}"
        addr = s.img.addr(FTRACE_TRIGGER_FN)
        label = f"ftrace:{self.event.split('/')[-1]}"
        s.rsp.cont()
        try:
            if not self.ready:
                self.setup(s)
            self._run(s, f"echo '!stacktrace:1' > {ev}/trigger 2>/dev/null; echo > {i}/trace")
        finally:
            s.rsp.halt()
        s.rsp.breakpoint(addr, s.lab.BREAK_KIND)
        s.rsp.cont()
        self.console.type(f"echo 'stacktrace:1' > {ev}/trigger")
        try:
            reply = s.rsp.wait_stop(timeout)
            if reply is None:
                s.rsp.halt()
        finally:
            s.rsp.breakpoint(addr, s.lab.BREAK_KIND, insert=False)
        hit = RspClient.stop_thread(reply) if reply else None
        if reply is None or hit not in s.threads:
            return f"{FTRACE_TRIGGER_FN} not reached in {timeout:.0f}s"
        s.rsp.select_thread(hit)
        raw = s.rsp.read_registers(s.lab.SYSREGS)
        cpu, _ = s.linux_cpu(s.threads.index(hit), raw)
        _, regs, _ = s.lab.classify(raw, s.kernel)
        pc, _ = s.lab.pc_sp(regs)
        if pc != addr:
            return f"cpu{cpu} stopped at {pc:#x}, not at {FTRACE_TRIGGER_FN}"
        res = s.capture_stop(label, hit)
        if isinstance(res, str):
            return res
        s.rsp.cont()
        try:
            text = self._run(s, f"cat {i}/per_cpu/cpu{cpu}/trace")
        finally:
            s.rsp.halt()
        s.repick_memory_thread()
        blocks = parse_ftrace_stack(text, self.smap)
        if len(blocks) != 1:
            return f"cpu{cpu}: {len(blocks)} <stack trace> blocks in its buffer, expected 1"
        b = blocks[0]
        ent = {"source": "ftrace-stacktrace", "cpu": cpu, "pid": None, "frames": b["frames"], "text": b["text"],
               "event": self.event, "trigger": "stacktrace:1", "stop": f"{FTRACE_TRIGGER_FN}+0"}
        if b.get("cpu") != cpu:
            ent["stale"], ent["why"] = True, f"block printed for cpu {b.get('cpu')}"
        elif b.get("stale"):
            ent["stale"], ent["why"] = True, b["why"]
        res.meta["pending_oracles"] = [ent]
        return res, reply, label
