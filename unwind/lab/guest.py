"""The guest behind a GDB stub, read as a stopped kernel (the reading side of ``unwind capture``).

:class:`GuestImage` is what the capture needs from the vmlinux; :class:`GuestMemory`
is the guest's memory as :class:`unwind.kernel.model.Kernel` reads it; a
:class:`CaptureSession` joins them with the stub: it numbers the vCPUs as Linux
CPUs, picks a vCPU whose MMU maps the kernel for memory reads, checks that the
vmlinux is the running kernel, and reads one stop (every CPU's registers,
every task's stack, saved context, function-graph return stack and
kretprobe/rethook instances, each CPU's per-CPU stacks) through the kernel
model and the arch's ``kernel`` hooks. What is per-arch about a gdbstub stop
(system registers, trap-entry normalisation, where ``current`` is) is the
arch's ``lab`` module.
"""

from __future__ import annotations

import importlib
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np
from elftools.elf.elffile import ELFFile

from unwind.core import registry
from unwind.core.memory import MemoryFault
from unwind.kernel.btf import Btf, BtfError
from unwind.core.dumpinfo import ModuleInfo
from unwind.formats.note_info import bpf_json, module_json, trampoline_json
from unwind.kernel.model import Kernel, KernelError, KernelTask, ftrace_trampolines
from .fetch import build_id
from .rsp import RspClient, RspMemoryError

#: our arch name -> lab module (imported lazily: the backend packages own arch/)
LAB_MODULES = {"x86_64": "unwind.arch.x86_64.lab", "arm64": "unwind.arch.arm64.lab",
               "riscv": "unwind.arch.riscv.lab"}
#: ELF e_machine -> our arch name
MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "arm64", "EM_RISCV": "riscv"}
#: the granule GuestMemory keeps what it read in: every arch's smallest page
PAGE_SIZE = 4096


class CaptureError(Exception):
    """The capture cannot go on; the message is one line for the user."""


def arch_lab(arch: str) -> ModuleType:
    """The capture knowledge module of ``arch``."""
    try:
        return importlib.import_module(LAB_MODULES[arch])
    except KeyError:
        raise CaptureError(f"unknown arch {arch!r}") from None


def _hex(v: int) -> str:
    return f"{v:#x}"


class GuestImage:
    """What capture needs from the guest's vmlinux: arch, build-id, symbol addresses, ``.notes``, BTF."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise CaptureError(f"cannot open vmlinux {path}: {e.strerror}") from None
        with f:
            try:
                elf = ELFFile(f)
            except Exception:
                raise CaptureError(f"{path} is not an ELF file") from None
            self.arch = MACHINES.get(elf["e_machine"])
            if self.arch is None:
                raise CaptureError(f"{path}: unsupported machine {elf['e_machine']}")
            symtab = elf.get_section_by_name(".symtab")
            if symtab is None:
                raise CaptureError(f"{path} has no .symtab (need the -dbg vmlinux)")
            strtab = elf.get_section(symtab["sh_link"]).data()
            dt = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                           ("value", "<u8"), ("size", "<u8")])
            syms = np.frombuffer(symtab.data(), dtype=dt)
            self.symbols: dict[str, int] = {}
            for name_off, value, info in zip(syms["name"].tolist(), syms["value"].tolist(), syms["info"].tolist()):
                if not name_off or value == 0:
                    continue
                end = strtab.index(b"\0", name_off)
                name = strtab[name_off:end].decode(errors="replace")
                # prefer global definitions over file-local duplicates
                if name not in self.symbols or info >> 4 == 1:
                    self.symbols[name] = value
            notes = elf.get_section_by_name(".notes")
            self.notes_addr = notes["sh_addr"] if notes is not None else 0
            self.notes_data = notes.data() if notes is not None else b""
        self.build_id = build_id(self.path)
        try:
            self.btf = Btf.from_elf(self.path)
        except BtfError as e:
            raise CaptureError(str(e)) from None

    def addr(self, name: str) -> int:
        """Address of ``name``; CaptureError when missing."""
        try:
            return self.symbols[name]
        except KeyError:
            raise CaptureError(f"symbol {name} not in {self.path.name}") from None

    def get(self, name: str) -> int | None:
        """Address of ``name`` or None."""
        return self.symbols.get(name)


class GuestFault(MemoryFault):
    """Guest memory the stub could not read through the memory vCPU's MMU."""

    def __init__(self, addr: int, size: int) -> None:
        super().__init__(addr, size)
        self.args = (f"the guest cannot read {size} bytes at {addr:#x}",)


