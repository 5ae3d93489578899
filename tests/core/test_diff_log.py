"""``unwind diff DUMP --oracle LOG`` against console logs made of the kernel's own printed traces (the
oracles stored in the committed dumps), and against the same logs with a line changed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.formats.console import BlockKind, parse_traces, strip_prefix
from unwind.session.replay import load_session

ROOT = Path(__file__).resolve().parents[2]
X86_SYSRQ_L = ROOT / "corpora/x86_64/6.12.117+deb13-amd64/stop-024-sysrq-l-show_regs.bin.xz"
ARM64_72 = ROOT / "corpora/arm64/7.2.13+deb14-arm64/stop-002-irq-arch_timer_handler_virt.bin.xz"
ARM64_SYSRQ_L = ROOT / "corpora/arm64/6.12.117+deb13-arm64/stop-025-sysrq-l-show_regs.bin.xz"
RISCV_MODULES = ROOT / "corpora/riscv/6.12.117+deb13-riscv64/vmcore/stop-001-random.bin.xz"

#: printk prefixes a log may carry: dmesg -r's level, the timestamp, CONFIG_PRINTK_CALLER's id, syslog's
PREFIXES = ("<6>[{n:5d}.{m:06d}] ", "[{n:5d}.{m:06d}][    T{n}] ", "Dec  2 11:57:15 guest kernel: [{n:5d}.{m:06d}] ", "")


def _oracles(dump: Path) -> list[dict]:
    """The dump's kernel-printed traces it keeps as good (not marked stale at capture)."""
    return [o for o in load_session(dump).dump.oracles()
            if o["source"] in ("sysrq-t", "sysrq-l") and not o.get("stale")]


def _log(oracles: list[dict]) -> list[str]:
    """A console log of the oracles' printed text, each block under another printk prefix."""
    out = []
    for n, o in enumerate(oracles):
        prefix = PREFIXES[n % len(PREFIXES)]
        out.extend(prefix.format(n=n, m=m) + line for m, line in enumerate(o["text"].split("\n")))
    return out


def _diff(tmp_path: Path, capsys, dump: Path, lines: list[str], *more: str) -> tuple[int, str, str]:
    """``unwind diff DUMP --oracle LOG`` of ``lines``: exit status, stdout, stderr."""
    log = tmp_path / "console.txt"
    log.write_text("\n".join(lines) + "\n")
    rc = main(["diff", str(dump), "--oracle", str(log), *more])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("dump", [X86_SYSRQ_L, ARM64_72, ARM64_SYSRQ_L, RISCV_MODULES], ids=lambda p: p.parent.name)
def test_every_stored_kernel_trace_agrees(tmp_path, dump, capsys):
    oracles = _oracles(dump)
    assert oracles
    rc, out, err = _diff(tmp_path, capsys, dump, _log(oracles), "--json")
    report = json.loads(out)
    assert rc == 0 and report["agrees"] and report["unmatched"] == [], err
    assert len(report["compared"]) == len(oracles)
    assert all(c["agrees"] and c["printed"] for c in report["compared"])


def test_the_stored_oracles_name_frames_the_printed_way():
    """7.x arm64 source markers (`(T)`) and riscv module frames are in the corpora this file tests on."""
    arm = "\n".join(o["text"] for o in _oracles(ARM64_72))
    assert " (T)" in arm
    assert " [scsi_mod]" in "\n".join(o["text"] for o in _oracles(RISCV_MODULES))


def test_a_changed_offset_is_one_difference_at_its_line(tmp_path, capsys):
    lines = _log(_oracles(ARM64_72))
    at = next(i for i, line in enumerate(lines) if strip_prefix(line).strip().startswith("schedule+0x"))
    text = strip_prefix(lines[at]).strip()
    name, _, rest = text.partition("+0x")
    off = int(rest.split("/")[0], 16)
    lines[at] = lines[at].replace(f"{name}+0x{off:x}/", f"{name}+0x{off + 4:x}/")
    rc, out, _ = _diff(tmp_path, capsys, ARM64_72, lines)
    assert rc == 1
    diffs = [line for line in out.splitlines() if " frame " in line]
    assert len(diffs) == 1
    assert diffs[0].startswith(f"{tmp_path / 'console.txt'}:{at + 1}: pid ")
    assert diffs[0].endswith(f"printed {name}+{off + 4:#x}, replayed {name}+{off:#x}")
    assert "1 differ, 0 unmatched" in out


def test_a_dropped_frame_line_shows_from_there_on(tmp_path, capsys):
    lines = _log(_oracles(X86_SYSRQ_L))
    blocks = parse_traces("\n".join(lines))
    block = next(b for b in blocks if b.kind is BlockKind.TASK and len(b.reliable) >= 4)
    gone = block.reliable[1]
    del lines[gone.line - 1]
    rc, out, _ = _diff(tmp_path, capsys, X86_SYSRQ_L, lines, "--json")
    assert rc == 1
    (bad,) = [c for c in json.loads(out)["compared"] if not c["agrees"]]
    assert bad["who"] == block.who() and bad["differences"][0]["frame"] == 1
    assert bad["differences"][0]["replayed"] == gone.key
    assert bad["differences"][-1]["printed"] is None     # the replay has one frame more


