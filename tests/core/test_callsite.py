"""The call-site check, against objdump's reading of a compiled binary."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from unwind.core import registry
from unwind.core.callsite import CallSiteChecker
from unwind.core.frame import Flag, Frame, Provenance, Source
from unwind.formats.image import Image
from unwind.formats.slim import write_slim

from .test_image import elf_exe  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump not installed")


def objdump_lines(path) -> list[tuple[int, int, str]]:
    """(address, length, mnemonic) of every instruction in .text, as objdump decodes them."""
    out = subprocess.run(["objdump", "-d", "-j", ".text", "--no-show-raw-insn", str(path)],
                         capture_output=True, text=True, check=True).stdout
    insns = []
    for m in re.finditer(r"^\s*([0-9a-f]+):\s+(\S+)", out, re.M):
        insns.append((int(m.group(1), 16), m.group(2)))
    return [(a, b[0] - a, mn) for (a, mn), b in zip(insns, insns[1:])]


def test_return_addresses_after_calls_are_ok_others_bad(elf_exe):  # noqa: F811
    insns = objdump_lines(elf_exe)
    checker = CallSiteChecker(registry.get("x86_64"), Image(elf_exe))
    after_call = [a + n for a, n, mn in insns if mn.startswith("call")]
    after_other = [a + n for a, n, mn in insns if mn in ("mov", "add", "lea", "sub", "xor")]
    assert after_call and after_other
    for ret in after_call:
        site = checker.check(ret)
        assert site.status == "ok" and site.insn.startswith("call"), hex(ret)
    for ret in after_other:
        assert checker.check(ret).status == "bad", hex(ret)


def test_without_text_the_answer_is_unknown(elf_exe, tmp_path):  # noqa: F811
    slim = tmp_path / "notext.slim"
    write_slim(elf_exe, slim, with_text=False)
    checker = CallSiteChecker(registry.get("x86_64"), Image(slim))
    insns = objdump_lines(elf_exe)
    ret = next(a + n for a, n, mn in insns if mn.startswith("call"))
    assert checker.check(ret).status == "unknown"


def test_annotate_flags_and_explains(elf_exe):  # noqa: F811
    checker = CallSiteChecker(registry.get("x86_64"), Image(elf_exe))
    insns = objdump_lines(elf_exe)
    ret = next(a + n for a, n, mn in insns if mn.startswith("call"))
    f = Frame(ret, source=Source.ORC_CALL, provenance=Provenance("orc call"))
    checker.annotate(f)
    assert f.flags & Flag.CALLSITE_OK and "call site: ok" in f.provenance.notes[0]
    g = Frame(ret, source=Source.REGS_PC, flags=Flag.BOUNDARY)
    assert checker.annotate(g) is None and not g.flags & (Flag.CALLSITE_OK | Flag.CALLSITE_BAD)
