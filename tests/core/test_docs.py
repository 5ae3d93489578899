"""User-facing docs that drift: the README's two set-up commands, corpora/README.md's counts
against the committed dumps, the recorded benchmark report's wording."""

from __future__ import annotations

import re
from pathlib import Path

from unwind.formats.dump import Dump

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"x86_64": "x86_64/6.12.117+deb13-amd64", "arm64": "arm64/6.12.117+deb13-arm64",
           "riscv": "riscv/6.12.117+deb13-riscv64"}


def test_readme_has_two_setup_commands_a_plain_install_and_the_tests():
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)\n```", setup, re.S)
    assert len(blocks) == 2 and all("\n" not in b for b in blocks)
    assert blocks[0].startswith("python3 -m pip install . && unwind replay corpora/") and "[test]" not in blocks[0]
    assert blocks[1] == "python3 -m pip install -e '.[test]' && python3 -m pytest -q"


def _row(label: str) -> list[str]:
    for line in (ROOT / "corpora" / "README.md").read_text().splitlines():
        if line.startswith(f"| {label} |"):
            return [c.strip() for c in line.strip("|").split("|")[1:]]
    raise AssertionError(f"no row {label!r}")


def test_corpora_readme_counts_match_the_dumps():
    stops = _row("stops (random / IRQ bp / syscall-entry bp / hijack bp / sysrq-l / ftrace)")
    oracles = _row("sysrq-l / gdb")
    for i, arch in enumerate(("x86_64", "arm64", "riscv")):
        dumps = sorted((ROOT / "corpora" / FOLDERS[arch]).glob("stop-*.bin.xz"))
        assert int(stops[i].split()[0]) == len(dumps)
        found = {"sysrq-l": [0, 0], "gdb": [0, 0]}
        for p in dumps:
            for o in Dump.open(p).oracles():
                if o["source"] in found:
                    found[o["source"]][0] += 1
                    found[o["source"]][1] += len(o["frames"])
        want = f"{found['sysrq-l'][0]} ({found['sysrq-l'][1]}) / {found['gdb'][0]} ({found['gdb'][1]})"
        assert oracles[i] == want, arch


def test_recorded_report_has_no_internal_wording_or_signed_plus():
    report = (ROOT / "docs" / "benchmark-report" / "report.md").read_text()
    assert "issue 7" not in report and "+ -" not in report


def test_readme_library_examples_run(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    exec(compile("\n".join(blocks), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "lapic_next_event+" in out and "[orc call]" in out
