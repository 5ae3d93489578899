"""Synthetic x86-64 scenarios: ORC tables in any format generation, stacks, pt_regs, tasks.

:class:`OrcBuilder` lays out functions in fake kernel text with their ORC
rows and symbols, and turns them into a :class:`SynthImage`: an object with
the :class:`unwind.formats.image.Image` surface the backend reads (``section()``,
``symbols``, ``text()``), holding ``.orc_unwind_ip``/``.orc_unwind`` encoded
in the chosen generation and the matching ``.orc_header``. A replay of a
:class:`~unwind.dev.synth.SynthDump` with it goes through the same decoder as a
real vmlinux.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from unwind.session.replay import Session
from unwind.kernel.symbols import SymbolTable
from unwind.dev.synth import SynthDump, SynthStack

from .orc import (ORC_HASHES, ORC_REG_PREV_SP, ORC_REG_SP, ORC_REG_UNDEFINED, ORC_TYPE_CALL,
                  ORC_TYPE_END_OF_STACK, ORC_TYPE_REGS, ORC_TYPE_REGS_PARTIAL, ORC_TYPE_UNDEFINED, OrcEntry,
                  encode_entries, encode_ips)
from .structs import PT_REGS, PT_REGS_SIZE, offsetof

TEXT = 0xFFFFFFFF81000000
TEXT_SIZE = 0x100000
INIT_TEXT = 0xFFFFFFFF83000000
ORC_IP_ADDR = 0xFFFFFFFF82E00000
KERNEL_CS, KERNEL_SS, USER_CS, USER_SS = 0x10, 0x18, 0x33, 0x2B
_HASH_OF = {v: h for h, v in ORC_HASHES.items()}


def call(sp_offset: int = 8, sp_reg: int = ORC_REG_SP, bp_reg: int = ORC_REG_UNDEFINED,
         bp_offset: int = 0, signal: bool = False) -> OrcEntry:
    """A CALL entry (``sp:sp+8 bp:(und)`` by default)."""
    return OrcEntry(sp_offset, bp_offset, sp_reg, bp_reg, ORC_TYPE_CALL, signal)


def regs(sp_offset: int = 0, sp_reg: int = ORC_REG_SP, partial: bool = False) -> OrcEntry:
    """A REGS (full pt_regs at the CFA) or REGS_PARTIAL (IRET frame at the CFA) entry; signal set."""
    return OrcEntry(sp_offset, 0, sp_reg, ORC_REG_UNDEFINED,
                    ORC_TYPE_REGS_PARTIAL if partial else ORC_TYPE_REGS, True)


UNDEFINED = OrcEntry(0, 0, ORC_REG_UNDEFINED, ORC_REG_UNDEFINED, ORC_TYPE_UNDEFINED, False)
END_OF_STACK = OrcEntry(0, 0, ORC_REG_UNDEFINED, ORC_REG_UNDEFINED, ORC_TYPE_END_OF_STACK, False)
#: a frame-pointer frame after ``push %rbp; mov %rsp,%rbp``: sp:bp+16 bp:prevsp-16
FP_FRAME = OrcEntry(16, -16, 4, ORC_REG_PREV_SP, ORC_TYPE_CALL, False)


class SynthImage:
    """ORC sections, ``.orc_header`` and symbols with the surface of :class:`unwind.formats.image.Image`."""

    machine = "EM_X86_64"

    def __init__(self, rows: list[tuple[int, OrcEntry]], version: int, symbols: list[tuple[int, str]],
                 header: bytes | None | bool = True, text: dict[int, bytes] | None = None) -> None:
        ips = [ip for ip, _ in rows]
        self._text = text
        self.has_text = text is not None
        self._sections: dict[str, tuple[int, bytes]] = {
            ".orc_unwind_ip": (ORC_IP_ADDR, encode_ips(ips, ORC_IP_ADDR)),
            ".orc_unwind": (ORC_IP_ADDR + 4 * len(ips), encode_entries([e for _, e in rows], version)),
        }
        if header is True:
            header = _HASH_OF.get(version)
        if header:
            self._sections[".orc_header"] = (ORC_IP_ADDR - 20, bytes(header))
        digest = hashlib.sha1(b"".join(d for _, d in self._sections.values())).hexdigest()
        self.build_id = digest
        self.path = Path(f"/synthetic/orc-{digest}")
        self.symbols = SymbolTable((a, "T", n) for a, n in symbols)

    def section(self, name: str) -> tuple[int, bytes] | None:
        """``(sh_addr, data)`` of a section."""
        return self._sections.get(name)

    def text(self, addr: int, size: int) -> bytes | None:
        """Instruction bytes at ``addr``: the pieces written with :meth:`OrcBuilder.code`, zero between
        them, inside the fake text; ``None`` without any (an image made without text)."""
        if self._text is None or not TEXT <= addr <= addr + size <= TEXT + TEXT_SIZE:
            return None
        out = bytearray(size)
        for at, code in self._text.items():
            lo, hi = max(at, addr), min(at + len(code), addr + size)
            if lo < hi:
                out[lo - addr:hi - addr] = code[lo - at:hi - at]
        return bytes(out)


class OrcBuilder:
    """Functions in fake text, each with ORC rows; symbols ``_stext``/``_etext`` and trampolines."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, OrcEntry]] = []
        self.syms: list[tuple[int, str]] = [(TEXT, "_stext"), (TEXT + TEXT_SIZE, "_etext"),
                                           (INIT_TEXT, "_sinittext"), (INIT_TEXT + 0x1000, "_einittext")]
        self._next = TEXT + 0x1000
        self.addr: dict[str, int] = {}
        self.text: dict[int, bytes] | None = None

    def func(self, name: str, size: int, *rows: tuple[int, OrcEntry]) -> int:
        """A function of ``size`` bytes with ``(offset, entry)`` rows; a terminator row follows it."""
        start = self._next
        self._next += (size + 15) & ~15
        self.addr[name] = start
        self.syms.append((start, name))
        for off, e in rows:
            self.rows.append((start + off, e))
        self.rows.append((start + size, UNDEFINED))  # the section-terminator style gap filler
        return start

    def code(self, addr: int, code: bytes) -> None:
        """Instruction bytes at ``addr``: the image then has text (``has_text``), zero elsewhere."""
        if self.text is None:
            self.text = {}
        self.text[addr] = code

    def call_rel32(self, site: int, dest: int) -> int:
        """A ``call rel32`` at ``site`` to ``dest``; returns its return address."""
        ret = site + 5
        self.code(site, b"\xe8" + ((dest - ret) & 0xFFFFFFFF).to_bytes(4, "little"))
        return ret

    def image(self, version: int = 3, header: bytes | None | bool = True) -> SynthImage:
        """The table encoded in ``version`` with its ``.orc_header`` (``header=None``: none)."""
        # a symbol after the last function, so kallsyms-style sizes end where the function does
        syms = self.syms + [(self._next, "__synth_text_end")]
        return SynthImage(sorted(self.rows, key=lambda r: r[0]), version, syms, header, self.text)


def put_pt_regs(stack: SynthStack, addr: int, **values: int) -> int:
    """Write a ``struct pt_regs`` at ``addr`` (unnamed members zero, ``orig_ax`` -1); return its end."""
    values.setdefault("orig_ax", 2**64 - 1)
    for sub in PT_REGS.subcons:
        stack.put(addr + offsetof(PT_REGS, sub.name), values.get(sub.name, 0))
    return addr + PT_REGS_SIZE


def session(sd: SynthDump, image: SynthImage) -> Session:
    """A replay session of ``sd`` with ``image`` as its kernel image and symbols."""
    return Session(sd.dump(), image, image.symbols)  # type: ignore[arg-type]
