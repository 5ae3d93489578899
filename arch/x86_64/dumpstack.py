"""Stack identification: ``arch/x86/kernel/dumpstack_64.c`` and ``dumpstack.c``.

The stacks a walk may use come from ``target.task.stacks`` with the kinds the
capture writes (``arch/x86_64/lab.py``): ``task``, ``irq``, ``entry`` and
``exception:DF|NMI|DB|MCE|VC|VC2``. The dump only lists per-CPU stacks for the
task running on that CPU, which is the kernel's ``task != current`` rule of
``get_stack_info_noinstr()``.
"""

from __future__ import annotations

from typing import Sequence

from unwind.core.memory import Memory, MemoryFault
from unwind.core.stackinfo import StackInfo as CoreStackInfo

from .structs import PT_REGS, PT_REGS_SIZE, offsetof

# enum stack_type (asm/stacktrace.h)
STACK_TYPE_UNKNOWN = 0
STACK_TYPE_TASK = 1
STACK_TYPE_IRQ = 2
STACK_TYPE_SOFTIRQ = 3
STACK_TYPE_ENTRY = 4
STACK_TYPE_EXCEPTION = 5
#: enum exception_stack_ordering (asm/cpu_entry_area.h)
ESTACKS = ("DF", "NMI", "DB", "MCE", "VC", "VC2")

#: capture kind -> stack type
KIND_TYPES: dict[str, int] = {"task": STACK_TYPE_TASK, "irq": STACK_TYPE_IRQ, "softirq": STACK_TYPE_SOFTIRQ,
                              "entry": STACK_TYPE_ENTRY,
                              **{f"exception:{n}": STACK_TYPE_EXCEPTION + i for i, n in enumerate(ESTACKS)}}

#: stack_type_name() (dumpstack_64.c), the <NAME> markers of a printed trace
STACK_TYPE_NAMES: dict[int, str] = {STACK_TYPE_TASK: "TASK", STACK_TYPE_IRQ: "IRQ", STACK_TYPE_SOFTIRQ: "SOFTIRQ",
                                    STACK_TYPE_ENTRY: "ENTRY_TRAMPOLINE",
                                    **{STACK_TYPE_EXCEPTION + i: n for i, n in
                                       enumerate(("#DF", "NMI", "#DB", "#MC", "#VC", "#VC2"))}}

# get_stack_info_noinstr() (dumpstack_64.c:170-189): the task stack, then exception, IRQ and entry stacks
_SEARCH_ORDER = {STACK_TYPE_TASK: 0, **{STACK_TYPE_EXCEPTION + i: 1 for i in range(len(ESTACKS))},
                 STACK_TYPE_IRQ: 2, STACK_TYPE_ENTRY: 3, STACK_TYPE_SOFTIRQ: 4}

_PT_REGS_SP = offsetof(PT_REGS, "sp")
#: capture kind -> its place in the search order
_KIND_ORDER = {kind: _SEARCH_ORDER[typ] for kind, typ in KIND_TYPES.items()}


class StackInfo:
    """``struct stack_info``: the type, ``[begin, end)``, and where the previous stack pointer is."""

    __slots__ = ("type", "begin", "end", "next_sp", "kind", "cpu")

    def __init__(self, type: int, begin: int, end: int, next_sp: int | None, kind: str,
                 cpu: int | None = None) -> None:
        self.type = type
        self.begin = begin
        self.end = end
        self.next_sp = next_sp
        self.kind = kind
        self.cpu = cpu

    def _fields(self) -> tuple[int, int, int, int | None, str, int | None]:
        return self.type, self.begin, self.end, self.next_sp, self.kind, self.cpu

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return ("StackInfo(type={!r}, begin={!r}, end={!r}, next_sp={!r}, kind={!r}, cpu={!r})"
                .format(*self._fields()))

    def on_stack(self, addr: int, length: int) -> bool:
        """``on_stack()`` (asm/stacktrace.h)."""
        return (self.type != STACK_TYPE_UNKNOWN and self.begin <= addr < self.end
                and addr + length > self.begin and addr + length <= self.end)

    @property
    def name(self) -> str | None:
        """``stack_type_name()``: ``TASK``, ``IRQ``, ``NMI``, ``#DF``, ..."""
        return STACK_TYPE_NAMES.get(self.type)


UNKNOWN = StackInfo(STACK_TYPE_UNKNOWN, 0, 0, None, "unknown")


def _search_order(stack: CoreStackInfo) -> int:
    """Where ``get_stack_info_noinstr()`` looks for ``stack``: task, exception, irq, entry, softirq."""
    return _KIND_ORDER[stack.kind]


class StackFinder:
    """``get_stack_info()`` over the stacks one walk may use."""

    def __init__(self, stacks: Sequence[CoreStackInfo], mem: Memory) -> None:
        usable = [s for s in stacks if s.kind in KIND_TYPES and s.low < s.high]
        self.stacks = usable if len(usable) < 2 else sorted(usable, key=_search_order)
        self.mem = mem
        #: why the last get_stack_info() failed
        self.why = ""
        #: the stack_info of each stack, made when first found
        self._infos: list[StackInfo | None] = [None] * len(usable)

    # get_stack_info() (dumpstack_64.c:191-221) over get_stack_info_noinstr() (170-189)
    def get_stack_info(self, addr: int, visit_mask: list[int]) -> StackInfo | None:
        """The stack holding ``addr``, or ``None`` (unknown, or visited before: "stack recursion").

        ``visit_mask`` is a one-element list holding the walk's mask; the
        stack's type bit is added to it, as the kernel does.
        """
        if not addr:
            self.why = "null stack pointer"
            return None
        for i, s in enumerate(self.stacks):
            # in_task_stack(), in_exception_stack(), in_irq_stack(), in_entry_stack(): begin <= addr < end
            if s.low <= addr < s.high:
                typ = KIND_TYPES[s.kind]
                if visit_mask[0] & (1 << typ):
                    self.why = f"stack recursion on stack type {typ} ({s.kind})"
                    return None
                visit_mask[0] |= 1 << typ
                info = self._infos[i]
                if info is None:
                    info = self._infos[i] = StackInfo(typ, s.low, s.high, self._next_sp(typ, s.high), s.kind, s.cpu)
                return info
        self.why = f"{addr:#x} is on no stack this walk may use"
        return None

    def _next_sp(self, typ: int, end: int) -> int | None:
        """Where the stack printer goes after this stack (``stack_info.next_sp``)."""
        try:
            if typ == STACK_TYPE_IRQ:
                return self.mem.read_u64(end - 8)  # in_irq_stack(): the previous sp at the top
            if typ >= STACK_TYPE_EXCEPTION:
                return self.mem.read_u64(end - PT_REGS_SIZE + _PT_REGS_SP)  # ((pt_regs *)end - 1)->sp
        except MemoryFault:
            return None
        return None  # task and entry stacks: NULL
