"""Complete mode for ORC walks: the caller of a function that has no ORC, proven by its call.

objtool writes no ORC for a function marked ``STACK_FRAME_NON_STANDARD`` (or asm it
cannot follow): its whole text is covered by an ``ORC_TYPE_UNDEFINED`` entry, and
``unwind_next_frame()`` gives up there (``goto err``). The case that matters is
kdump's crash CPU: ``__crash_kexec()`` is ``STACK_FRAME_NON_STANDARD`` (kernel/crash_core.c,
kernel/kexec_core.c before 6.6) and ``crash_setup_regs()`` (arch/x86/include/asm/kexec.h)
saves ``rip = _THIS_IP_``, a label inside it, so the kernel's own unwinder, given the
NT_PRSTATUS registers, prints every word of the stack with ``?``.

Complete mode takes the first word above ``sp`` on the same stack that is a return
address right after a ``call rel32`` whose target is the function holding ``ip`` (or
its ``__pfx_`` padding, which falls through into it), and goes on from there as an
ORC CALL frame: ``ip`` that word, ``sp`` the slot above it, ``bp`` unchanged (what
``bp_reg`` UNDEFINED means). The frame is flagged ``complete`` and ``unreliable`` (the
kernel sets ``state->error`` here, so a reliable walk still fails); the frames after it
are ORC's. drgn reaches the same caller through the function's DWARF CFI; crash looks
for ``crash_kexec`` by name on the stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.core.walk import StopReason, UnwindStop

if TYPE_CHECKING:
    from unwind.kernel.symbols import Symbol

    from .unwind_orc import OrcUnwinder

#: ``call rel32``: the opcode and the instruction's length
CALL_REL32, CALL_REL32_LEN = 0xE8, 5
#: CONFIG_FUNCTION_PADDING_BYTES: calls may land in ``__pfx_<name>`` (call-depth thunks)
PADDING_PREFIX = "__pfx_"
U64 = (1 << 64) - 1


class UndefinedOrc(UnwindStop):
    """``orc->type == ORC_TYPE_UNDEFINED``: the kernel's ``goto err`` at ``ip``."""

    def __init__(self, reason: StopReason, detail: str, ip: int) -> None:
        super().__init__(reason, detail)
        self.ip = ip


def text_bytes(walk: "OrcUnwinder", addr: int, size: int) -> bytes | None:
    """Kernel text from the image (``None`` without text there: nothing is proven then)."""
    image = walk.target.image
    return image.text(addr, size) if image is not None and image.has_text else None


def calls(walk: "OrcUnwinder", ret: int, callee: "Symbol") -> int | None:
    """The address of the ``call rel32`` ending at ``ret`` if it calls ``callee``, else ``None``."""
    site = ret - CALL_REL32_LEN
    code = text_bytes(walk, site, CALL_REL32_LEN)
    if code is None or code[0] != CALL_REL32:
        return None
    dest = (ret + int.from_bytes(code[1:], "little", signed=True)) & U64
    if dest == callee.addr:
        return site
    symbols = walk.target.symbols
    pad = symbols.lookup(dest) if symbols is not None else None
    if pad is not None and pad.name == PADDING_PREFIX + callee.name and pad.addr + pad.size == callee.addr:
        return site
    return None


def proven_caller(walk: "OrcUnwinder", ip: int, prov: Provenance | None) -> Frame | None:
    """The caller of the function holding ``ip``: the first return slot above ``sp`` whose call
    targets that function, as a complete frame; ``None`` when none is found on this stack."""
    symbols = walk.target.symbols
    callee = symbols.lookup(ip) if symbols is not None else None
    if callee is None or callee.offset >= callee.size:
        return None
    info = walk.stack_info
    for lo, hi in walk.mem.captured(walk.sp & ~7, info.end):
        for slot in range(lo + (-lo & 7), hi - 7, 8):
            ret = walk.read(slot)
            if not any(a <= ret < b for a, b in walk.text):
                continue
            site = calls(walk, ret, callee)
            if site is None:
                continue
            walk.ip, walk.sp = ret, slot + 8
            walk.regs = walk.prev_regs = None
            walk.full_regs = walk.signal = False
            why = f"called {callee.name}"
            if prov is not None:
                prov.rule = (f"complete: no ORC for {callee.name} ({ip:#x}); the first word above sp that "
                             f"returns from a call to it")
                prov.read(slot, 8, ret, "return address")
                prov.note(f"call rel32 at {site:#x} targets {callee.name}; bp left as it was")
            return Frame(ret, walk.sp, walk.bp, Source.CALLER, info.kind, Flag.COMPLETE | Flag.UNRELIABLE, prov,
                         extra={"complete": why})
    return None
