"""``unwind diff`` on toy dumps whose oracle is known by construction."""

from __future__ import annotations

from unwind.cli import main
from unwind.synth import SynthDump
from unwind.tools import diff_dumps

from .toy import BACKEND

TASK = 0x10000


def write(tmp_path, name, oracle_frames):
    sd = SynthDump(BACKEND)
    st = sd.stack("task", TASK, 0x4000, pid=7)
    st.put(TASK + 0x100, TASK + 0x200, 0x2000)
    st.put(TASK + 0x200, 0, 0)
    sd.blocked_task(7, "worker", {"fp": TASK + 0x100, "pc": 0x1000})
    sd.oracles.append({"source": "sysrq-t", "pid": 7, "cpu": None, "frames": oracle_frames})
    p = tmp_path / name
    p.write_bytes(sd.to_bytes())
    return str(p)


def test_exact_match_exits_0(tmp_path, capsys):
    p = write(tmp_path, "a.bin", ["0x1000", "0x2000"])
    rep = diff_dumps([p])
    assert [r.category for r in rep.results] == ["exact"] and rep.ok
    assert main(["diff", p]) == 0
    assert "sysrq-t: 1 traces: exact 1" in capsys.readouterr().out


def test_unexplained_difference_exits_1(tmp_path, capsys):
    p = write(tmp_path, "b.bin", ["0x1000", "0x2004"])
    assert main(["diff", p]) == 1
    out = capsys.readouterr().out
    assert "unexplained" in out and "expected 0x1000 0x2004" in out and "replayed 0x1000 0x2000" in out
