"""The call-site check: is the instruction that ends at a return address a call?

Evidence for the reader and for complete modes only: the kernel does not
check it, so a failed check never changes what faithful replay prints.
Text bytes come from the image; without them the answer is "unknown".

Verdicts are cached per image (an image opened by :func:`unwind.formats.image.open_image`
lives for the process, so every session of a corpus shares them). Each arch's
backend may recognise its common call encodings from the bytes
(:meth:`~unwind.core.registry.ArchBackend.call_site_length`), or settle from them that no call
ends there (:meth:`~unwind.core.registry.ArchBackend.no_call_site`), before capstone is asked;
the instruction text is decoded by capstone only when it is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable
from weakref import WeakKeyDictionary

from .frame import FLAGS as _FLAGS
from .frame import Flag, Frame
from .registry import ArchBackend

if TYPE_CHECKING:
    from unwind.formats.image import Image

# IntFlag's & and | run Python code (~0.5 us each): the per-frame path works on the int value
# and picks the resulting Flag from a table of every combination
_BOUNDARY = Flag.BOUNDARY.value
_CALLSITE_OK = Flag.CALLSITE_OK.value
_CALLSITE_BAD = Flag.CALLSITE_BAD.value

#: per image, per arch: return address -> verdict
_VERDICTS: WeakKeyDictionary[Any, dict[str, dict[int, "CallSite"]]] = WeakKeyDictionary()
#: one capstone decoder per arch, made on first use
_DECODERS: dict[str, Any] = {}


def _decoder(backend: ArchBackend) -> Any:
    """A capstone decoder for ``backend``'s instruction set."""
    md = _DECODERS.get(backend.name)
    if md is None:
        import capstone
        md = _DECODERS[backend.name] = capstone.Cs(*backend.capstone_mode())
    return md


class CallSite:
    """``status`` is "ok", "bad" or "unknown"; ``insn`` the call found (or what ends there).

    ``insn`` is decoded from the stored bytes the first time it is read; a site made with
    ``later`` (a "bad" one the bytes settled) takes ``insn`` and ``addr`` from ``later()`` then.
    """

    __slots__ = ("status", "flag", "_addr", "_code", "_backend", "_insn", "_later")

    def __init__(self, status: str, insn: str | None = None, addr: int | None = None, *,
                 code: bytes | None = None, backend: ArchBackend | None = None,
                 later: "Callable[[], CallSite] | None" = None) -> None:
        self.status = status
        #: the :class:`~unwind.core.frame.Flag` value a checked frame gets: call-ok, call-bad, or none (unknown)
        self.flag = _CALLSITE_OK if status == "ok" else _CALLSITE_BAD if status == "bad" else 0
        self._addr = addr
        self._insn = insn
        self._code = code
        self._backend = backend
        self._later = later

    def _settle(self) -> None:
        if self._later is not None:
            site, self._later = self._later(), None
            self._insn, self._addr = site.insn, site.addr

    @property
    def addr(self) -> int | None:
        """Where the instruction that ends at the return address starts, if one does."""
        self._settle()
        return self._addr

    @property
    def insn(self) -> str | None:
        """``mnemonic operands`` of the instruction that ends at the return address, if one does."""
        self._settle()
        if self._insn is None and self._code is not None and self._backend is not None:
            insn = next(_decoder(self._backend).disasm(self._code, self._addr))
            self._insn = f"{insn.mnemonic} {insn.op_str}".strip()
            self._code = None
        return self._insn

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CallSite):
            return NotImplemented
        return (self.status, self.insn, self.addr) == (other.status, other.insn, other.addr)

    def __hash__(self) -> int:
        return hash((self.status, self.insn, self.addr))

    def __repr__(self) -> str:
        return f"CallSite({self.status!r}, {self.insn!r}, {self.addr!r})"

    def describe(self) -> str:
        """One line for ``--explain``."""
        if self.status == "unknown":
            return "call site: unknown (no text in the image)"
        where = f" at {self.addr:#x}" if self.addr is not None else ""
        what = self.insn or "no instruction ends there"
        return f"call site: {'ok' if self.status == 'ok' else 'NOT a call'}{where}: {what}"


