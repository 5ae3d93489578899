"""Capture dumps of a stopped kernel through a GDB stub (see ``unwind capture``).

Per stop: every CPU's registers (trap-entry stops normalised by the arch's
``lab`` module), each running task with its task stack and its CPU's typed
per-CPU stacks, every blocked task (walked from ``init_task.tasks``) with its
saved context and task stack trimmed to ``[sp, top)``, the function-graph
return stack and kretprobe/rethook instances per task, and VMCOREINFO read
from guest memory. Layouts come from the vmlinux's BTF; symbols from its
``.symtab``.
"""

from __future__ import annotations

import importlib
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
from elftools.elf.elffile import ELFFile

from unwind.kernel.btf import Btf, BtfError
from unwind.kernel.model import Kernel, KernelError, KernelTask, field_int, ftrace_trampolines, thread_size
from unwind.formats.note_info import trampoline_json
from unwind.core.memory import MemoryFault
from .fetch import build_id
from .rsp import RspClient, RspMemoryError

#: our arch name -> lab module (imported lazily: the backend packages own arch/)
LAB_MODULES = {"x86_64": "unwind.arch.x86_64.lab", "arm64": "unwind.arch.arm64.lab",
               "riscv": "unwind.arch.riscv.lab"}
#: ELF e_machine -> our arch name
MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "arm64", "EM_RISCV": "riscv"}
MAX_TASKS = 4096


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


class Image:
    """What capture needs from the vmlinux: arch, build-id, symbols (with sizes), BTF."""

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
            self.symbols: dict[str, tuple[int, int]] = {}
            for name_off, value, size, info in zip(syms["name"].tolist(), syms["value"].tolist(),
                                                   syms["size"].tolist(), syms["info"].tolist()):
                if not name_off or value == 0:
                    continue
                end = strtab.index(b"\0", name_off)
                name = strtab[name_off:end].decode(errors="replace")
                # prefer global definitions over file-local duplicates
                if name not in self.symbols or info >> 4 == 1:
                    self.symbols[name] = (value, size)
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
            return self.symbols[name][0]
        except KeyError:
            raise CaptureError(f"symbol {name} not in {self.path.name}") from None

    def get(self, name: str) -> int | None:
        """Address of ``name`` or None."""
        v = self.symbols.get(name)
        return v[0] if v else None

    def size(self, name: str) -> int:
        """st_size of ``name`` (0 when unknown)."""
        v = self.symbols.get(name)
        return v[1] if v else 0