class GuestMemory:
    """The session's guest memory as :class:`unwind.kernel.model.Kernel` reads it (faults as MemoryFault).

    Inside :meth:`held` (one stop, the guest halted) each page read is kept, so
    the model's member-by-member reads of a ``task_struct`` cost one stub
    request per page (a page the stub cannot read whole is read as asked);
    outside it every read goes to the stub.
    """

    def __init__(self, session: "CaptureSession") -> None:
        self.session = session
        self._pages: dict[int, bytes] | None = None

    def _stub_read(self, addr: int, size: int) -> bytes:
        s = self.session
        s.rsp.select_thread(s.mem_tid)
        try:
            return s.rsp.read_memory(addr, size)
        except RspMemoryError:
            raise GuestFault(addr, size) from None

    def _page(self, base: int) -> bytes:
        assert self._pages is not None
        page = self._pages.get(base)
        if page is None:
            page = self._pages[base] = self._stub_read(base, PAGE_SIZE)
        return page

    def read(self, addr: int, size: int) -> bytes:
        """``size`` bytes at ``addr``."""
        if self._pages is None or size <= 0:
            return self._stub_read(addr, size)
        out = bytearray()
        while len(out) < size:
            a = addr + len(out)
            base = a & ~(PAGE_SIZE - 1)
            try:
                page = self._page(base)
            except GuestFault:  # a page not wholly readable: the bytes asked for may still be
                return self._stub_read(addr, size)
            out += page[a - base:a - base + size - len(out)]
        return bytes(out)

    def read_u64(self, addr: int) -> int:
        """A 64-bit word."""
        return int.from_bytes(self.read(addr, 8), "little")

    def readable(self, addr: int) -> bool:
        """Can one word at ``addr`` be read?"""
        try:
            self.read(addr, 8)
            return True
        except MemoryFault:
            return False

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep the pages read until the block ends (the guest must stay halted)."""
        self._pages = {}
        try:
            yield
        finally:
            self._pages = None


@dataclass
class CpuStop:
    """One vCPU at a stop."""

    cpu: int
    tid: str
    raw: dict[str, int]
    mode: str
    regs: dict[str, int]
    normalised: str | None
    cpu_from: str = "vCPU index"
    current: int = 0
    current_src: str = ""


@dataclass
class StopResult:
    """A captured stop: the writer inputs as plain data."""

    memory: dict[int, bytes] = field(default_factory=dict)
    cpus: list[CpuStop] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


# ftrace_graph_get_ret_stack() over the task's return stack (unwind.kernel.model.Kernel.fgraph)
def task_fgraph(k: Kernel, t: KernelTask, res: StopResult) -> list[dict[str, str]]:
    """The task's function-graph return stack (bottom to top) as the JSON note holds it (the members
    this kernel's ``ftrace_ret_stack`` has); the bytes it spans go into ``res.memory``."""
    entries = k.fgraph(t).entries
    span = k.ret_stack_span(t) if entries else None
    if span is None:
        return []
    ptr, size = span
    res.memory[ptr] = k.read(ptr, size)
    fields = [n for n in ("ret", "func", "retp", "fp") if k.has("ftrace_ret_stack", n)]
    return [{n: _hex(getattr(e, n)) for n in fields} for e in entries]


