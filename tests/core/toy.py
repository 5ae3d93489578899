"""A toy architecture that exercises the core: arm64-like {fp, lr} records at fp.

Rules, all known by construction:
- a record ``{0, 0}`` ends the walk cleanly (END_OF_STACK);
- a record ``{fp, 0x7e}`` is metadata of a type the toy does not know (UNKNOWN_METADATA);
- a pc of 0xbad is not text (BAD_PC);
- a task whose context has ``guess`` set reports its second frame as a guess (UNRELIABLE);
- a running task's first frame comes from exception registers (BOUNDARY).
"""

from __future__ import annotations

from unwind.core import registry
from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.core.memory import MemoryFault
from unwind.core.stackinfo import Refusal, StackSet
from unwind.core.target import Target
from unwind.core.trace import TraceLine
from unwind.core.walk import Stop, StopReason, Unwinder, UnwindStop

META_UNKNOWN = 0x7E


class ToyUnwinder(Unwinder):
    def __init__(self, target: Target) -> None:
        self.t = target
        self.stacks = StackSet(target.task.stacks)
        self.record = target.options.record
        self.guess = bool((target.task.context or {}).get("guess"))
        self.n = 0

    def start(self) -> Frame:
        task = self.t.task
        if task.regs is not None:
            self.fp, self.pc = task.regs["fp"], task.regs["pc"]
            return Frame(self.pc, fp=self.fp, source=Source.REGS_PC, flags=Flag.BOUNDARY)
        ctx = task.context or {}
        self.fp, self.pc = ctx["fp"], ctx["pc"]
        return Frame(self.pc, fp=self.fp, source=Source.TASK)

    def next(self) -> Frame:
        fp = self.fp
        if fp & 7:
            raise UnwindStop(StopReason.MISALIGNED_FP, f"fp {fp:#x}")
        info = self.stacks.find(fp, 16)
        if info is None:
            why = self.stacks.why_not(fp, 16)
            reason = StopReason.OUTSIDE_STACK if why is Refusal.OUTSIDE else StopReason.TRANSITION_REFUSED
            raise UnwindStop(reason, f"record at {fp:#x}: {why.value}")
        try:
            new_fp, new_pc = self.t.mem.read_u64(fp), self.t.mem.read_u64(fp + 8)
        except MemoryFault as e:
            raise UnwindStop(StopReason.MEMORY_FAULT, str(e)) from None
        if new_fp == 0 and new_pc == 0:
            raise UnwindStop(StopReason.END_OF_STACK)
        if new_pc == META_UNKNOWN:
            raise UnwindStop(StopReason.UNKNOWN_METADATA, f"record type {new_pc:#x} at {fp:#x}")
        if new_pc == 0xBAD:
            raise UnwindStop(StopReason.BAD_PC, f"{new_pc:#x}")
        left = self.stacks.consume(info, fp, 16)
        prov = None
        if self.record:
            prov = Provenance("frame record {fp, lr} at fp")
            prov.read(fp, 8, new_fp, "fp")
            prov.read(fp + 8, 8, new_pc, "lr")
            if left:
                prov.note(f"moved from the {left} stack to {info.kind}")
        self.n += 1
        flags = Flag.UNRELIABLE if (self.guess and self.n == 1) else Flag.NONE
        self.fp, self.pc = new_fp, new_pc
        return Frame(new_pc, fp=new_fp, source=Source.FRAME, stack=self.stacks.stack.kind, flags=flags,
                     provenance=prov)


class ToyBackend(registry.ArchBackend):
    name = "toy"
    elf_machine = "EM_SPARCV9"
    e_machine = 43
    prstatus_regs = ("fp", "sp", "pc")
    pc_reg = "pc"
    sp_reg = "sp"
    capstone = (0, 0)
    call_lengths = (4,)

    def unwinder(self, target: Target) -> Unwinder:
        return ToyUnwinder(target)

    def is_call(self, mnemonic: str, op_str: str) -> bool:
        return mnemonic == "bl"

    def format_trace(self, frames: list[Frame], stop: Stop, target: Target) -> list[TraceLine]:
        out = [TraceLine.header("Call trace:")]
        for f in frames:
            sym = f.symbol or hex(f.pc)
            out.append(TraceLine.of_frame(f" {sym}", f, f.pc, sym))
        return out


BACKEND = registry.register(ToyBackend())
