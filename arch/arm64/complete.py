"""Complete mode: the callers the arm64 kernel unwinder drops, recovered only where the code proves them.

The kernel continues from ``x29`` at every place it takes registers (the start
of a running CPU's walk, and each exception boundary); when the interrupted
function has not yet made ``x29`` point at its own frame record (function
entry, a prologue not finished, or a leaf that never builds one), its caller
is held only in ``x30`` and the kernel skips it. gdb shows it.

Here ``x30`` is reported as a flagged frame (``Flag.COMPLETE``,
``Source.LIVE_LR``) only when capstone disassembly of the interrupted function,
from its symbol start, shows that on every path to the pc neither ``x29`` nor
``x30`` has been written (PAC sign/authenticate hints aside):

- *leaf*: no instruction of the function writes ``x29``/``x30`` or calls; or
- *entry*: in the function's control-flow graph (direct branches, calls that
  return, tail calls and returns that end a path, an indirect branch reaching
  everything) no instruction that writes them reaches the pc; or
- *epilogue*: the pc follows ``ldp x29, x30, [sp...]`` on a straight line
  nothing else branches into (the entry's x29/x30 are back);
- and the next record the kernel reads does not already hold the same return
  address (which would mean ``x29`` did point at the function's own record).

It also reports a stop the capture normalised from an exception vector as a
marked pseudo-frame before the interrupted pc.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import capstone
from capstone import arm64 as cs_arm64

from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.core.memory import MemoryFault
from unwind.core.target import Target

from unwind.kernel.fgraph import ftrace_graph_ret_addr
from unwind.kernel.kretprobe import kretprobe_find_ret_addr

from .caller_regs import el1_pt_regs
from .ptrauth import ptrauth_strip_kernel_insn_pac

if TYPE_CHECKING:
    from .stacktrace import KunwindState

#: functions larger than this are not disassembled
MAX_FUNCTION_BYTES = 0x10000
#: the exception vector table: 16 entries of 0x80 bytes (VBAR_EL1)
VECTOR_TABLE_BYTES = 0x800

_FP, _LR = cs_arm64.ARM64_REG_X29, cs_arm64.ARM64_REG_X30
#: instructions that sign or authenticate x30 in place: its value stays the return address
_PAC_HINTS = frozenset({"paciasp", "pacibsp", "autiasp", "autibsp", "paciaz", "pacibz", "autiaz", "autibz",
                        "pacia1716", "pacib1716", "autia1716", "autib1716", "xpaclri", "hint", "bti", "nop"})
_INDIRECT_BRANCHES = frozenset({"br", "braa", "brab", "braaz", "brabz"})
#: instructions after which a path does not go on in the function
_PATH_ENDS = frozenset({"ret", "retaa", "retab", "eret", "eretaa", "eretab", "brk", "udf", "hlt"})
_HEX = re.compile(r"0x[0-9a-fA-F]+")
#: the capture's note names the stop as ``vectors+0x280 -> ELR_EL1/SPSR_EL1``
_VECTOR_OFFSET = re.compile(r"vectors\+(0x[0-9a-fA-F]+)")
_U64 = (1 << 64) - 1


@dataclass(slots=True)
class LrProof:
    """The verdict on one pc: is ``x30`` still the return address into the caller?"""

    live: bool
    reason: str
    lines: list[str] = field(default_factory=list)


def _describe(insn: Any, start: int) -> str:
    return f"+{insn.address - start:#x}: {insn.mnemonic} {insn.op_str}".rstrip()


@dataclass(slots=True)
class _Function:
    """One disassembled function: its control flow and which instructions a write to x29/x30 reaches."""

    name: str
    start: int
    size: int
    insns: list[Any]
    index: dict[int, int]
    succ: list[list[int] | None]
    writes: list[int]
    tainted: dict[int, int]  # instruction -> a write that reaches it


class LrAnalyser:
    """Decides, from the text of the image, whether x30 is live at a pc; caches each function and answer."""

    def __init__(self, target: Target) -> None:
        self.symbols = target.symbols
        image = target.image
        self.image = image if image is not None and image.has_text else None
        self._md = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
        self._md.detail = True
        self._cache: dict[int, LrProof] = {}
        self._functions: dict[int, _Function | str] = {}

    def prove(self, pc: int) -> LrProof:
        """The proof (or refusal) for ``pc``."""
        hit = self._cache.get(pc)
        if hit is None:
            hit = self._cache[pc] = self._prove(pc)
        return hit

    def _function(self, pc: int) -> _Function | str:
        """The function holding ``pc``, analysed once; a string says why it cannot be."""
        if self.symbols is None:
            return "no symbols: the interrupted function is unknown"
        if self.image is None:
            return "the image has no text to disassemble"
        sym = self.symbols.lookup(pc)
        if sym is None or sym.size <= 0:
            return f"{pc:#x} is in no function"
        hit = self._functions.get(sym.addr)
        if hit is None:
            hit = self._functions[sym.addr] = self._analyse(sym.name, sym.addr, sym.size)
        return hit

    def _analyse(self, name: str, start: int, size: int) -> _Function | str:
        if size > MAX_FUNCTION_BYTES:
            return f"{name} is {size:#x} bytes, too large to analyse"
        code = self.image.text(start, size) if self.image is not None else None
        if code is None:
            return f"no text for {name} in the image"
        insns = list(self._md.disasm(code, start))
        decoded_end = insns[-1].address + insns[-1].size if insns else start
        if decoded_end < start + size:
            return f"{name}: undecodable bytes at +{decoded_end - start:#x}"
        index = {insn.address: n for n, insn in enumerate(insns)}
        succ, writes = _control_flow(insns, index)
        return _Function(name, start, size, insns, index, succ, writes, _tainted(succ, writes))

    def _prove(self, pc: int) -> LrProof:
        fn = self._function(pc)
        if isinstance(fn, str):
            return LrProof(False, fn)
        target = fn.index.get(pc)
        if target is None:
            return LrProof(False, f"{pc:#x} is not an instruction boundary of {fn.name}")
        start, insns = fn.start, fn.insns
        lines = [f"disassembled {fn.name} ({fn.size:#x} bytes, {len(insns)} instructions) "
                 f"up to {fn.name}+{pc - start:#x}"]
        if not fn.writes:
            lines.append(f"leaf: no instruction of {fn.name} writes x29 or x30 or calls")
            return LrProof(True, "leaf", lines)
        w = fn.tainted.get(target)
        if w is not None:  # a write from which the pc can be reached: x29/x30 may differ from the entry's
            restore = _epilogue(insns, fn.succ, target)
            if restore is not None:
                lines.append(f"epilogue: {_describe(insns[restore], start)} restored the frame record and "
                             "only the straight line from it reaches the pc: "
                             + "; ".join(_describe(i, start) for i in insns[restore:target]))
                return LrProof(True, "epilogue", lines)
            return LrProof(False, f"a write to x29/x30 reaches the pc ({_describe(insns[w], start)})", lines)
        straight = insns[max(0, target - 6):target]
        lines.append("no write to x29/x30 reaches the pc on any path from the entry; before it: "
                     + ("; ".join(_describe(i, start) for i in straight) if straight else "pc is the entry"))
        lines.append(f"first write in the function: {_describe(insns[fn.writes[0]], start)}")
        return LrProof(True, "entry", lines)


def _control_flow(insns: list[Any], index: dict[int, int]) -> tuple[list[list[int] | None], list[int]]:
    """Successors of each instruction (``None``: an indirect branch, anywhere) and the x29/x30 writers.

    Calls return to the next instruction; a direct branch out of the function is a tail call; returns,
    ``brk`` and ``udf`` end a path. PAC sign/authenticate hints keep x30 the return address.
    """
    succ: list[list[int] | None] = []
    writes: list[int] = []
    for n, insn in enumerate(insns):
        mnem = insn.mnemonic
        nxt = [n + 1] if n + 1 < len(insns) else []
        if mnem == "bl" or mnem.startswith("blr"):
            out: list[int] | None = nxt
        elif mnem in _INDIRECT_BRANCHES:
            out = None
        elif mnem in _PATH_ENDS:
            out = []
        elif insn.group(cs_arm64.ARM64_GRP_JUMP):
            imms = [op.imm & _U64 for op in insn.operands if op.type == cs_arm64.ARM64_OP_IMM]
            there = [index[imms[-1]]] if imms and imms[-1] in index else []
            out = there if mnem == "b" else there + nxt
        else:
            out = nxt
        succ.append(out)
        if mnem not in _PAC_HINTS:
            _read, written = insn.regs_access()
            if _FP in written or _LR in written:
                writes.append(n)
    return succ, writes


def _epilogue(insns: list[Any], succ: list[list[int] | None], target: int) -> int | None:
    """The ``ldp x29, x30, [sp...]`` that restored the entry's x29/x30 on the straight line to ``target``.

    Between it and the pc nothing writes x29/x30, branches or calls, and no branch of the function
    lands after it up to the pc (nor may an indirect branch exist), so the pc is reached only from it.
    """
    j = target - 1
    while j >= 0:
        insn = insns[j]
        ops = insn.operands
        if (insn.mnemonic == "ldp" and len(ops) >= 3 and ops[0].reg == _FP and ops[1].reg == _LR
                and ops[2].type == cs_arm64.ARM64_OP_MEM and ops[2].mem.base == cs_arm64.ARM64_REG_SP):
            break
        if succ[j] != [j + 1] or (insn.mnemonic not in _PAC_HINTS and
                                   (_FP in insn.regs_access()[1] or _LR in insn.regs_access()[1])):
            return None
        j -= 1
    else:
        return None
    inside = set(range(j + 1, target + 1))
    for n, out in enumerate(succ):
        if out is None or (n not in range(j, target) and inside.intersection(out)):
            return None
    return j


def _tainted(succ: list[list[int] | None], writes: list[int]) -> dict[int, int]:
    """Every instruction some write reaches (after it executed), with one such write."""
    everything = range(len(succ))
    origin: dict[int, int] = {}
    work: deque[tuple[int, int]] = deque()
    for w in writes:  # breadth first: the witness is the nearest write, earliest first
        out = succ[w]
        work.extend((n, w) for n in (everything if out is None else out))
    while work:
        n, w = work.popleft()
        if n in origin:
            continue
        origin[n] = w
        out = succ[n]
        work.extend((m, w) for m in (everything if out is None else out) if m not in origin)
    return origin


class Completer:
    """Adds the frames of complete mode to one walk; faithful frames are never changed."""

    def __init__(self, target: Target, state: "KunwindState") -> None:
        self.target = target
        self.state = state
        self.analyser = LrAnalyser(target)

    # -- exception vector stops ----------------------------------------------
    def vector_frame(self) -> Frame | None:
        """The vector pc of a stop the capture normalised to ELR_EL1, as a pseudo-frame."""
        task = self.target.task
        if task.running_cpu is None:
            return None
        cpu = self.target.info.cpu(task.running_cpu)
        if cpu is None or not cpu.normalised:
            return None
        note = cpu.normalised
        text = " ".join(str(v) for v in note.values()) if isinstance(note, Mapping) else str(note)
        vbar = next((v for k, v in cpu.sysregs.items()
                     if k.upper() in ("VBAR", "VBAR_EL1")), None) or self.target.symbol_address("vectors")
        if vbar is None:
            return None
        found = [vbar + int(off, 16) for off in _VECTOR_OFFSET.findall(text)]
        found += [int(h, 16) for h in _HEX.findall(text)]
        pc = next((a for a in found if vbar <= a < vbar + VECTOR_TABLE_BYTES and a <= _U64), None)
        if pc is None:
            return None
        prov = None
        if self.state.record:
            prov = Provenance("exception vector: the CPU stopped at the vector, before the exception was saved")
            prov.note(f"capture normalised the CPU: {text}")
            prov.note(f"vector table at {vbar:#x}; entry {(pc - vbar) // 0x80} (offset {pc - vbar:#x})")
        return Frame(pc, None, None, Source.EXCEPTION_FRAME, None, Flag.COMPLETE, prov)

    # -- live LR at exception boundaries ---------------------------------------
    def after_boundary(self, frame: Frame, regs: dict[str, int] | None) -> Frame | None:
        """The x30 caller of a frame whose pc came from exception registers, if proven."""
        if regs is None or "x30" not in regs:
            return None
        return self._live_lr(frame, regs["x30"], None, "x30 of the running CPU's registers")

    def after_record(self, frame: Frame, record_at: int) -> Frame | None:
        """After a kernel step: at a pt_regs boundary, the x30 caller if proven."""
        state = self.state
        layout = state.layout
        if state.meta_records:
            if frame.source is not Source.REGS_PC or state.regs is None:
                return None
            base = state.regs
        else:
            base = record_at - layout.stackframe
            if frame.fp is None or not el1_pt_regs(state.mem, layout, base, frame.pc, frame.fp):
                return None
            if frame.provenance is not None:
                frame.provenance.note(f"this record is the {{x29, ELR}} stackframe of an EL1 pt_regs at {base:#x} "
                                      "(same pc and x29 there): the pc is the interrupted pc")
        try:
            x30 = state.mem.read_u64(base + layout.reg(30))
        except MemoryFault:
            return None
        return self._live_lr(frame, x30, base + layout.reg(30), "pt_regs.regs[30]")

    def _live_lr(self, frame: Frame, x30: int, addr: int | None, origin: str) -> Frame | None:
        """The frame of ``x30`` when the proof holds (stripped and recovered as the kernel would)."""
        state = self.state
        proof = self.analyser.prove(frame.pc)
        if not proof.live:
            if frame.provenance is not None:
                frame.provenance.note(f"complete: the x30 caller is not added: {proof.reason}")
            return None
        pc = ptrauth_strip_kernel_insn_pac(x30, state.pac_mask)
        flags = Flag.COMPLETE | (Flag.PAC_STRIPPED if pc != x30 else Flag.NONE)
        fp = state.fp
        trampoline = pc in (state.return_to_handler, state.kretprobe_trampoline)
        try:
            next_lr = state.mem.read_u64(fp + 8) if not fp & 7 and not trampoline else None
        except MemoryFault:
            next_lr = None
        # (a hijacked x30 is checked by its recovery instead: the entry must be keyed by this x29)
        if next_lr is not None and ptrauth_strip_kernel_insn_pac(next_lr, state.pac_mask) == pc:
            if frame.provenance is not None:
                frame.provenance.note(f"complete: the x30 caller is not added: the record at x29 {fp:#x} "
                                      "already returns there")
            return None
        notes: list[str] = []
        if pc == state.return_to_handler:
            orig, _idx, at = ftrace_graph_ret_addr(state.fgraph, state.graph_idx, pc, fp, pc, state.fgraph_idx)
            if orig == pc:
                return None
            notes.append(f"recovered: return_to_handler -> {orig:#x} from fgraph entry {at} (retp {fp:#x})")
            pc, flags = orig, flags | Flag.FGRAPH
        if pc == state.kretprobe_trampoline:
            orig, cur = kretprobe_find_ret_addr(state.kretprobes, fp, state.kr_cur, pc)
            if not orig:
                return None
            notes.append(f"recovered: __kretprobe_trampoline -> {orig:#x} from kretprobe instance {cur}")
            pc, flags = orig, flags | Flag.KRETPROBE
        prov = None
        if state.record:
            prov = Provenance(f"live link register ({proof.reason}): x30 is the return address into the caller")
            if addr is not None:
                prov.read(addr, 8, x30, origin)
            else:
                prov.note(f"{origin}: {x30:#x}")
            prov.note(f"lr raw {x30:#x} -> stripped {ptrauth_strip_kernel_insn_pac(x30, state.pac_mask):#x}"
                      if flags & Flag.PAC_STRIPPED else f"lr {x30:#x} (unsigned)")
            for line in proof.lines + notes:
                prov.note(line)
        return Frame(pc, None, fp, Source.LIVE_LR, frame.stack, flags, prov)
