"""The ra proofs on real code: the Debian 6.12.117 riscv64 slim image committed under corpora/."""

from __future__ import annotations

from pathlib import Path

import capstone
import pytest

from unwind.arch.riscv.liveness import LiveRaProver
from unwind.formats.image import Image

#: the 6.12 folder: the proofs below name its offsets (the 7.2 sample carries no text)
SLIM = sorted((Path(__file__).resolve().parents[3] / "corpora" / "riscv").glob("6.12.*/vmlinux-*.slim*"))
CS = (capstone.CS_ARCH_RISCV, capstone.CS_MODE_RISCV64 | capstone.CS_MODE_RISCVC)


@pytest.fixture(scope="module")
def real():
    if not SLIM:
        pytest.skip("no riscv slim image under corpora/riscv")
    image = Image(SLIM[0])
    if not image.has_text:
        pytest.skip(f"{SLIM[0].name} carries no text")
    syms = image.symbols
    trap = ((syms.address("handle_exception"), syms.address("ret_from_exception_end")),)
    return LiveRaProver(image, syms, trap, CS), syms, image


@pytest.mark.parametrize("name,off,kind", [
    ("rcu_all_qs", 0x8, "entry"),        # after the 8 bytes of patchable-entry nops
    ("rcu_all_qs", 0x2a, "paths"),       # shrink-wrapped: the frameless fast path after a branch
    ("rcu_all_qs", 0x4a, "paths"),       # slow path: s0 and ra stored, addi s0 not yet
    ("rcu_all_qs", 0x4c, None),          # after addi s0, sp, 0x20
    ("rcu_all_qs", 0x84, "epilogue"),    # ld ra / ld s0 / addi sp done, at ret
    ("__clear_user", 0x20, "leaf"),      # the faulting sd zero, 0(a0): a frameless leaf
    ("ksys_read", 0x12, "entry"),        # at c.addi4spn s0, sp, 0x40
    ("ksys_read", 0x14, None),
    ("__cond_resched", 0x10, None),      # after c.addi4spn s0, sp, 0x10
    ("handle_exception", 0x0, None),     # trap entry: ra is the interrupted context's
])
def test_real_functions(real, name, off, kind):
    prover, syms, _image = real
    proof, why = prover.prove(syms.address(name) + off)
    assert (proof.kind if proof else None) == kind, why


def test_real_entry_offsets_the_walker_relies_on(real):
    """handle_exception+0x128 returns from do_irq, +0x14a from the exception table; call_on_irq_stack+0x32."""
    _prover, syms, image = real
    md = capstone.Cs(*CS)

    def insn_before(name: str, off: int, length: int) -> str:
        a = syms.address(name) + off - length
        got = list(md.disasm_lite(image.text(a, length), a))
        assert len(got) == 1 and got[0][1] == length
        return f"{got[0][2]} {got[0][3]}"

    assert insn_before("handle_exception", 0x128, 4).startswith("jalr ra, ra, ")  # call do_irq
    assert insn_before("handle_exception", 0x14A, 2) == "c.jalr t1"
    assert insn_before("call_on_irq_stack", 0x32, 2) == "c.jalr a1"
    assert syms.format(syms.address("__schedule") + 0x3A6).startswith("__schedule+0x3a6/")
