"""A synthetic arm64 kernel laid out by construction: BTF, symbols and memory whose answers are known.

Two generations, with different member names and offsets, so nothing in the
reader can lean on one layout: ``new`` (6.12-like: ``__state``,
``thread_info.cpu``, ``signal->thread_head``, word-tagged ``ret_stack``,
``rethooks``, ``mem[]``) and ``old`` (``state``, ``task_struct.cpu``,
``thread_group``, an array of ``ftrace_ret_stack``, ``kretprobe_instances``,
``core_layout``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from unwind.kernel.btf import Btf
from unwind.core.memory import Memory, Segment

from .btfgen import BtfBuilder

CTX = ("x19", "x20", "x21", "x22", "x23", "x24", "x25", "x26", "x27", "x28", "fp", "sp", "pc")
THREAD_SIZE = 0x4000
IMAGE = 0xFFFF800080000000
HEAP = 0xFFFF000010000000
VMALLOC = 0xFFFF800090000000
PERCPU = 0xFFFF0000F0000000


@dataclass
class SynthTask:
    pid: int
    tgid: int
    comm: str
    state: int
    cpu: int = 0
    exit_state: int = 0
    threads: list["SynthTask"] = field(default_factory=list)
    fgraph: list[tuple[int, int, int]] = field(default_factory=list)  # (ret, func, retp)
    kretprobes: list[tuple[int, int]] = field(default_factory=list)   # (ret_addr, frame), newest first
    addr: int = 0
    stack: int = 0
    ctx: dict[str, int] = field(default_factory=dict)
    #: its real_parent (None: init_task) and whether PF_KTHREAD is set in its flags
    parent: "SynthTask | None" = None
    kthread: bool = False


class SynthKernel:
    """Build memory, symbols and BTF; ``tasks``/``idle``/``curr`` say what a reader must find."""

    def __init__(self, gen: str = "new", ncpu: int = 2, module_orc: bool = False) -> None:
        self.gen = gen
        #: ``struct module`` has x86-64's ``arch.orc_unwind_ip``/``orc_unwind``/``num_orcs`` (``new`` only)
        self.module_orc = module_orc and gen == "new"
        self.ncpu = ncpu
        self.segs: dict[int, bytearray] = {}
        self.symbols: dict[str, int] = {}
        self._heap = HEAP
        self._vmalloc = VMALLOC
        self._btf()
        self.percpu_offset = [PERCPU + cpu * 0x100000 - 0xFFFF800081000000 for cpu in range(ncpu)]

    # -- layout ---------------------------------------------------------------
    def _btf(self) -> None:
        b = BtfBuilder()
        old = self.gen == "old"
        lh = b.struct("list_head", 16, [("next", b.voidp, 0), ("prev", b.voidp, 8)])
        comm = b.array(b.char, 16)
        ctx = b.struct("cpu_context", 13 * 8, [(r, b.long, i * 8) for i, r in enumerate(CTX)])
        thread = b.struct("thread_struct", 0x100, [("cpu_context", ctx, 0x10)])
        ti = b.struct("thread_info", 0x20, [("flags", b.long, 0)] + ([] if old else [("cpu", b.u32, 0x18)]))
        shift = 0x40 if old else 0  # the old layout moves every member
        members = [("thread_info", ti, 0), ("stack", b.voidp, 0x20 + shift), ("pid", b.u32, 0x30 + shift),
                   ("tgid", b.u32, 0x34 + shift), ("exit_state", b.u32, 0x38 + shift),
                   ("on_cpu", b.u32, 0x3C + shift), ("tasks", lh, 0x48 + shift), ("signal", b.voidp, 0x60 + shift),
                   ("comm", comm, 0x80 + shift), ("nvcsw", b.long, 0x90 + shift), ("nivcsw", b.long, 0x98 + shift),
                   ("curr_ret_stack", b.u32, 0xA0 + shift), ("ret_stack", 0, 0xA8 + shift),
                   ("flags", b.u32, 0x140), ("real_parent", 0, 0x148), ("thread", thread, 0x200)]
        frs_members = [("ret", b.long, 0), ("func", b.long, 8), ("calltime", b.long, 16), ("retp", b.long, 24)]
        frs = b.struct("ftrace_ret_stack", 32, frs_members)
        members[-4] = ("ret_stack", b.ptr(frs if old else b.long), 0xA8 + shift)
        if old:
            members += [("state", b.long, 0x18 + shift), ("cpu", b.u32, 0x1C + shift),
                        ("thread_group", lh, 0xB0 + shift), ("kretprobe_instances", b.voidp, 0xC0 + shift)]
            b.struct("kretprobe_instance", 0x30, [("llist", b.voidp, 0x8), ("ret_addr", b.long, 0x10),
                                                  ("fp", b.long, 0x18)])
        else:
            members += [("__state", b.u32, 0x40), ("thread_node", lh, 0xB0), ("rethooks", b.voidp, 0xC0)]
            b.struct("rethook_node", 0x30, [("rcu", lh, 0), ("llist", b.voidp, 0x10), ("ret_addr", b.long, 0x18),
                                            ("frame", b.long, 0x20)])
            b.struct("signal_struct", 0x40, [("nr_threads", b.u32, 0), ("thread_head", lh, 0x10)])
        parent = b.ptr(len(b.types) + 2)  # struct task_struct *, the struct added next
        members = [(n, parent if n == "real_parent" else tid, off) for n, tid, off in members]
        b.struct("task_struct", 0x400, members)
        b.struct("rq", 0x100, [("nr_running", b.u32, 0), ("curr", b.voidp, 0x40), ("idle", b.voidp, 0x48)])
        b.var("overflow_stack", b.array(b.long, 512))
        # modules
        sym = b.struct("elf64_sym", 24, [("st_name", b.u32, 0), ("st_value", b.long, 8)])
        b.struct("mod_kallsyms", 32, [("symtab", b.ptr(sym), 0), ("num_symtab", b.u32, 8), ("strtab", b.voidp, 16),
                                      ("typetab", b.voidp, 24)])
        name = b.array(b.char, 56)
        if old:
            layout = b.struct("module_layout", 0x20, [("base", b.voidp, 0), ("size", b.u32, 8)])
            b.struct("module", 0x200, [("state", b.u32, 0), ("list", lh, 8), ("name", name, 0x18),
                                       ("core_layout", layout, 0x80), ("init_layout", layout, 0xA0),
                                       ("kallsyms", b.voidp, 0x100)])
        else:
            mm = b.struct("module_memory", 0x20, [("base", b.voidp, 0), ("size", b.u32, 8)])
            b.enum("mod_mem_type", {"MOD_TEXT": 0, "MOD_DATA": 1, "MOD_RODATA": 2, "MOD_RO_AFTER_INIT": 3,
                                    "MOD_INIT_TEXT": 4, "MOD_INIT_DATA": 5, "MOD_INIT_RODATA": 6})
            arch = []
            if self.module_orc:  # x86-64's struct mod_arch_specific, and its 6-byte struct orc_entry
                b.struct("orc_entry", 6, [("sp_offset", b.u32, 0)])
                arch = [("arch", b.struct("mod_arch_specific", 0x18, [
                    ("num_orcs", b.u32, 0), ("orc_unwind_ip", b.voidp, 8), ("orc_unwind", b.voidp, 0x10)]), 0x1A0)]
            b.struct("module", 0x200, [("state", b.u32, 0), ("list", lh, 8), ("name", name, 0x18),
                                       ("mem", b.array(mm, 7), 0x60), ("kallsyms", b.voidp, 0x180), *arch])
        self.btf = Btf(b.blob())

    # -- memory -----------------------------------------------------------------
    def alloc(self, size: int, where: str = "heap") -> int:
        if where == "heap":
            addr, self._heap = self._heap, self._heap + (size + 0xFFF & ~0xFFF) + 0x1000
        else:
            addr, self._vmalloc = self._vmalloc, self._vmalloc + size + 0x4000
        self.segs[addr] = bytearray(size)
        return addr

    def define(self, name: str, size: int, addr: int | None = None) -> int:
        addr = addr if addr is not None else IMAGE + 0x100000 * (len(self.symbols) + 1)
        self.segs[addr] = bytearray(size)
        self.symbols[name] = addr
        return addr

    def write(self, addr: int, data: bytes) -> None:
        for start, buf in self.segs.items():
            if start <= addr and addr + len(data) <= start + len(buf):
                buf[addr - start:addr - start + len(data)] = data
                return
        raise AssertionError(f"write outside every object at {addr:#x}")

    def u64(self, addr: int, v: int) -> None:
        self.write(addr, struct.pack("<Q", v & (2**64 - 1)))

    def u32(self, addr: int, v: int) -> None:
        self.write(addr, struct.pack("<I", v & 0xFFFFFFFF))

    def off(self, s: str, path: str) -> int:
        return self.btf.offsetof(s, path)

    def memory(self) -> Memory:
        return Memory([Segment(a, bytes(d)) for a, d in self.segs.items()])

    def symbol(self, name: str) -> int | None:
        return self.symbols.get(name)

    # -- objects ----------------------------------------------------------------
    def task(self, t: SynthTask, addr: int | None = None) -> int:
        t.addr = addr if addr is not None else self.alloc(0x400)
        t.stack = self.alloc(THREAD_SIZE, "vmalloc")
        o = lambda p: t.addr + self.off("task_struct", p)  # noqa: E731
        self.u32(o("pid"), t.pid)
        self.u32(o("tgid"), t.tgid)
        self.write(o("comm"), t.comm.encode()[:15])
        self.u32(o("state" if self.gen == "old" else "__state"), t.state)
        self.u32(o("exit_state"), t.exit_state)
        self.u32(o("cpu" if self.gen == "old" else "thread_info.cpu"), t.cpu)
        self.u64(o("stack"), t.stack)
        self.u64(o("nvcsw"), t.pid * 3)
        self.u32(o("flags"), 0x00200000 if t.kthread else 0x00400000)  # PF_KTHREAD, else PF_FORKNOEXEC
        t.ctx = {r: t.addr + i for i, r in enumerate(CTX)}
        t.ctx["sp"] = t.stack + THREAD_SIZE - 0x100
        for r, v in t.ctx.items():
            self.u64(o(f"thread.cpu_context.{r}"), v)
        self._fgraph(t, o)
        self._kretprobes(t, o)
        return t.addr

    def _fgraph(self, t: SynthTask, o) -> None:  # type: ignore[no-untyped-def]
        if not t.fgraph:
            self.u32(o("curr_ret_stack"), 0xFFFFFFFF if self.gen == "old" else 0)
            return
        buf = self.alloc(0x1000)
        self.u64(o("ret_stack"), buf)
        if self.gen == "old":  # ret_stack[0 .. curr_ret_stack]
            for i, (ret, func, retp) in enumerate(t.fgraph):
                self.write(buf + i * 32, struct.pack("<4Q", ret, func, 0, retp))
            self.u32(o("curr_ret_stack"), len(t.fgraph) - 1)
            return
        words: list[int] = [0]  # a reserved word, as fgraph.c keeps
        for ret, func, retp in t.fgraph:  # each frame: 4 words of ftrace_ret_stack, then its tag word
            words += [ret, func, 0, retp, (1 << 10) | 4]
        self.write(buf, struct.pack(f"<{len(words)}Q", *words))
        self.u32(o("curr_ret_stack"), len(words))

    def _kretprobes(self, t: SynthTask, o) -> None:  # type: ignore[no-untyped-def]
        node_t, fp_f, head = (("kretprobe_instance", "fp", "kretprobe_instances") if self.gen == "old"
                              else ("rethook_node", "frame", "rethooks"))
        prev = 0
        for ret, fp in reversed(t.kretprobes):
            n = self.alloc(0x30)
            self.u64(n + self.off(node_t, "ret_addr"), ret)
            self.u64(n + self.off(node_t, fp_f), fp)
            self.u64(n + self.off(node_t, "llist"), prev)
            prev = n + self.off(node_t, "llist")
        self.u64(o(head), prev)

    def module(self, name: str, text: int, size: int, symbols: list[tuple[int, str]],
               orc: tuple[bytes, bytes] | None = None) -> int:
        """A LIVE module whose text is ``[text, text + size)`` with ``symbols`` (value, name) in its kallsyms
        and (with :attr:`module_orc`) ``orc``: the bytes of its ``orc_unwind_ip`` and ``orc_unwind`` tables."""
        m = self.alloc(0x200)
        if orc is not None:
            ips, entries = orc
            for member, table in (("orc_unwind_ip", ips), ("orc_unwind", entries)):
                at = self.alloc(len(table))
                self.write(at, table)
                self.u64(m + self.off("module", f"arch.{member}"), at)
            self.u32(m + self.off("module", "arch.num_orcs"), len(ips) // 4)
        self.write(m + self.off("module", "name"), name.encode())
        if self.gen == "old":
            self.u64(m + self.off("module", "core_layout.base"), text)
            self.u32(m + self.off("module", "core_layout.size"), size)
        else:
            self.u64(m + self.off("module", "mem[0].base"), text)
            self.u32(m + self.off("module", "mem[0].size"), size)
        strtab = self.alloc(0x1000)
        blob = b"\0" + b"".join(n.encode() + b"\0" for _, n in symbols)
        self.write(strtab, blob)
        symtab = self.alloc(24 * (len(symbols) + 1))
        pos = 1
        for i, (value, n) in enumerate(symbols, 1):  # entry 0 is the null symbol
            self.write(symtab + 24 * i, struct.pack("<IBBHQQ", pos, 0x12, 0, 1, value, 0))
            pos += len(n) + 1
        ks = self.alloc(32)
        self.u64(ks + self.off("mod_kallsyms", "symtab"), symtab)
        self.u32(ks + self.off("mod_kallsyms", "num_symtab"), len(symbols) + 1)
        self.u64(ks + self.off("mod_kallsyms", "strtab"), strtab)
        self.u64(m + self.off("module", "kallsyms"), ks)
        return m

    def link(self, head: int, nodes: list[int]) -> None:
        """A list_head ring: head -> nodes... -> head."""
        ring = [head, *nodes]
        for i, n in enumerate(ring):
            self.u64(n, ring[(i + 1) % len(ring)])
            self.u64(n + 8, ring[i - 1])

    def build(self, procs: list[SynthTask], curr: list[SynthTask | None]) -> tuple[list[SynthTask], list[int]]:
        """init_task + ``procs`` (with threads); per-CPU runqueues whose ``curr`` are ``curr`` (None: idle)."""
        init = SynthTask(0, 0, "swapper/0", 0, kthread=True)
        self.define("init_task", 0x400)
        self.task(init, self.symbols["init_task"])
        idle = [init] + [SynthTask(0, 0, f"swapper/{c}", 0, cpu=c, kthread=True) for c in range(1, self.ncpu)]
        for t in idle[1:]:
            self.task(t)
        for p in procs:
            self.task(p)
            for th in p.threads:
                self.task(th)
        for t in [*idle, *(x for p in procs for x in (p, *p.threads))]:
            self.u64(t.addr + self.off("task_struct", "real_parent"), (t.parent or init).addr)
        tasks_off = self.off("task_struct", "tasks")
        self.link(init.addr + tasks_off, [p.addr + tasks_off for p in procs])
        for p in [init, *procs]:
            group = [p, *p.threads]
            if self.gen == "old":
                off = self.off("task_struct", "thread_group")
                self.link(p.addr + off, [th.addr + off for th in p.threads])
            else:
                sig = self.alloc(0x40)
                for th in group:
                    self.u64(th.addr + self.off("task_struct", "signal"), sig)
                off = self.off("task_struct", "thread_node")
                self.link(sig + self.off("signal_struct", "thread_head"), [th.addr + off for th in group])
        pco = self.define("__per_cpu_offset", 8 * self.ncpu)
        for c, v in enumerate(self.percpu_offset):
            self.u64(pco + 8 * c, v)
        self.u32(self.define("nr_cpu_ids", 4), self.ncpu)
        self.u64(self.define("__cpu_online_mask", 8), (1 << self.ncpu) - 1)
        self.symbols["init_stack"] = IMAGE + 0x40000
        self.symbols["__end_init_stack"] = IMAGE + 0x40000 + THREAD_SIZE
        self.symbols["runqueues"] = 0xFFFF800081000000
        self.symbols["irq_stack_ptr"] = 0xFFFF800081000200
        self.symbols["overflow_stack"] = 0xFFFF800081001000
        self.symbols["__entry_task"] = 0xFFFF800081000300
        self.irq_stacks = []
        for c in range(self.ncpu):
            base = self.percpu_offset[c] + 0xFFFF800081000000
            self.segs[base] = bytearray(0x2000)
            rq = base
            running = curr[c] if c < len(curr) and curr[c] is not None else idle[c]
            self.u64(rq + self.off("rq", "curr"), running.addr)
            self.u64(rq + self.off("rq", "idle"), idle[c].addr)
            self.u64(base + 0x300, running.addr)  # arm64 current: __entry_task
            irq = self.alloc(THREAD_SIZE, "vmalloc")
            self.irq_stacks.append(irq)
            self.u64(base + 0x200, irq)
        everyone = [*idle, *(x for p in procs for x in (p, *p.threads))]
        return everyone, [t.addr for t in idle]