class CaptureSession:
    """A GDB-stub connection plus the vmlinux knowledge to read the kernel behind it."""

    def __init__(self, rsp: RspClient, image: GuestImage, log: Callable[[str], None] | None = None) -> None:
        self.rsp = rsp
        self.img = image
        self.btf = image.btf
        self.arch = image.arch
        self.lab = arch_lab(self.arch)
        #: the arch's hooks for reading a stopped kernel (saved contexts, per-CPU stacks)
        self.hooks = registry.get(self.arch).kernel
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.threads = rsp.threads()
        if not self.threads:
            raise CaptureError("the stub reports no threads")
        self.ncpu = len(self.threads)
        self.mem_tid = self.threads[0]
        self.guest = GuestMemory(self)
        self.kernel: Kernel
        self.hw_cpu_ids: list[int] | None = None
        self.vmcoreinfo = ""

    def halt_where_kernel_readable(self, tries: int = 20) -> None:
        """Pick a memory thread whose MMU maps the kernel, resuming briefly until a vCPU does.

        A vCPU halted in firmware (riscv M-mode in OpenSBI) reads kernel addresses as physical ones.
        """
        probe = self.img.addr("init_task")
        for _ in range(tries):
            for tid in self.threads:
                self.mem_tid = tid
                if self.guest.readable(probe):
                    return
            self.rsp.cont()
            time.sleep(0.2)
            self.rsp.halt()
        raise CaptureError(f"no vCPU reads kernel memory (init_task) in {tries} halts")

    # -- once per session ----------------------------------------------------
    def setup(self) -> None:
        """The kernel model, VMCOREINFO and the build-id check (needs a stopped guest)."""
        self.halt_where_kernel_readable()
        try:
            self.kernel = Kernel(self.guest, self.btf, self.img.get, self.hooks.CONTEXT_MEMBERS)
        except KernelError as e:
            raise CaptureError(str(e)) from None
        if hasattr(self.lab, "hw_cpu_ids"):
            self.hw_cpu_ids = self.lab.hw_cpu_ids(self.kernel, min(self.ncpu, self.kernel.nr_cpus))
        ptr = self.guest.read_u64(self.img.addr("vmcoreinfo_data"))
        size = self.guest.read_u64(self.img.addr("vmcoreinfo_size"))
        if ptr and 0 < size < 1 << 16:
            self.vmcoreinfo = self.guest.read(ptr, size).decode(errors="replace").rstrip("\0")
        self.check_build_id()

    def running_build_id(self) -> str | None:
        """The build-id of the running kernel (VMCOREINFO ``BUILD-ID``, else its ``.notes``)."""
        for line in self.vmcoreinfo.splitlines():
            if line.startswith("BUILD-ID="):
                return line.split("=", 1)[1].strip()
        if self.img.notes_addr and self.img.notes_data:
            live = self.guest.read(self.img.notes_addr, len(self.img.notes_data))
            return self.img.build_id if live == self.img.notes_data else ""
        return None

    def check_build_id(self) -> None:
        """Refuse a vmlinux that is not the running kernel."""
        try:
            live = self.running_build_id()
        except MemoryFault:
            live = ""
        if live is None:
            self.log("[capture] warning: cannot read the running kernel's build-id")
            return
        if live != self.img.build_id:
            raise CaptureError(f"vmlinux build-id {self.img.build_id} does not match the running kernel "
                               f"({live or 'unreadable'})")
        off = [ln for ln in self.vmcoreinfo.splitlines() if ln.startswith("KERNELOFFSET=")]
        if off and int(off[0].split("=")[1], 16) != 0:
            raise CaptureError(f"KASLR is on ({off[0]}); boot with nokaslr")

    # -- per stop ------------------------------------------------------------
    def read_cpus(self) -> list[CpuStop]:
        """Registers, mode and normalisation of every vCPU, in Linux CPU order."""
        out = []
        for index, tid in enumerate(self.threads[:self.kernel.nr_cpus]):
            self.rsp.select_thread(tid)
            raw = self.rsp.read_registers(self.lab.SYSREGS)
            mode, regs, note = self.lab.classify(raw, self.kernel)
            cpu, why = self.linux_cpu(index, raw)
            out.append(CpuStop(cpu, tid, raw, mode, regs, note, why))
        if len({c.cpu for c in out}) != len(out):
            for index, c in enumerate(out):
                c.cpu, c.cpu_from = index, "vCPU index (the hardware ids gave duplicate CPUs)"
        return sorted(out, key=lambda c: c.cpu)

    def linux_cpu(self, index: int, raw: dict[str, int]) -> tuple[int, str]:
        """(Linux CPU number, where it came from) of the vCPU with QEMU index ``index``: the index in
        the kernel's logical-to-hardware CPU map of the vCPU's hardware id when the arch has both
        (riscv: the boot hart, whichever it is, is CPU 0), else the QEMU index."""
        reg = getattr(self.lab, "HW_CPU_ID_REG", None)
        hw = raw.get(reg) if reg else None
        if self.hw_cpu_ids and hw is not None and hw in self.hw_cpu_ids:
            cpu = self.hw_cpu_ids.index(hw)
            return cpu, f"{reg} {hw} = {self.lab.HW_CPU_ID_MAP}[{cpu}]"
        return index, "vCPU index"

    def check_cpu(self, c: CpuStop) -> str | None:
        """The current task's own CPU (``thread_info.cpu``) against the number given to its vCPU, when
        the task came from a register that names it; a sentence when they differ."""
        if not c.current or c.current_src not in getattr(self.lab, "SELF_CURRENT", ()):
            return None
        try:
            cpu = self.kernel.task(c.current).cpu
        except (MemoryFault, KernelError):
            return None
        if cpu == c.cpu:
            return None
        return f"vCPU {c.tid} numbered cpu{c.cpu} ({c.cpu_from}) runs a task whose cpu is {cpu}"

    def pick_memory_thread(self, cpus: list[CpuStop]) -> bool:
        """Use a vCPU whose MMU view reads kernel addresses; False if none can."""
        probe = self.img.addr("init_task")
        order = [c for c in cpus if c.mode == "kernel"] + [c for c in cpus if c.mode != "kernel"]
        for c in order:
            self.mem_tid = c.tid
            if self.guest.readable(probe):
                return True
        return False

    def repick_memory_thread(self) -> None:
        """After a resume and halt, the vCPU used for memory reads may be in user/firmware mode: pick one
        that is in the kernel, letting the guest run briefly between tries."""
        for _ in range(10):
            if self.pick_memory_thread(self.read_cpus()):
                break
            self.rsp.cont()
            time.sleep(0.05)
            self.rsp.halt()

    def capture_stop(self, kind: str, hit_tid: str | None = None) -> StopResult | str:
        """Capture the stopped guest; a string is the reason the stop was skipped."""
        t0 = time.monotonic()
        cpus = self.read_cpus()
        if not self.pick_memory_thread(cpus):
            return "no vCPU can read kernel memory (all in user/firmware mode)"
        if not any(c.mode == "kernel" for c in cpus):
            return "no vCPU in kernel mode"
        k = self.kernel
        warned = len(k.warnings)
        with self.guest.held():
            res = self._read_stop(k, cpus, kind, hit_tid)
        for w in k.warnings[warned:]:
            self.log(f"[capture] warning: {w}")
        res.seconds = time.monotonic() - t0
        res.meta["capture"]["seconds"] = round(res.seconds, 3)
        return res

    def _read_stop(self, k: Kernel, cpus: list[CpuStop], kind: str, hit_tid: str | None) -> StopResult:
        """Every task and per-CPU stack of the stop through the kernel model (the guest halted)."""
        res = StopResult()
        current: dict[int, int] = {}
        for c in cpus:
            try:
                task, src = self.lab.current_task(k, c.cpu, c.raw)
            except MemoryFault:
                task, src = 0, "unreadable"
            c.current, c.current_src = task, src
            if task:
                current[c.cpu] = task
            mismatch = self.check_cpu(c)
            if mismatch:
                self.log(f"[capture] warning: {mismatch}")
        stacks_meta: list[dict[str, Any]] = []
        task_meta: list[dict[str, Any]] = []
        stopped = {c.cpu: c for c in cpus}
        unreadable = 0
        for task in k.tasks(current):
            running = stopped.get(task.running_on) if task.running_on is not None else None
            if task.idle and running is None:
                continue  # an idle task is the list head (swapper/0) or off the list: only interesting when running
            try:
                task_meta.append(self._capture_task(k, task, running, res, stacks_meta))
            except MemoryFault:
                unreadable += 1
        for c in cpus:
            for skind, plo, phi in self.hooks.percpu_stacks(k, c.cpu):
                stacks_meta.append({"kind": skind, "low": _hex(plo), "high": _hex(phi), "cpu": c.cpu,
                                    "pid": None})
        cpu_meta = []
        for c in cpus:
            pid = next((t["pid"] for t in task_meta if t["cpu"] == c.cpu), None)
            cpu_meta.append({"cpu": c.cpu, "cpu_from": c.cpu_from, "pid": pid, "mode": c.mode,
                             "sysregs": {r: _hex(c.raw[r]) for r in self.lab.SYSREGS if r in c.raw},
                             "normalised": c.normalised, "current": _hex(c.current),
                             "current_from": c.current_src,
                             "hit": hit_tid == c.tid if hit_tid else None})
        res.cpus = cpus
        res.meta = {"cpus": cpu_meta, "stacks": stacks_meta, "tasks": task_meta,
                    "ftrace_trampolines": [trampoline_json(t) for t in ftrace_trampolines(k)],
                    "modules": [module_json(m) for m in self._capture_modules(k, res)],
                    "bpf_symbols": [bpf_json(b) for b in k.bpf_symbols()],
                    "capture": {"tool": "unwind capture", "kind": kind, "time": time.time(),
                                "unreadable_tasks": unreadable}}
        return res

    @staticmethod
    def _capture_modules(k: Kernel, res: StopResult) -> list[ModuleInfo]:
        """The loaded modules (regions, kallsyms, x86-64 ORC table pointers), read as a vmcore's are; the
        bytes of each module's ORC tables go into ``res.memory`` (x86-64 ``orc_module_find()`` reads them)."""
        modules = k.modules()
        for m in modules:
            for lo, hi in m.orc.ranges() if m.orc is not None else ():
                try:
                    res.memory[lo] = k.read(lo, hi - lo)
                except MemoryFault as e:
                    k.warnings.append(f"module {m.name}: its ORC tables are unreadable: {e}")
        return modules

    def _capture_task(self, k: Kernel, t: KernelTask, running: CpuStop | None, res: StopResult,
                      stacks_meta: list[dict[str, Any]]) -> dict[str, Any]:
        """One task's JSON entry; its stack bytes, and those of its function-graph return stack, go into
        ``res.memory``."""

        def add_mem(lo: int, hi: int) -> None:
            if hi <= lo:
                return
            try:
                res.memory[lo] = k.read(lo, hi - lo)
            except MemoryFault:
                pass

        lo, hi = t.stack, t.stack + k.thread_size
        cpu = running.cpu if running is not None else None
        entry: dict[str, Any] = {"pid": t.pid, "comm": t.comm, "state": t.state,
                                 "cpu": cpu, "task": _hex(t.addr), "switches": t.switches, "tgid": t.tgid}
        entry.update({k: v for k, v in (("last_cpu", t.cpu if cpu is None else None), ("ppid", t.ppid),
                                        ("kthread", t.kthread)) if v is not None})
        stacks_meta.append({"kind": "task", "low": _hex(lo), "high": _hex(hi), "cpu": cpu, "pid": t.pid})
        if running is None:
            if t.on_cpu:  # a CPU is switching to or from it: its saved context may be stale (Dump pairs them)
                entry["on_cpu"] = True
                entry["note"] = "on_cpu but no stopped vCPU runs it (switching)"
            ctx = self.hooks.blocked_context(k, t.addr, t.data)
            entry["context"] = {r: _hex(v) for r, v in ctx.items()}
            sp = ctx["sp"]  # every arch's saved context names its stack pointer "sp"
            if lo <= sp <= hi:
                add_mem(sp, hi)
            else:
                entry["note"] = f"saved sp {sp:#x} is off its stack"
        else:
            _, sp = self.lab.pc_sp(running.regs)
            if running.mode != "kernel":
                entry["mode"] = running.mode
            if lo <= sp <= hi:
                add_mem(sp, hi)
            else:
                add_mem(lo, hi)
                for kind, plo, phi in self.hooks.percpu_stacks(k, running.cpu):
                    if plo <= sp <= phi:
                        add_mem(sp, phi)
                    elif kind == "irq":
                        add_mem(plo, phi)  # an exception on top of an IRQ needs both
        fg = task_fgraph(k, t, res)
        if fg:
            entry["fgraph"] = fg
        kr = k.kretprobes(t).entries
        if kr:
            entry["kretprobes"] = [{"ret": _hex(i.ret), "fp": _hex(i.fp)} for i in kr]
        return entry

    def symbols_meta(self) -> dict[str, str]:
        """Handy symbol values for the JSON note."""
        out = {}
        for name in ["_stext", "_etext", "_text", "init_task", *self.lab.TRAMPOLINES,
                     *getattr(self.lab, "EXTRA_SYMBOLS", [])]:
            v = self.img.get(name)
            if v is not None:
                out[name] = _hex(v)
        return out

    def offsets_meta(self) -> dict[str, Any]:
        """The layouts the replay reads, from the guest's BTF: the dump's ``offsets``."""
        from unwind.kernel.layout import dump_offsets

        return dump_offsets(self.btf, registry.get(self.arch))

    def write_dump(self, res: StopResult, path: Path, release: str, extra: dict[str, Any]) -> None:
        """Write ``res`` as a dump file (compressed by suffix)."""
        from unwind.formats.dump import DumpWriter

        w = DumpWriter(self.arch)
        for addr, data in sorted(res.memory.items()):
            w.add_memory(addr, data)
        for c in res.cpus:
            pid = next((t["pid"] for t in res.meta["tasks"] if t["cpu"] == c.cpu), None)
            w.add_cpu(c.cpu, c.regs, pid)
        w.vmcoreinfo = self.vmcoreinfo
        w.meta.update(res.meta)
        w.meta.update({"kernel": {"release": release}, "build_id": self.img.build_id,
                       "symbols": self.symbols_meta(), "offsets": self.offsets_meta()})
        w.meta["capture"].update(extra)
        w.write(path)
