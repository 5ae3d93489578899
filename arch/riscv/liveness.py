"""Complete mode: prove from the code that ``ra`` still holds the caller's return address.

The 6.12 walk reads the frame record at ``s0 - 16``. While a function has not
yet set ``s0`` to its own frame (function entry, frameless leaf, epilogue after
``ld s0``), that record is its *caller's*, so the caller itself, whose return
address is still in ``ra``, is never printed. Complete mode adds it back, but
only where capstone's disassembly of the function proves both facts:

- **entry**: the instructions from the symbol's start to the pc are
  straight-line (no branch, jump or call) and none writes ``ra`` or ``s0``;
- **leaf**: no instruction of the whole function writes ``ra`` or ``s0``
  (GCC's frameless leaves: ``__clear_user``);
- **paths**: over the function's control-flow graph, no path from its entry to
  the pc writes ``ra`` or ``s0`` (the frameless fast path of a shrink-wrapped
  function such as ``rcu_all_qs``). An indirect jump (``jr t1``) reached with
  either register written voids the proof: it could land anywhere;
- **epilogue**: from the pc a straight line reaches ``ret`` without writing
  ``ra`` or ``s0`` (at ``ret`` both are the caller's by the calling convention).

No text, no symbol, an undecodable byte or any doubt: no proof, no frame.
The analysis sees the image's text: run-time patches are not in it. Patchable
ftrace entries call ``ftrace_caller`` through ``t0`` and keep ``ra`` (or set it
to ``return_to_handler``, which the walker resolves); static-key jumps can
only join code of the same frame state, as GCC's shrink-wrapping never merges
framed and frameless paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from unwind.kernel.symbols import SymbolTable

#: the longest function the leaf proof disassembles
MAX_FUNCTION = 0x4000
#: how far the epilogue proof looks for ``ret``
MAX_EPILOGUE = 0x40

_STORES = frozenset({"sb", "sh", "sw", "sd", "c.sw", "c.sd", "c.swsp", "c.sdsp", "fsh", "fsw", "fsd", "fsq",
                     "c.fsw", "c.fsd", "c.fswsp", "c.fsdsp"})
_BRANCHES = frozenset({"beq", "bne", "blt", "bge", "bltu", "bgeu", "beqz", "bnez", "blez", "bgez", "bltz",
                       "bgtz", "bgt", "ble", "bgtu", "bleu", "c.beqz", "c.bnez"})
_JUMPS = frozenset({"j", "jr", "ret", "c.j", "c.jr", "sret", "mret", "ecall", "ebreak", "c.ebreak", "tail"})
_CALLS = frozenset({"jal", "jalr", "c.jal", "c.jalr", "call"})
_NO_DEST = _STORES | _BRANCHES | _JUMPS | frozenset({"nop", "c.nop", "fence", "fence.i", "fence.tso",
                                                     "sfence.vma", "wfi", "pause", "unimp", "c.unimp"})
_RETURNS = frozenset({"ret"})
_ALIASES = {"x1": "ra", "x8": "s0", "fp": "s0"}
_WATCHED = frozenset({"ra", "s0"})


class TextSource(Protocol):
    """What the prover needs of an image: its instruction bytes."""

    @property
    def has_text(self) -> bool: ...

    def text(self, addr: int, size: int) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class Proof:
    """Why ``ra`` is live and ``s0`` the caller's at a pc: ``kind`` is entry, leaf, paths or epilogue.

    ``sp_at_entry``: no instruction before the pc moved ``sp`` either (an entry
    proof with no stack allocation), so ``sp`` is still the caller's.
    """

    kind: str
    function: str
    detail: str
    sp_at_entry: bool = False


def written_register(mnemonic: str, op_str: str) -> str | None:
    """The register an instruction may write (ABI name), or ``None`` when it writes none."""
    if mnemonic in ("c.jal", "c.jalr"):
        return "ra"
    if mnemonic in _NO_DEST or not op_str:
        return None
    ops = [o.strip() for o in op_str.split(",")]
    if mnemonic in _CALLS and len(ops) == 1:
        return "ra"  # "jal off" / "jalr rs": rd = ra implied
    return _ALIASES.get(ops[0], ops[0])


def is_control_flow(mnemonic: str) -> bool:
    """Branches, jumps, calls and returns: the end of straight-line code."""
    return mnemonic in _BRANCHES or mnemonic in _JUMPS or mnemonic in _CALLS


def is_return(mnemonic: str, op_str: str) -> bool:
    """``ret`` in any spelling: ``jalr zero, 0(ra)``."""
    if mnemonic in _RETURNS:
        return True
    if mnemonic in ("c.jr", "jr"):
        return op_str.strip() == "ra"
    return mnemonic == "jalr" and op_str.replace(" ", "") in ("zero,ra,0", "zero,0(ra)")


def _target(addr: int, op_str: str) -> int | None:
    """A direct branch or jump's target: capstone prints the offset as the last operand."""
    try:
        return addr + int(op_str.rsplit(",", 1)[-1].strip(), 0)
    except ValueError:
        return None


