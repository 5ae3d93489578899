"""``unwind diff`` as a user runs it: columns labelled by who made each trace and the replay
mode, symbolised -v output, one unreadable file reported without ending the run, folders."""

from __future__ import annotations

import json
from pathlib import Path

from unwind.cli.main import main
from unwind.session.replay import load_session

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "corpora/x86_64/6.12.117+deb13-amd64"
RISCV = ROOT / "corpora/riscv/6.12.117+deb13-riscv64"


def _pS(session, pc: int) -> str:
    sym = session.symbols.lookup(pc)
    return str(sym) if sym is not None and sym.offset < sym.size else hex(pc)


def test_verbose_columns_are_labelled_and_symbolised(capsys):
    dump = X86 / "stop-024-sysrq-l-show_regs.bin.xz"
    assert main(["diff", "-v", str(dump)]) == 0
    out = capsys.readouterr().out.splitlines()
    s = load_session(dump)
    oracle = next(o for o in s.dump.oracles() if o["source"] == "sysrq-l")
    at = out.index(next(line for line in out if line.endswith(": printed") and "sysrq-l" in line))
    assert out[at + 1].split() == ["#", "kernel", "(sysrq-l)", "faithful", "replay"]
    first = _pS(s, int(oracle["frames"][0], 0))
    assert out[at + 2].split()[1] == first          # the oracle's first pc, as %pS from the image
    gdb = [i for i, line in enumerate(out) if ": gdb " in line]
    assert gdb and all(out[i + 1].split() == ["#", "gdb", "complete", "replay"] for i in gdb)


def test_an_unreadable_file_is_reported_and_the_run_goes_on(tmp_path, capsys):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a dump")
    good = RISCV / "stop-004-random.bin.xz"
    assert main(["diff", str(junk), str(good), str(tmp_path / "gone.bin")]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("unwind: error: ") and line.endswith("(skipped)") for line in lines)
    assert str(junk) in lines[0] and "gone.bin" in lines[1]
    assert "sysrq-t:" in out and "traces: exact" in out


def test_a_folder_stands_for_its_dumps(capsys):
    files = sorted(str(p) for p in RISCV.glob("stop-00[0-3]*.bin.xz"))
    assert main(["diff", "--json", *files]) == 0
    by_files = json.loads(capsys.readouterr().out)
    sub = ROOT / "corpora" / "riscv"
    assert main(["diff", "--json", str(sub)]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert sum(whole["counts"]["sysrq-t"].values()) > sum(by_files["counts"]["sysrq-t"].values()) > 0
    assert whole["unreadable"] == [] and all(d["mode"] == "complete replay" for d in whole["differences"]
                                             if d["source"] == "gdb")
