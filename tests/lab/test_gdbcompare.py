"""How gdb's walk is counted against the kernel's own trace of the same stop (unwind.lab.gdbcompare)."""

from __future__ import annotations

import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from unwind.formats.image import open_image
from unwind.lab import gdbcompare
from unwind.lab.gdbcompare import (EVENTS, GdbCompare, PROBE_OFFSET, Stop, kernel_walk, matched, probe_definition,
                                   probe_refusal)
from unwind.lab.oracles import SystemMap


def test_matched_counts_from_the_kernels_first_frame_in_order() -> None:
    kernel = [0x10, 0x20, 0x30, 0x40]
    assert matched(kernel, [0x1, 0x2, 0x10, 0x20, 0x30, 0x40, 0x50]) == 4  # the tracer's own frames above
    assert matched(kernel, [0x10, 0x20, 0x99, 0x40]) == 2  # a wrong frame ends the count
    assert matched(kernel, [0x1, 0x20, 0x30]) == 0  # the kernel's first frame never reached
    assert matched(kernel, [0x10, 0x20]) == 2 and matched([], [0x10]) == 0


# -- the kernel's trace, refused probes, triggers that do not fire -------------------------------------

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
#: the guest's tracing error_log after a refused kprobe event, as tracing_err_log_seq_show() prints it
#: (kernel/trace/trace.c: "[%5llu.%06u] " loc err_text, then "  Command: " cmd and the caret line)
_ERROR_LOG = ("[   63.581245] trace_kprobe: error: Failed to register probe event\n"
              "  Command: p:unwind_read_zero read_zero\n"
              "                                ^\n")


def test_kernel_walk_gives_the_trace_line_by_line() -> None:
    smap = SystemMap(DATA / "System.map-riscv64-excerpt")
    text = (DATA / "ftrace-stacktrace-riscv.txt").read_text()
    pcs, lines = kernel_walk(text, smap, 1)
    block = [ln for ln in text.splitlines() if "<stack trace>" in ln or ln.startswith(" => ")]
    assert lines == block and len(pcs) == len(block) - 1  # whole lines, not characters
    stop = Stop("riscv", "irq", 1, pcs, [], [], lines)
    assert stop.to_json()["kernel_text"] == block
    with pytest.raises(RuntimeError, match="cpu0: 0 usable"):
        kernel_walk(text, smap, 0)


def test_probe_refusal_is_the_error_logs_reason() -> None:
    typed = "echo > /sys/kernel/tracing/error_log; echo 'p:x read_zero' >> k || { echo UNWI''ND-GC-REFUSED; }"
    assert probe_refusal(f"{typed}\n{gdbcompare._REFUSED}\n{_ERROR_LOG}UNWIND-GC-DONE\n") == \
        "Failed to register probe event"
    assert probe_refusal(f"{typed}\nUNWIND-GC-DONE\n") is None  # taken: the marker is only in the typed line
    assert probe_refusal(f"{gdbcompare._REFUSED}\n") == "no reason in the guest's tracing error_log"


class _Guest:
    """A guest shell that refuses kprobe events; the commands typed."""

    def __init__(self) -> None:
        self.typed: list[str] = []

    def shell(self, cmd: str, done: str = "") -> str:
        self.typed.append(cmd)
        return f"{cmd}\n{gdbcompare._REFUSED}\n{_ERROR_LOG}" if "kprobe_events" in cmd else cmd


def test_a_refused_probe_is_a_stop_saying_so_without_starting_gdb(monkeypatch) -> None:
    guest = _Guest()
    cmp = object.__new__(GdbCompare)
    cmp.shell = guest.shell  # type: ignore[method-assign]

    def no_gdb(*_a, **_k):
        raise AssertionError("gdb started for a refused probe")

    monkeypatch.setattr(subprocess, "Popen", no_gdb)
    stop = cmp.stop(EVENTS[1], "riscv")
    assert stop.refused == ("the guest refused the probe 'p:unwind_read_zero read_zero+8': "
                            "Failed to register probe event")
    assert stop.summary() == f"riscv hijack: no stop: {stop.refused}"
    assert stop.to_json()["refused"] == stop.refused and stop.counts == (0, 0)


