"""gdb opens a written dump as a core file and sees the registers we wrote."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from unwind.dev.synth import SynthDump


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
def test_gdb_reads_prstatus_and_memory(tmp_path):
    sd = SynthDump("x86_64")
    st = sd.stack("task", 0xFFFFC90000010000, 0x4000, pid=1)
    st.put(0xFFFFC90000013F00, 0x1122334455667788)
    sd.running_task(1, "init", 0, {"rip": 0xFFFFFFFF81000123, "rsp": 0xFFFFC90000013F00, "rbp": 0x42})
    p = tmp_path / "dump.bin"
    p.write_bytes(sd.to_bytes())
    out = subprocess.run(
        ["gdb", "-nx", "-batch", "-ex", "set architecture i386:x86-64", "-ex", f"core-file {p}",
         "-ex", "info registers rip rsp rbp", "-ex", "x/gx 0xffffc90000013f00"],
        capture_output=True, text=True, timeout=60).stdout
    assert "0xffffffff81000123" in out
    assert "0xffffc90000013f00" in out and "0x42" in out
    assert "0x1122334455667788" in out
