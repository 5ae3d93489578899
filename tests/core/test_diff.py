"""``unwind diff`` on toy dumps whose oracle is known by construction."""

from __future__ import annotations

from unwind.cli.main import main
from unwind.dev.synth import SynthDump
from unwind.cli.corpus import diff_dumps

from .toy import BACKEND

TASK = 0x10000


def write(tmp_path, name, oracle_frames, source="sysrq-t"):
    sd = SynthDump(BACKEND)
    st = sd.stack("task", TASK, 0x4000, pid=7)
    st.put(TASK + 0x100, TASK + 0x200, 0x2000)
    st.put(TASK + 0x200, 0, 0)
    sd.blocked_task(7, "worker", {"fp": TASK + 0x100, "pc": 0x1000})
    sd.oracles.append({"source": source, "pid": 7, "cpu": None, "frames": oracle_frames})
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
    assert "unexplained" in out
    assert [line.split() for line in out.splitlines()[1:4]] == [
        ["#", "kernel", "(sysrq-t)", "faithful", "replay"], ["0", "0x1000", "0x1000"], ["1|", "0x2004", "0x2000"]]


def test_ftrace_stacktrace_compared_from_its_first_pc(tmp_path):
    """The trigger's walk skips the tracer's own top frames, the stop is above them: the replay frames
    above the oracle's first pc are left out (and counted), the rest must be equal pc for pc."""
    p = write(tmp_path, "c.bin", ["0x2000"], "ftrace-stacktrace")
    (r,) = diff_dumps([p]).results
    assert r.source == "ftrace-stacktrace" and r.category == "exact" and r.cut == 1 and r.got == [0x2000]
    # the same rule does not hide a difference below the first pc, nor apply to other sources
    for frames, source in ((["0x1000", "0x2004"], "ftrace-stacktrace"), (["0x2000"], "sysrq-t")):
        p = write(tmp_path, "d.bin", frames, source)
        (r,) = diff_dumps([p]).results
        assert r.category == "unexplained" and r.cut == 0, (frames, source)