def _decoded(backend: ArchBackend, ret: int, windows: list[tuple[int, bytes | None]], text_before: bool) -> CallSite:
    """The call site of ``ret`` as capstone reads the bytes of each call length before it."""
    seen = None
    for length, code in windows:
        if code is None:
            continue  # outside the image's text (a module, a trampoline): capstone is not needed
        insns = list(_decoder(backend).disasm(code, ret - length))
        if len(insns) != 1 or insns[0].size != length:
            continue
        insn = insns[0]
        text = f"{insn.mnemonic} {insn.op_str}".strip()
        if backend.is_call(insn.mnemonic, insn.op_str):
            return CallSite("ok", text, insn.address)
        seen = seen or CallSite("bad", text, insn.address)
    if seen is None and not text_before:
        return CallSite("unknown")
    return seen or CallSite("bad")


class CallSiteChecker:
    """Decides the call site of return addresses, caching each answer with the image."""

    def __init__(self, backend: ArchBackend, image: Image | None) -> None:
        self.backend = backend
        self.image = image if image is not None and image.has_text else None
        if self.image is None:
            self._cache: dict[int, CallSite] = {}
        else:
            self._cache = _VERDICTS.setdefault(self.image, {}).setdefault(backend.name, {})

    @property
    def cache_key(self) -> int:
        """Checkers with the same key share their verdicts (one image, one arch)."""
        return id(self._cache)

    def check(self, ret: int) -> CallSite:
        """The call site of return address ``ret``."""
        hit = self._cache.get(ret)
        if hit is None:
            hit = self._cache[ret] = self._check(ret)
        return hit

    def _check(self, ret: int) -> CallSite:
        if self.image is None:
            return CallSite("unknown")
        length = self.backend.call_site_length(self.image.text, ret)
        if length is not None:
            return CallSite("ok", addr=ret - length, code=self.image.text(ret - length, length),
                            backend=self.backend)
        windows = self._windows(ret)
        if self.backend.no_call_site(self.image.text, ret):
            backend = self.backend  # the bytes are read now: the site keeps no reference to the image
            return CallSite("bad", later=lambda: _decoded(backend, ret, *windows))
        return _decoded(self.backend, ret, *windows)

    def _windows(self, ret: int) -> tuple[list[tuple[int, bytes | None]], bool]:
        """The bytes of each call length before ``ret``, and whether any byte before it is text."""
        assert self.image is not None
        return ([(n, self.image.text(ret - n, n)) for n in self.backend.call_lengths],
                self.image.text(ret - 1, 1) is not None)

    def decode(self, ret: int) -> CallSite:
        """The call site of ``ret`` as capstone reads it: each call length, shortest first."""
        return _decoded(self.backend, ret, *self._windows(ret))

    def annotate(self, frame: Frame) -> CallSite | None:
        """Flag ``frame`` with its call-site result, and return it; a pc from exception registers is not
        checked (``None``)."""
        self.annotate_frames([frame])
        return None if frame.flags._value_ & _BOUNDARY else self.check(frame.pc)

    def annotate_frames(self, frames: list[Frame]) -> None:
        """:meth:`annotate` each of ``frames`` in turn: the flag, and with provenance the line that explains it."""
        cache = self._cache
        for frame in frames:
            flags = int(frame.flags)  # a C integer in the compiled build (callsite.pxd): no attribute read
            if flags & _BOUNDARY:
                continue
            site = cache.get(frame.pc) or self.check(frame.pc)
            frame.flags = _FLAGS[flags | site.flag]
            if frame.provenance is not None:
                frame.provenance.note(site.describe)  # the line is made when the notes are read
