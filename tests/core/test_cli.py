"""``unwind replay`` output forms and exit codes, on the toy architecture."""

from __future__ import annotations

import json

from unwind.cli.main import main
from unwind.dev.synth import SynthDump

from .toy import BACKEND

TASK = 0x10000


def write(tmp_path, end=(0, 0)):
    sd = SynthDump(BACKEND)
    st = sd.stack("task", TASK, 0x4000, pid=7)
    st.put(TASK + 0x100, TASK + 0x200, 0x2000)
    st.put(TASK + 0x200, *end)
    sd.blocked_task(7, "worker", {"fp": TASK + 0x100, "pc": 0x1000})
    p = tmp_path / "d.bin"
    p.write_bytes(sd.to_bytes())
    return p


def test_text_output_and_clean_exit(tmp_path, capsys):
    p = write(tmp_path)
    assert main(["replay", str(p), "--all"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines == ["pid 7 (worker) blocked:", "Call trace:", " 0x1000", " 0x2000", "-- stop: end of stack (clean)"]
    assert "no image with build-id" in out.err


def test_error_stop_exit_1_keeps_partial_trace(tmp_path, capsys):
    p = write(tmp_path, end=(TASK + 0x204, 0x2001))   # misaligned next fp
    assert main(["replay", str(p), "--task", "7"]) == 1
    out = capsys.readouterr().out
    assert " 0x2001" in out and "misaligned frame pointer" in out and "(ERROR)" in out


def test_json_schema(tmp_path, capsys):
    p = write(tmp_path)
    assert main(["replay", str(p), "--all", "--json", "--reliable"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"schema", "arch", "kernel", "dump", "image", "task", "frames", "trace", "stop", "reliable"}
    assert doc["arch"] == "toy" and doc["task"]["pid"] == 7
    assert doc["dump"] == {"path": str(p), "build_id": "00" * 20} and doc["image"] is None
    assert doc["task"]["context"] == {"fp": hex(TASK + 0x100), "pc": "0x1000"} and doc["task"]["regs"] is None
    assert [f["pc"] for f in doc["frames"]] == ["0x1000", "0x2000"]
    assert set(doc["frames"][0]) == {"pc", "sp", "fp", "symbol", "printed_pc", "recovered_symbol", "source",
                                     "stack", "flags", "reliable", "line"}
    assert doc["frames"][1]["source"] == "frame record" and doc["frames"][1]["fp"] == hex(TASK + 0x200)
    # the trace as printed: the header, then one line per frame pointing back at it
    assert [(t["kind"], t["text"], t["frame"]) for t in doc["trace"]] == [
        ("header", "Call trace:", None), ("frame", " 0x1000", 0), ("frame", " 0x2000", 1)]
    assert [f["line"] for f in doc["frames"]] == [1, 2]
    assert doc["stop"] == {"reason": "end_of_stack", "text": "end of stack", "detail": "", "clean": True,
                           "truncated": False}
    assert doc["reliable"] == {"ok": True, "reason": ""}


def test_explain_shows_reads(tmp_path, capsys):
    p = write(tmp_path)
    assert main(["replay", str(p), "--all", "--explain"]) == 0
    out = capsys.readouterr().out
    assert f"read {TASK + 0x100:#x}+8 = {TASK + 0x200:#x}  (fp)" in out
    assert f"read {TASK + 0x108:#x}+8 = 0x2000  (lr)" in out


def test_unknown_task_is_bad_input(tmp_path, capsys):
    p = write(tmp_path)
    assert main(["replay", str(p), "--task", "99"]) == 2
    assert capsys.readouterr().err.endswith("unwind: error: --task 99 matched no task\n")


def test_generation_that_is_no_version_is_bad_input(tmp_path, capsys):
    p = write(tmp_path)
    for bad in ("latest", "six.twelve", "612", "", "6"):
        assert main(["replay", str(p), "--all", "--generation", bad]) == 2, bad
        err = capsys.readouterr().err
        assert "--generation" in err and "expected a kernel version" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    for old in ("2.6", "5.15", "v6.0"):
        assert main(["replay", str(p), "--all", "--generation", old]) == 2, old
        err = capsys.readouterr().err
        assert f"--generation {old}" in err and "from 6.1 on" in err and len(err.strip().splitlines()) == 1
    for good in ("6.1", "v6.13", "7.2.13+deb14-arm64"):
        assert main(["replay", str(p), "--all", "--generation", good]) == 0, good
        capsys.readouterr()


def test_the_program_gives_numpys_openblas_one_thread_unless_the_user_chose():
    """``unwind`` does no linear algebra: numpy's OpenBLAS gets one thread (its pool costs CPU at import),
    and a value the user set is kept."""
    import os
    import subprocess
    import sys

    probe = ("import os, unwind.cli.main as m; m.main = lambda: print(os.environ.get('OPENBLAS_NUM_THREADS')) or 0; "
             "from unwind.__main__ import console; console()")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for given, want in ((None, "1"), ("3", "3")):
        run_env = env if given is None else {**env, "OPENBLAS_NUM_THREADS": given}
        r = subprocess.run([sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == want, r.stderr[-500:]