def successors(addr: int, size: int, mnemonic: str, op_str: str) -> tuple[list[int], bool]:
    """Where control may go after an instruction, and whether it is an indirect jump."""
    nxt = addr + size
    if mnemonic in _BRANCHES:
        t = _target(addr, op_str)
        return ([nxt] if t is None else [nxt, t]), t is None
    if mnemonic in ("j", "c.j"):
        t = _target(addr, op_str)
        return ([] if t is None else [t]), t is None
    if mnemonic in _CALLS:
        return [nxt], False  # a call returns here (it writes its link register)
    if is_return(mnemonic, op_str) or mnemonic in ("sret", "mret"):
        return [], False
    if mnemonic in ("jr", "c.jr"):
        return [], True
    return [nxt], False


def dirty_on_entry(insns: list[tuple[int, int, str, str]]) -> dict[int, frozenset[str]] | None:
    """Per instruction address, the watched registers some path from the entry may have written before it.

    Unreached instructions are absent. ``None`` when an indirect jump may carry
    a written register anywhere, or a branch lands inside an instruction.
    """
    at = {a: i for i, (a, _s, _m, _o) in enumerate(insns)}
    lo, hi = insns[0][0], insns[-1][0] + insns[-1][1]
    state: dict[int, frozenset[str]] = {insns[0][0]: frozenset()}
    work = [insns[0][0]]
    while work:
        addr = work.pop()
        _a, size, mn, ops = insns[at[addr]]
        w = written_register(mn, ops)
        out = state[addr] | {w} if w in _WATCHED else state[addr]
        succ, indirect = successors(addr, size, mn, ops)
        if indirect and out:
            return None
        for t in succ:
            if t not in at:
                if lo <= t < hi:
                    return None  # into the middle of an instruction: the decode cannot be trusted
                continue  # a tail call out of the function
            old = state.get(t)
            new = out if old is None else old | out
            if new != old:
                state[t] = new
                work.append(t)
    return state