def _fake_gdb(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _compare(armed: Path, stop_timeout: float) -> GdbCompare:
    """A GdbCompare whose console arms the trigger by creating ``armed``."""
    cmp = object.__new__(GdbCompare)
    cmp.timeout, cmp.stop_timeout = 600.0, stop_timeout
    cmp.console = type("Console", (), {"type": lambda self, line: armed.write_text(line)})()
    return cmp


def test_gdbs_report_is_read_as_it_comes(tmp_path: Path) -> None:
    """gdb's lines before "ready" come in the same write as it: the trigger is armed on it (the stand-in
    gdb reports the stop only once it is), and the report is gdb's."""
    armed = tmp_path / "armed"
    ready, report = gdbcompare._MARK + '{"ready": true}', gdbcompare._MARK + '{"cpu": 1, "pc": 16}'
    proc = _fake_gdb(f"import os, sys, time\nsys.stdout.write('0x1 in f ()\\nBreakpoint 1\\n' + {ready!r} + '\\n')\n"
                     f"sys.stdout.flush()\nwhile not os.path.exists({str(armed)!r}): time.sleep(0.05)\n"
                     f"print({report!r}, flush=True)")
    try:
        assert _compare(armed, 60.0)._gdb_report(proc, EVENTS[1]) == {"cpu": 1, "pc": 16}
        assert "stacktrace:1" in armed.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_a_trigger_that_does_not_fire_ends_the_wait(tmp_path: Path) -> None:
    ready = gdbcompare._MARK + '{"ready": true}'
    proc = _fake_gdb(f"print({ready!r}, flush=True); import time; time.sleep(600)")
    try:
        assert _compare(tmp_path / "armed", 0.5)._gdb_report(proc, EVENTS[1]) is None
    finally:
        proc.kill()
        proc.wait()


def test_the_riscv_probe_is_past_the_ftrace_patch_site(tmp_path: Path) -> None:
    """riscv v6.12 refuses a kprobe at a function's ftrace site (check_ftrace_location(), no
    KPROBES_ON_FTRACE): the probe goes to the first instruction after the ``c.nop``s
    -fpatchable-function-entry put at the start of ``read_zero`` in the Debian image."""
    (slim,) = (REPO / "corpora/riscv/6.12.117+deb13-riscv64").glob("vmlinux-*.slim.xz")
    path = tmp_path / "vmlinux"
    path.write_bytes(lzma.decompress(slim.read_bytes()))
    image = open_image(path)
    start = image.symbols.address("read_zero")
    assert start is not None
    code = image.text(start, 32)
    nops = 0
    while code[nops:nops + 2] == b"\x01\x00":  # c.nop
        nops += 2
    assert nops == PROBE_OFFSET["riscv"] > 0
    assert probe_definition("p:unwind_read_zero read_zero", "riscv") == "p:unwind_read_zero read_zero+8"
    assert probe_definition("p:unwind_read_zero read_zero", "x86_64") == "p:unwind_read_zero read_zero"


def test_a_stop_whose_trigger_does_not_fire_lets_the_guest_run_again(tmp_path: Path, monkeypatch) -> None:
    """gdb killed in ``continue`` leaves QEMU's VM stopped: a gdb detaches before the guest's shell is used."""
    said: list[str] = []
    cmp = _compare(tmp_path / "armed", 0.5)
    cmp.lab, cmp.trigger, cmp.gdb, cmp.vmlinux = {"gdb": "127.0.0.1:1"}, 0x1000, "gdb-multiarch", Path("vmlinux")
    cmp.shell = lambda cmd, done="": said.append(cmd) or ""  # type: ignore[method-assign]
    cmp.release = lambda: said.append("detach")  # type: ignore[method-assign]
    ready = gdbcompare._MARK + '{"ready": true}'
    real = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: real(
        [sys.executable, "-c", f"print({ready!r}, flush=True); import time; time.sleep(600)"], **k))
    stop = cmp.stop(EVENTS[0], "x86_64")
    assert stop.refused == "the trigger on timer/hrtimer_expire_entry did not fire within 0.5s"
    assert said[-2:] == ["detach", f"echo 0 > {gdbcompare.FTRACE_INSTANCE}/events/timer/hrtimer_expire_entry/enable"]
