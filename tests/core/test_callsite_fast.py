"""The byte-level call-site pre-check gives capstone's verdict, address and text, exactly: the
calls it recognises (``call_site_length``) and the sites it settles are no call (``no_call_site``).

The expected answer is capstone's own reading (``CallSiteChecker.decode``), on
random bytes shaped like each arch's call encodings and on every return address
of every committed corpus dump.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from unwind.core import registry
from unwind.core.callsite import CallSiteChecker
from unwind.session.replay import load_session
from unwind.cli.corpus import paths_under

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
BASE = 0xFFFFFFFF81000000


class BytesImage:
    """An image whose only text is ``code`` at ``BASE``."""

    has_text = True

    def __init__(self, code: bytes) -> None:
        self.code = code

    def text(self, addr: int, size: int) -> bytes | None:
        off = addr - BASE
        return self.code[off:off + size] if 0 <= off and off + size <= len(self.code) else None


def _same(checker: CallSiteChecker, ret: int) -> None:
    fast, slow = checker.check(ret), checker.decode(ret)
    assert fast.status == slow.status, hex(ret)  # before fast's text is read: a settled site decodes then
    assert (fast.status, fast.addr, fast.insn) == (slow.status, slow.addr, slow.insn), hex(ret)
    assert fast.describe() == slow.describe()


def _windows(arch: str, rng: random.Random) -> bytes:
    """Eight random bytes whose end often looks like one of ``arch``'s calls."""
    code = bytearray(rng.randbytes(8))
    if arch == "x86_64":
        code[3] = 0xE8 if rng.random() < 0.8 else rng.choice((0xFF, 0x41))
        for i in range(4, 8):  # offsets full of the bytes that could hide a shorter call
            if rng.random() < 0.3:
                code[i] = rng.choice((0xFF, 0xE8, 0xD0, 0x14, 0x15, 0x00))
    elif arch == "arm64":
        word = rng.choice((0x94000000 | rng.getrandbits(26), 0xD63F0000 | rng.getrandbits(5) << 5,
                           0xD73F0800 | rng.getrandbits(11), 0xD63F081F | rng.getrandbits(11),
                           rng.getrandbits(32)))
        code[4:8] = word.to_bytes(4, "little")
    else:
        word = rng.choice((0x6F | rng.getrandbits(25) << 7, 0x67 | rng.getrandbits(5) << 7 | rng.getrandbits(17) << 15,
                           rng.getrandbits(32)))
        code[4:8] = word.to_bytes(4, "little")
        if rng.random() < 0.3:
            code[6:8] = (0x9002 | rng.getrandbits(5) << 7).to_bytes(2, "little")
    return bytes(code)


@pytest.mark.parametrize("arch", ["x86_64", "arm64", "riscv"])
def test_fast_check_matches_capstone_on_random_calls(arch: str) -> None:
    rng = random.Random(14)
    backend = registry.get(arch)
    fast = settled = 0
    for _ in range(4000):
        checker = CallSiteChecker(backend, BytesImage(_windows(arch, rng)))
        fast += backend.call_site_length(checker.image.text, BASE + 8) is not None
        settled += backend.no_call_site(checker.image.text, BASE + 8)
        _same(checker, BASE + 8)
    assert fast > 1000  # the pre-check does take the common encodings
    assert settled > 500 or arch == "x86_64"  # and settles the other words (x86 asks capstone)


@pytest.mark.parametrize("top", [0xD63F, 0xD73F, 0x9400, 0x97FF, 0x9000, 0x9800, 0xD43F, 0xD63E, 0xD65F])
def test_arm64_words_next_to_the_call_encodings(top: int) -> None:
    """Words of the BLR/BLRAA* families (the 16 bits below ``top``, every 7th) and next to BL and them:
    the pre-check calls exactly what capstone calls a call."""
    backend = registry.get("arm64")
    for low in range(0, 1 << 16, 7):
        checker = CallSiteChecker(backend, BytesImage(bytes(4) + ((top << 16) | low).to_bytes(4, "little")))
        _same(checker, BASE + 8)
        assert (backend.call_site_length(checker.image.text, BASE + 8) is not None
                or backend.no_call_site(checker.image.text, BASE + 8))  # arm64 settles every word


@pytest.mark.parametrize("folder", sorted(p for p in CORPORA.glob("*/*") if p.is_dir()),
                         ids=lambda p: p.parent.name)
def test_fast_check_matches_capstone_on_every_corpus_return_address(folder: Path) -> None:
    addresses: set[int] = set()
    checker = None
    for path in paths_under(folder):
        session = load_session(path)
        checker = CallSiteChecker(session.backend, session.image)
        for task in session.dump.tasks():
            addresses.update(f.pc for f in session.replay(task, symbolize=False).frames)
    assert checker is not None and addresses
    # the full trixie 6.12 corpora carry text; the other generations and the 16K-page kernel do not
    if checker.image is None and ("6.12." not in folder.name or folder.name.endswith("-16k")):
        pytest.skip(f"{folder.name}: its slim image carries no text (corpora/README.md)")
    assert checker.image is not None
    for ret in sorted(addresses):
        _same(checker, ret)


def test_annotate_keeps_every_other_flag_and_a_flag_type() -> None:
    from unwind.core.callsite import CallSite
    from unwind.core.frame import Flag, Frame, Source
    checker = CallSiteChecker(registry.get("arm64"), None)
    checker._cache.update({0x1000: CallSite("ok", "bl #0xffc", 0xffc), 0x2000: CallSite("bad", "nop", 0x1ffc)})
    for value in range(1 << 8):
        for pc, bit in ((0x1000, Flag.CALLSITE_OK), (0x2000, Flag.CALLSITE_BAD)):
            frame = Frame(pc, source=Source.FRAME, flags=Flag(value))
            checker.annotate(frame)
            want = Flag(value) if value & Flag.BOUNDARY else Flag(value) | bit
            assert type(frame.flags) is Flag and frame.flags == want and frame.flags.names() == want.names()
