"""The call-site check: is the instruction that ends at a return address a call?

Evidence for the reader and for complete modes only: the kernel does not
check it, so a failed check never changes what faithful replay prints.
Text bytes come from the image; without them the answer is "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone

from .frame import Flag, Frame
from .image import Image
from .registry import ArchBackend


@dataclass(frozen=True, slots=True)
class CallSite:
    """``status`` is "ok", "bad" or "unknown"; ``insn`` the call found (or what ends there)."""

    status: str
    insn: str | None = None
    addr: int | None = None

    def describe(self) -> str:
        """One line for ``--explain``."""
        if self.status == "unknown":
            return "call site: unknown (no text in the image)"
        where = f" at {self.addr:#x}" if self.addr is not None else ""
        what = self.insn or "no instruction ends there"
        return f"call site: {'ok' if self.status == 'ok' else 'NOT a call'}{where}: {what}"


class CallSiteChecker:
    """Decodes the bytes before return addresses with capstone, caching each answer."""

    def __init__(self, backend: ArchBackend, image: Image | None) -> None:
        self.backend = backend
        self.image = image if image is not None and image.has_text else None
        self._md = capstone.Cs(*backend.capstone)
        self._cache: dict[int, CallSite] = {}

    def check(self, ret: int) -> CallSite:
        """The call site of return address ``ret``."""
        hit = self._cache.get(ret)
        if hit is None:
            hit = self._cache[ret] = self._check(ret)
        return hit

    def _check(self, ret: int) -> CallSite:
        if self.image is None:
            return CallSite("unknown")
        seen = None
        for length in self.backend.call_lengths:
            code = self.image.text(ret - length, length)
            if code is None:
                continue
            insns = list(self._md.disasm(code, ret - length))
            if len(insns) != 1 or insns[0].size != length:
                continue
            insn = insns[0]
            text = f"{insn.mnemonic} {insn.op_str}".strip()
            if self.backend.is_call(insn.mnemonic, insn.op_str):
                return CallSite("ok", text, insn.address)
            seen = seen or CallSite("bad", text, insn.address)
        if seen is None and self.image.text(ret - 1, 1) is None:
            return CallSite("unknown")
        return seen or CallSite("bad")

    def annotate(self, frame: Frame) -> CallSite | None:
        """Flag ``frame`` with its call-site result; a pc from exception registers is not checked."""
        if frame.flags & Flag.BOUNDARY:
            return None
        site = self.check(frame.pc)
        if site.status == "ok":
            frame.flags |= Flag.CALLSITE_OK
        elif site.status == "bad":
            frame.flags |= Flag.CALLSITE_BAD
        if frame.provenance is not None:
            frame.provenance.note(site.describe())
        return site