def test_a_task_the_dump_lacks_is_unmatched_not_a_difference(tmp_path, capsys):
    oracles = _oracles(ARM64_72)
    pids = {t.pid for t in load_session(ARM64_72).dump.tasks()}
    new = max(pids) + 1000
    lines = _log(oracles) + [
        f"[  99.000000] task:late            state:S stack:0     pid:{new:<5d} tgid:{new:<5d} ppid:1      flags:0x0",
        "[  99.000000] Call trace:", "[  99.000000]  __switch_to+0x180/0x348 (T)",
        "[  99.000000] task:notthisone      state:S stack:0     pid:1     tgid:1     ppid:0      flags:0x0",
        "[  99.000000] Call trace:", "[  99.000000]  __switch_to+0x180/0x348 (T)"]
    rc, out, _ = _diff(tmp_path, capsys, ARM64_72, lines)
    assert rc == 0
    assert f"pid {new} (late): unmatched: no task with pid {new} in the dump" in out
    assert "pid 1 (notthisone): unmatched: pid 1 is " in out
    assert f"{len(oracles)} agree, 0 differ, 2 unmatched" in out


def test_a_crash_trace_is_compared_from_the_first_frame_both_hold(tmp_path, capsys):
    """A ``CPU:`` block printed on the way to the dump (panic's dump_stack) above the frames the
    dump's registers give: the two extra frames on top are left out, the rest must agree."""
    (regs,) = [o for o in load_session(X86_SYSRQ_L).dump.oracles() if o["source"] == "sysrq-l"]
    body = regs["text"].split("\n")
    cpu_line = next(line for line in body if line.startswith("CPU: "))
    trace = body[body.index("Call Trace:"):]
    lines = ["Kernel panic - not syncing: made up", cpu_line, "Call Trace:", " <TASK>",
             " dump_stack_lvl+0x5d/0x80", " panic+0x118/0x2db", *trace[2:]]
    rc, out, _ = _diff(tmp_path, capsys, X86_SYSRQ_L, lines, "--json")
    (c,) = json.loads(out)["compared"]
    assert rc == 0 and c["kind"] == "crash" and c["cut"] == [2, 0]
    wrong = [line.replace("PID: ", "PID: 9") if line is cpu_line else line for line in lines]
    rc, out, _ = _diff(tmp_path, capsys, X86_SYSRQ_L, wrong)
    assert rc == 2 and "unmatched: cpu" in out


def test_nothing_to_compare_says_so_and_exits_2(tmp_path, capsys):
    rc, out, err = _diff(tmp_path, capsys, ARM64_72, ["Booting Linux on physical CPU 0x0", "random: crng init done"])
    assert rc == 2 and "holds no trace" in err
    assert main(["diff", str(ARM64_72), str(X86_SYSRQ_L), "--oracle", str(tmp_path / "console.txt")]) == 2
    assert "one dump" in capsys.readouterr().err


def test_a_dump_without_oracles_is_not_silent(tmp_path, capsys):
    from unwind.dev.synth import SynthDump

    from .toy import BACKEND

    sd = SynthDump(BACKEND)
    st = sd.stack("task", 0x10000, 0x4000, pid=7)
    st.put(0x10100, 0, 0)
    sd.blocked_task(7, "worker", {"fp": 0x10100, "pc": 0x1000})
    p = tmp_path / "none.bin"
    p.write_bytes(sd.to_bytes())
    assert main(["diff", str(p)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"unwind: error: no oracle in {p}: nothing to compare (give the console " \
        "or dmesg log with --oracle LOG)"


def test_printk_prefixes_and_blocks():
    text = "\n".join([
        "<4>[   12.000001][  T123] task:sh              state:D stack:0     pid:123   ppid:1      flags:0x0",
        "<4>[   12.000002][  T123] Call trace:",
        "<4>[   12.000003][  T123]  __switch_to+0x180/0x348 (T)",
        "<4>[   12.000004][  T123]  uhid_char_read+0xd2/0x2c0 [uhid 0123abcd] (CF)",
        "Dec  2 11:57:15 host kernel: [   13.0] NMI backtrace for cpu 1",
        "Dec  2 11:57:15 host kernel: [   13.0] CPU: 1 UID: 0 PID: 5 Comm: kworker/1:0 Not tainted 7.2",
        "Dec  2 11:57:15 host kernel: [   13.0] Call trace:",
        "Dec  2 11:57:15 host kernel: [   13.0]  ? guess+0x1/0x2",
        "Dec  2 11:57:15 host kernel: [   13.0] [<ffffffff0204d9da>] 0xffffffff0204d9da",
        "[   14.0] NMI backtrace for cpu 0 skipped: idling at default_idle_call+0x2c/0x40",
        "[   15.0] Call Trace:",
        "[   15.0]  schedule+0x27/0xxc0",
    ])
    task, nmi, anon = parse_traces(text)
    assert (task.kind, task.pid, task.comm, task.state) == (BlockKind.TASK, 123, "sh", "D")
    assert [f.key for f in task.frames] == ["__switch_to+0x180", "uhid_char_read+0xd2 [uhid]"]
    assert [f.symbol.flags for f in task.frames] == ["T", "CF"]
    assert (nmi.kind, nmi.cpu, nmi.pid, nmi.comm) == (BlockKind.NMI, 1, 5, "kworker/1:0")
    assert [f.guess for f in nmi.frames] == [True, False] and nmi.reliable[0].address == 0xffffffff0204d9da
    assert anon.kind is BlockKind.TRACE and anon.frames == [] and anon.damaged == [(12, "schedule+0x27/0xxc0")]