class _GuestMemory:
    """The session's guest memory as :class:`unwind.kernel.model.Kernel` reads it (faults as MemoryFault)."""

    def __init__(self, session: "Session") -> None:
        self.session = session

    def read(self, addr: int, size: int) -> bytes:
        try:
            return self.session.read(addr, size)
        except RspMemoryError:
            raise MemoryFault(addr, size) from None

    def read_u64(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")


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
    skip_reason: str | None = None


@dataclass
class StopResult:
    """A captured stop: the writer inputs as plain data."""

    memory: dict[int, bytes] = field(default_factory=dict)
    cpus: list[CpuStop] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


class Session:
    """A GDB-stub connection plus the vmlinux knowledge to read the kernel behind it."""

    def __init__(self, rsp: RspClient, image: Image, log: Callable[[str], None] | None = None) -> None:
        self.rsp = rsp
        self.img = image
        self.btf = image.btf
        self.arch = image.arch
        self.lab = arch_lab(self.arch)
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.threads = rsp.threads()
        if not self.threads:
            raise CaptureError("the stub reports no threads")
        self.ncpu = len(self.threads)
        self.mem_tid = self.threads[0]
        try:
            self.thread_size = thread_size(image.btf, image.get)
        except KernelError as e:
            raise CaptureError(str(e)) from None
        self.per_cpu_offset: list[int] = []
        self.hw_cpu_ids: list[int] | None = None
        self.vmcoreinfo = ""
        self._tsize = self.btf.sizeof("task_struct")
        self._kernel: Kernel | None = None

    # -- memory through a vCPU that can read kernel addresses ----------------
    def read(self, addr: int, size: int) -> bytes:
        """Guest memory through the memory thread."""
        self.rsp.select_thread(self.mem_tid)
        return self.rsp.read_memory(addr, size)

    def read_u64(self, addr: int) -> int:
        """A 64-bit word of guest memory."""
        return int.from_bytes(self.read(addr, 8), "little")

    def read_u32(self, addr: int) -> int:
        """A 32-bit word of guest memory."""
        return int.from_bytes(self.read(addr, 4), "little")

    def percpu_addr(self, sym: str, cpu: int) -> int:
        """Address of per-CPU variable ``sym`` on ``cpu``."""
        return (self.img.addr(sym) + self.per_cpu_offset[cpu]) & (2**64 - 1)

    def symbol(self, name: str) -> int | None:
        """Address of ``name`` or None (the arch ``kernel`` hooks' reader surface)."""
        return self.img.get(name)

    def var_size(self, name: str) -> int:
        """``st_size`` of the variable ``name`` (0 when unknown)."""
        return self.img.size(name)

    def readable(self, addr: int) -> bool:
        """Can one word at ``addr`` be read?"""
        try:
            self.read(addr, 8)
            return True
        except RspMemoryError:
            return False

    def halt_where_kernel_readable(self, tries: int = 20) -> None:
        """Pick a memory thread whose MMU maps the kernel, resuming briefly until a vCPU does.

        A vCPU halted in firmware (riscv M-mode in OpenSBI) reads kernel addresses as physical ones.
        """
        probe = self.img.addr("init_task")
        for _ in range(tries):
            for tid in self.threads:
                self.mem_tid = tid
                if self.readable(probe):
                    return
            self.rsp.cont()
            time.sleep(0.2)
            self.rsp.halt()
        raise CaptureError(f"no vCPU reads kernel memory (init_task) in {tries} halts")

    # -- once per session ----------------------------------------------------
    def setup(self) -> None:
        """Per-CPU offsets, VMCOREINFO and the build-id check (needs a stopped guest)."""
        self.halt_where_kernel_readable()
        nr = self.img.get("nr_cpu_ids")
        ncpu = min(self.ncpu, self.read_u32(nr)) if nr else self.ncpu
        base = self.img.addr("__per_cpu_offset")
        data = self.read(base, 8 * ncpu)
        self.per_cpu_offset = [int.from_bytes(data[i * 8:i * 8 + 8], "little") for i in range(ncpu)]
        if hasattr(self.lab, "hw_cpu_ids"):
            self.hw_cpu_ids = self.lab.hw_cpu_ids(self, ncpu)
        ptr = self.read_u64(self.img.addr("vmcoreinfo_data"))
        size = self.read_u64(self.img.addr("vmcoreinfo_size"))
        if ptr and 0 < size < 1 << 16:
            self.vmcoreinfo = self.read(ptr, size).decode(errors="replace").rstrip("\0")
        self.check_build_id()

    def running_build_id(self) -> str | None:
        """The build-id of the running kernel (VMCOREINFO ``BUILD-ID``, else its ``.notes``)."""
        for line in self.vmcoreinfo.splitlines():
            if line.startswith("BUILD-ID="):
                return line.split("=", 1)[1].strip()
        if self.img.notes_addr and self.img.notes_data:
            live = self.read(self.img.notes_addr, len(self.img.notes_data))
            return self.img.build_id if live == self.img.notes_data else ""
        return None

    def check_build_id(self) -> None:
        """Refuse a vmlinux that is not the running kernel."""
        try:
            live = self.running_build_id()
        except RspMemoryError:
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
        for index, tid in enumerate(self.threads[: len(self.per_cpu_offset) or self.ncpu]):
            self.rsp.select_thread(tid)
            raw = self.rsp.read_registers(self.lab.SYSREGS)
            mode, regs, note = self.lab.classify(raw, self)
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
            cpu = self.task_fields(c.current, self.read(c.current, self._tsize))["cpu"]
        except RspMemoryError:
            return None
        if cpu is None or cpu == c.cpu:
            return None
        return f"vCPU {c.tid} numbered cpu{c.cpu} ({c.cpu_from}) runs a task whose cpu is {cpu}"

    def pick_memory_thread(self, cpus: list[CpuStop]) -> bool:
        """Use a vCPU whose MMU view reads kernel addresses; False if none can."""
        probe = self.img.addr("init_task")
        order = [c for c in cpus if c.mode == "kernel"] + [c for c in cpus if c.mode != "kernel"]
        for c in order:
            self.mem_tid = c.tid
            if self.readable(probe):
                return True
        return False

    def task_fields(self, task: int, tb: bytes) -> dict[str, Any]:
        """pid, comm, state, stack, on_cpu and cpu of a task from its bytes."""
        b = self.btf

        def u(path: str, size: int | None = None) -> int:
            m = b.member("task_struct", path)
            n = size or m.size
            return int.from_bytes(tb[m.offset:m.offset + n], "little")

        comm_m = b.member("task_struct", "comm")
        comm = tb[comm_m.offset:comm_m.offset + comm_m.size].split(b"\0")[0].decode(errors="replace")
        cpu = None
        for p in ("thread_info.cpu", "cpu"):
            try:
                cpu = u(p, 4)
                break
            except BtfError:
                continue
        state = u("__state", 4)
        exit_state = u("exit_state", 4)
        return {"pid": u("pid", 4), "comm": comm, "state": _state_char(state | exit_state),
                "stack": u("stack", 8), "on_cpu": u("on_cpu", 4), "cpu": cpu,
                "switches": u("nvcsw", 8) + u("nivcsw", 8)}

    def fgraph(self, tb: bytes) -> tuple[list[dict[str, str]], tuple[int, bytes] | None]:
        """The function-graph return stack (bottom to top) as :class:`unwind.kernel.model.Kernel` reads it
        (6.11+ tagged words or the older ``ftrace_ret_stack`` array), and the raw bytes it spans."""
        b = self.btf
        if not (_has(b, "task_struct", "ret_stack") and _has(b, "task_struct", "curr_ret_stack")):
            return [], None
        if self._kernel is None:
            self._kernel = Kernel(_GuestMemory(self), b, self.img.get)
        task = KernelTask(0, 0, 0, "", "", 0, 0, 0, 0, data=tb)
        entries = self._kernel.fgraph(task)
        if not entries:
            return [], None
        ptr = field_int(b, tb, "task_struct", "ret_stack")
        curr = field_int(b, tb, "task_struct", "curr_ret_stack", signed=True)
        # tagged words: curr_ret_stack words; the older array: curr_ret_stack + 1 entries
        span = max(curr * 8, len(entries) * b.sizeof("ftrace_ret_stack"))
        fields = [n for n in ("ret", "func", "retp", "fp") if _has(b, "ftrace_ret_stack", n)]
        out = [{n: _hex(getattr(e, n)) for n in fields} for e in entries]
        return out, (ptr, self.read(ptr, span))

    def kretprobes(self, tb: bytes) -> list[dict[str, str]]:
        """kretprobe (``kretprobe_instances``) or rethook (``rethooks``) instances, newest first."""
        b = self.btf
        for head, node_t, ret_f, fp_f in (("kretprobe_instances", "kretprobe_instance", "ret_addr", "fp"),
                                          ("rethooks", "rethook_node", "ret_addr", "frame")):
            if not all(_has(b, st, f) for st, f in (("task_struct", head), (node_t, "llist"),
                                                     (node_t, ret_f), (node_t, fp_f))):
                continue
            m = b.member("task_struct", head)
            node = int.from_bytes(tb[m.offset:m.offset + 8], "little")
            llist = b.offsetof(node_t, "llist")
            ro, fo = b.offsetof(node_t, ret_f), b.offsetof(node_t, fp_f)
            out = []
            while node and len(out) < 256:
                base = node - llist
                data = self.read(base, max(ro, fo) + 8)
                out.append({"ret": _hex(int.from_bytes(data[ro:ro + 8], "little")),
                            "fp": _hex(int.from_bytes(data[fo:fo + 8], "little"))})
                node = self.read_u64(node)
            return out
        return []

    def walk_tasks(self) -> list[int]:
        """Every task in ``init_task.tasks`` (init_task first) plus its threads."""
        off = self.btf.offsetof("task_struct", "tasks")
        init = self.img.addr("init_task")
        out, seen = [init], {init}
        node = self.read_u64(init + off)
        while node != init + off and len(out) < MAX_TASKS:
            t = node - off
            if t in seen:
                break
            seen.add(t)
            out.append(t)
            node = self.read_u64(node)
        return out

    def capture_stop(self, kind: str, hit_tid: str | None = None) -> StopResult | str:
        """Capture the stopped guest; a string is the reason the stop was skipped."""
        t0 = time.monotonic()
        res = StopResult()
        cpus = self.read_cpus()
        if not self.pick_memory_thread(cpus):
            return "no vCPU can read kernel memory (all in user/firmware mode)"
        if not any(c.mode == "kernel" for c in cpus):
            return "no vCPU in kernel mode"
        current: dict[int, int] = {}
        for c in cpus:
            try:
                task, src = self.lab.current_task(self, c.cpu, c.raw)
            except RspMemoryError:
                task, src = 0, "unreadable"
            c.current, c.current_src = task, src
            if task:
                current[task] = c.cpu
            mismatch = self.check_cpu(c)
            if mismatch:
                self.log(f"[capture] warning: {mismatch}")
        tasks = self.walk_tasks()
        for task in current:
            if task not in tasks:
                tasks.append(task)  # idle tasks of other CPUs are not on the list
        stacks_meta: list[dict[str, Any]] = []
        task_meta: list[dict[str, Any]] = []
        unreadable = 0
        for task in tasks:
            try:
                entry = self._capture_task(task, current, cpus, res, stacks_meta)
            except RspMemoryError:
                unreadable += 1
                continue
            if entry is not None:
                task_meta.append(entry)
        for c in cpus:
            for skind, plo, phi in self.lab.percpu_stacks(self, c.cpu):
                stacks_meta.append({"kind": skind, "low": _hex(plo), "high": _hex(phi), "cpu": c.cpu,
                                    "pid": None})
        cpu_meta = []
        for c in cpus:
            pid = next((t["pid"] for t in task_meta if t["cpu"] == c.cpu), None)
            cpu_meta.append({"cpu": c.cpu, "cpu_from": c.cpu_from, "pid": pid, "mode": c.mode,
                             "sysregs": {k: _hex(c.raw[k]) for k in self.lab.SYSREGS if k in c.raw},
                             "normalised": c.normalised, "current": _hex(c.current),
                             "current_from": c.current_src,
                             "hit": hit_tid == c.tid if hit_tid else None})
        res.cpus = cpus
        res.meta = {"cpus": cpu_meta, "stacks": stacks_meta, "tasks": task_meta,
                    "ftrace_trampolines": self.ftrace_trampolines(),
                    "capture": {"tool": "unwind capture", "kind": kind, "time": time.time(),
                                "unreadable_tasks": unreadable}}
        res.seconds = time.monotonic() - t0
        res.meta["capture"]["seconds"] = round(res.seconds, 3)
        return res

    def _capture_task(self, task: int, current: dict[int, int], cpus: list[CpuStop], res: StopResult,
                      stacks_meta: list[dict[str, Any]]) -> dict[str, Any] | None:
        """One task's JSON entry; its stack bytes go into ``res.memory``."""

        def add_mem(lo: int, hi: int) -> None:
            if hi <= lo:
                return
            try:
                res.memory[lo] = self.read(lo, hi - lo)
            except RspMemoryError:
                pass

        tb = self.read(task, self._tsize)
        f = self.task_fields(task, tb)
        lo, hi = f["stack"], f["stack"] + self.thread_size
        cpu = current.get(task)
        if task == self.img.addr("init_task") and cpu is None:
            return None  # swapper/0 is the list head; only interesting when running
        entry: dict[str, Any] = {"pid": f["pid"], "comm": f["comm"], "state": f["state"],
                                 "cpu": cpu, "task": _hex(task), "switches": f["switches"]}
        stacks_meta.append({"kind": "task", "low": _hex(lo), "high": _hex(hi), "cpu": cpu,
                            "pid": f["pid"]})
        if cpu is None:
            if f["on_cpu"]:
                entry["note"] = "on_cpu but no stopped vCPU runs it (switching)"
            ctx = self.lab.blocked_context(self, task, tb)
            entry["context"] = {k: _hex(v) for k, v in ctx.items()}
            sp = ctx["sp"]  # every arch's saved context names its stack pointer "sp"
            if lo <= sp <= hi:
                add_mem(sp, hi)
            else:
                entry["note"] = f"saved sp {sp:#x} is off its stack"
        else:
            c = next(c for c in cpus if c.cpu == cpu)
            _, sp = self.lab.pc_sp(c.regs)
            if c.mode != "kernel":
                entry["mode"] = c.mode
            if lo <= sp <= hi:
                add_mem(sp, hi)
            else:
                add_mem(lo, hi)
                for kind, plo, phi in self.lab.percpu_stacks(self, cpu):
                    if plo <= sp <= phi:
                        add_mem(sp, phi)
                    elif kind == "irq":
                        add_mem(plo, phi)  # an exception on top of an IRQ needs both
        fg, raw = self.fgraph(tb)
        if fg:
            entry["fgraph"] = fg
            res.memory[raw[0]] = raw[1]
        kr = self.kretprobes(tb)
        if kr:
            entry["kretprobes"] = kr
        return entry

    def ftrace_trampolines(self) -> list[dict[str, Any]]:
        """Dynamically allocated ftrace trampolines (``ftrace_ops_list``): where each starts, its size,
        and whether it is a copy of ``ftrace_regs_caller`` (SAVE_REGS) or ``ftrace_caller``.

        The x86 ORC unwinder maps a pc in a trampoline back to the copied code (``orc_ftrace_find``).
        """
        return [trampoline_json(t) for t in ftrace_trampolines(self)]

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
        from unwind.core import registry
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


def _has(b: Btf, struct: str, member: str) -> bool:
    try:
        b.member(struct, member)
        return True
    except BtfError:
        return False


def _state_char(state: int) -> str:
    """The letter ps/sysrq print for a task state word."""
    if state == 0:
        return "R"
    if state & 0x402 == 0x402:
        return "I"
    for bit, ch in ((1, "S"), (2, "D"), (4, "T"), (8, "t"), (0x10, "X"), (0x20, "Z"), (0x80, "D")):
        if state & bit:
            return ch
    return "?"


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


def default_breaks(lab: ModuleType, img: Image) -> list[tuple[str, str]]:
    """IRQ-context, syscall-entry and hijack-live breakpoints known for the arch (present ones)."""
    out = []
    for kind, names in (("irq", lab.IRQ_BREAKS), ("syscall-entry", lab.SYSCALL_ENTRY),
                        ("hijack", lab.HIJACK_BREAKS)):
        out += [(kind, n) for n in names if img.get(n)]
    return out


class SysrqOracle:
    """sysrq-t through the guest's serial console, checked for tasks that ran meanwhile."""

    def __init__(self, console, smap, timeout: float = 120.0) -> None:
        self.console = console
        self.smap = smap
        self.timeout = timeout

    def collect(self, s: Session, res: StopResult) -> tuple[list[dict], str]:
        """Resume, trigger sysrq-t, stop again; oracle entries for the stop in ``res``."""
        from .oracles import sysrq_oracles

        mark = self.console.mark()
        s.rsp.cont()
        self.console.type("echo t > /proc/sysrq-trigger")
        text = ""
        try:
            text = self.console.wait_for(mark, r"Showing busy workqueues",
                                         self.timeout, quiet=1.5)
        finally:
            s.rsp.halt()
        _repick_memory_thread(s)
        ents = sysrq_oracles(text, self.smap)
        by_pid = {t["pid"]: t for t in res.meta["tasks"]}
        off = s.btf.offsetof("task_struct", "nvcsw")
        off2 = s.btf.offsetof("task_struct", "nivcsw")
        stale = 0
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
            task = int(t["task"], 16)
            try:
                now = s.read_u64(task + off) + s.read_u64(task + off2)
            except RspMemoryError:
                now = -1
            if now != t["switches"]:
                e["stale"] = True
                e["why"] = f"ran between capture and sysrq ({now - t['switches']} switches)"
                stale += 1
        return ents, f"sysrq-t: {len(ents)} tasks, {stale} stale"

    def regs_printer_stop(self, s: Session, timeout: float) -> tuple[StopResult, bytes, str] | str:
        """sysrq-l with a breakpoint on the arch's regs printer: capture the first CPU that reaches it
        with a ``struct pt_regs``, record those registers, then store the trace the kernel prints."""
        from .oracles import parse_regs_backtrace

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
        mode, regs = s.lab.regs_from_pt_regs(s, ptr)
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
                res.memory[psp] = s.read(psp, hi - psp)
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

    def _run(self, s: Session, cmd: str, done: str = "UNWIND-FT-DONE") -> str:
        """Type ``cmd`` into the running guest's shell; its output (up to an end mark)."""
        mark = self.console.mark()
        # the echoed command shows the mark split ('X''Y'), only the shell's output has it whole
        half = len(done) // 2
        self.console.type(f"{cmd}; echo {done[:half]}''{done[half:]}")
        text = self.console.wait_for(mark, rf"^{done}\b", self.timeout, quiet=0.3)
        return text

    def setup(self, s: Session) -> None:
        """Create the instance and enable the filtered event (guest running)."""
        i, ev = FTRACE_INSTANCE, f"{FTRACE_INSTANCE}/events/{self.event}"
        self._run(s, f"mkdir -p {i} && echo 1 > {i}/options/sym-offset && echo 1 > {i}/options/sym-addr && "
                     f"echo '{self.never}' > {ev}/filter && echo 1 > {ev}/enable")
        self.ready = True

    def stop(self, s: Session, timeout: float) -> tuple[StopResult, bytes, str] | str:
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
        _, regs, _ = s.lab.classify(raw, s)
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
        _repick_memory_thread(s)
        from .oracles import parse_ftrace_stack

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


def run_capture(s: Session, plan: Plan, out: Path, release: str, qemu: str = "",
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

    from .oracles import gdb_backtraces

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


def _repick_memory_thread(s: "Session") -> None:
    """After a resume and halt, the vCPU used for memory reads may be in user/firmware mode: pick one
    that is in the kernel, letting the guest run briefly between tries."""
    for _ in range(10):
        if s.pick_memory_thread(s.read_cpus()):
            break
        s.rsp.cont()
        time.sleep(0.05)
        s.rsp.halt()


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

    from .oracles import SystemMap, parse_ftrace_stack, parse_regs_backtrace, parse_task_traces

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