class LiveRaProver:
    """Proves, per pc, that the caller's return address is still in ``ra`` (cached)."""

    def __init__(self, image: TextSource | None, symbols: SymbolTable | None,
                 excluded: tuple[tuple[int, int], ...], cs_mode: tuple[int, int]) -> None:
        self.image = image if image is not None and image.has_text else None
        self.symbols = symbols
        self.excluded = excluded
        import capstone  # here, not at import: a replay without this proof never loads capstone
        self._md = capstone.Cs(*cs_mode)
        self._cache: dict[int, tuple[Proof | None, str]] = {}

    def prove(self, pc: int) -> tuple[Proof | None, str]:
        """``(proof, "")`` or ``(None, why not)``."""
        hit = self._cache.get(pc)
        if hit is None:
            hit = self._cache[pc] = self._prove(pc)
        return hit

    def first_write(self, function: int, reg: str) -> int | None:
        """The address of the first instruction (in address order) of the function at ``function`` writing ``reg``."""
        sym = self.symbols.lookup(function) if self.symbols is not None else None
        if sym is None or self.image is None:
            return None
        code = self.image.text(sym.addr, sym.size)
        if code is None:
            return None
        for addr, _size, mn, ops in self._md.disasm_lite(code, sym.addr):
            if written_register(mn, ops) == reg:
                return addr
        return None

    def _decode(self, addr: int, code: bytes) -> list[tuple[int, int, str, str]] | None:
        """Every instruction of ``code``, or ``None`` if some byte does not decode."""
        out = list(self._md.disasm_lite(code, addr))
        return out if sum(i[1] for i in out) == len(code) else None

    def _prove(self, pc: int) -> tuple[Proof | None, str]:
        for lo, hi in self.excluded:
            if lo <= pc < hi:
                return None, "trap-entry code: ra there is the interrupted context's, not a return address"
        if self.symbols is None:
            return None, "no symbols"
        sym = self.symbols.lookup(pc)
        if sym is None:
            return None, f"no symbol for {pc:#x}"
        if self.image is None:
            return None, "no text in the image"
        prefix = self.image.text(sym.addr, pc - sym.addr)
        if prefix is None:
            return None, f"{sym.name}: text not in the image"
        insns = self._decode(sym.addr, prefix)
        if insns is None:
            return None, f"{sym.name}: bytes before the pc do not decode"
        proof = self._entry(sym.name, insns)
        if proof is None:
            proof = self._paths(sym.name, sym.addr, sym.size, pc)
        if proof is None:
            proof = self._epilogue(sym.name, pc, sym.addr + sym.size)
        if proof is None:
            return None, f"{sym.name}+{sym.offset:#x}: no proof that ra is live and s0 the caller's"
        return proof, ""

    def _entry(self, name: str, insns: list[tuple[int, int, str, str]]) -> Proof | None:
        for _addr, _size, mn, ops in insns:
            if is_control_flow(mn) or written_register(mn, ops) in _WATCHED:
                return None
        sp_kept = all(written_register(mn, ops) != "sp" for _a, _s, mn, ops in insns)
        return Proof("entry", name, f"{len(insns)} instruction(s) from {name} to the pc: straight-line, "
                                    "none writes ra or s0 (before the prologue)", sp_kept)

    def _function(self, start: int, size: int) -> list[tuple[int, int, str, str]] | None:
        """Every instruction of a function; trailing zero padding may stay undecoded."""
        if not 0 < size <= MAX_FUNCTION or self.image is None:
            return None
        code = self.image.text(start, size)
        if code is None:
            return None
        insns = list(self._md.disasm_lite(code, start))
        covered = sum(i[1] for i in insns)
        return insns if insns and not code[covered:].strip(b"\0") else None

    def _paths(self, name: str, start: int, size: int, pc: int) -> Proof | None:
        insns = self._function(start, size)
        if insns is None:
            return None
        if not any(written_register(mn, ops) in _WATCHED for _a, _s, mn, ops in insns):
            return Proof("leaf", name, f"none of the {len(insns)} instructions of {name} writes ra or s0 "
                                       "(a frameless leaf)")
        dirty = dirty_on_entry(insns)
        if dirty is None or pc not in dirty or dirty[pc]:
            return None
        return Proof("paths", name, f"no path from the entry of {name} to the pc writes ra or s0 "
                                    "(the frameless path of a shrink-wrapped function)")

    def _epilogue(self, name: str, pc: int, end: int) -> Proof | None:
        size = min(MAX_EPILOGUE, end - pc)
        code = self.image.text(pc, size) if self.image is not None and size > 0 else None
        if code is None:
            return None
        for addr, _size, mn, ops in self._md.disasm_lite(code, pc):
            if is_return(mn, ops):
                return Proof("epilogue", name, f"straight-line from the pc to ret at {addr:#x}, "
                                               "no write to ra or s0 (after the epilogue restored them)")
            if is_control_flow(mn) or written_register(mn, ops) in _WATCHED:
                return None
        return None
