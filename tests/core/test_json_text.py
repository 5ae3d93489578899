"""``--json`` carries everything the text shows, as data: checked on every corpus dump, every task.

Text and JSON are produced by two separate ``unwind replay`` runs. For each task the JSON's
``trace`` must hold the printed lines in order, and each line's data must say what its text
says: parsed here from the text (addresses, register values, symbol names looked up in the
image's own symbol table), not taken from the printer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.session.replay import load_session

ROOT = Path(__file__).resolve().parents[2]
DUMPS = sorted((ROOT / "corpora").glob("*/*/stop-*.bin.xz"))
_SYM = re.compile(r"([A-Za-z_.$][\w.$]*)\+0x[0-9a-f]+/0x[0-9a-f]+")


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().out


def _blocks(text: str) -> list[list[str]]:
    """The text output split per task: header line ... ``-- stop:`` line."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("pid ") and line.endswith(":") and (not blocks or blocks[-1][-1].startswith("-- stop:")):
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def _name_at(symbols, addr: int, backtrace: bool) -> str | None:
    sym = symbols.lookup(addr - 1 if backtrace else addr) if symbols is not None else None
    return None if sym is None else sym.name


def _check_line(entry: dict, doc: dict, symbols, backtrace: bool) -> None:
    text, kind = entry["text"], entry["kind"]
    if kind in ("frame", "guess"):
        pc = int(entry["pc"], 16)
        assert entry["symbol"] in text
        if kind == "guess":
            assert text == f" ? {entry['symbol']}"
        m = _SYM.search(text)
        if m:  # the name printed is the name of the printed address
            assert m.group(1) == _name_at(symbols, pc, backtrace), text
        elif "[<" in text:  # riscv: [<%px>] %pS
            assert f"[<{pc:016x}>]" in text
        else:
            assert hex(pc) in text
        if kind == "frame":
            frame = doc["frames"][entry["frame"]]
            assert frame["line"] is not None and doc["trace"][frame["line"]]["frame"] == entry["frame"]
            assert frame["printed_pc"] == entry["pc"] and frame["symbol"] == entry["symbol"]
    elif kind == "regs":
        assert entry["regs"]
        for name, value in entry["regs"].items():
            v = int(value, 16)
            shown = [int(x, 16) for x in re.findall(r"(?<![\w+])(?:0x)?([0-9a-f]{2,16})(?![\w/])", text)]
            assert v in shown or (entry.get("symbol") and entry["symbol"] in text), (name, value, text)
    elif kind == "code":
        assert text == f"Code: {entry['before']} <{entry['at']}> {entry['after']}"
    elif kind == "marker":
        assert entry["stack"].lower() in text.lower()
    else:
        assert kind == "header" and entry["frame"] is None


def _stop_line(stop: dict) -> str:
    body = f"{stop['text']}: {stop['detail']}" if stop["detail"] else stop["text"]
    mark = "clean" if stop["clean"] else "ERROR"
    return f"-- stop: {body} ({mark}{', truncated' if stop['truncated'] else ''})"


@pytest.mark.parametrize("dump", DUMPS, ids=[f"{p.parts[-3]}/{p.name}" for p in DUMPS])
def test_json_carries_the_text(dump, capsys):
    session = load_session(dump)
    backtrace = session.backend.name == "x86_64"   # x86 prints return addresses with %pB
    for mode in ([], ["--complete"]):
        rc_text, text = _run(capsys, ["replay", str(dump), "--all", *mode])
        rc_json, out = _run(capsys, ["replay", str(dump), "--all", "--json", *mode])
        assert rc_text == rc_json
        docs = [json.loads(line) for line in out.splitlines()]
        blocks = _blocks(text)
        assert len(blocks) == len(docs)
        for block, doc in zip(blocks, docs):
            t = doc["task"]
            where = f" on cpu{t['cpu']}" if t["running"] else " blocked"
            assert block[0] == f"pid {t['pid']} ({t['comm']}){where}:"
            assert block[-1] == _stop_line(doc["stop"])
            assert [e["text"] for e in doc["trace"]] == block[1:-1]
            for entry in doc["trace"]:
                _check_line(entry, doc, session.symbols, backtrace)
            printed = {e["frame"] for e in doc["trace"] if e["frame"] is not None}
            for i, f in enumerate(doc["frames"]):
                assert (f["line"] is not None) == (i in printed)
                assert f["stack"] is None or "@" not in f["stack"]   # the stack's kind, as documented
            assert doc["dump"]["build_id"] == session.dump.build_id
            assert t["task_struct"] is None or int(t["task_struct"], 16) >> 47
            assert (t["regs"] is not None) == t["running"]
