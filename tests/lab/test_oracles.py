"""Parsing the kernel's own traces captured from a real console (x86-64 6.12 sysrq-t excerpt, a riscv64
6.12 ftrace ``stacktrace`` trigger block read from ``per_cpu/cpu1/trace``)."""

from pathlib import Path

from unwind.lab.oracles import (SystemMap, parse_ftrace_stack, parse_regs_backtrace, parse_task_traces,
                                sysrq_oracles)

DATA = Path(__file__).parent / "data"


def _smap() -> SystemMap:
    return SystemMap(DATA / "System.map-x86_64-excerpt")


def _addr(smap: SystemMap, sym: str, off: int) -> str:
    return hex(smap.by_name[sym][0] + off)


def test_sysrq_t_blocks() -> None:
    smap = _smap()
    traces = parse_task_traces((DATA / "sysrq-t-x86_64.txt").read_text(), smap)
    assert len(traces) == 18
    by_pid = {t.pid: t for t in traces}
    assert by_pid[1].state == "R" and by_pid[1].comm == "sh"      # "state:R  running task" header
    k = by_pid[2]
    assert k.comm == "kthreadd" and k.state == "S"
    assert k.frames[:3] == [_addr(smap, "__schedule", 0x4ea), _addr(smap, "schedule", 0x27),
                            _addr(smap, "kthreadd", 0x2d3)]
    assert k.frames[-1] == _addr(smap, "ret_from_fork_asm", 0x1a)
    # "? __pfx_kthreadd+0x10/0x10" is a stack-scan guess, kept apart
    assert _addr(smap, "__pfx_kthreadd", 0x10) in k.unreliable
    assert k.corrupt is None


def test_damaged_console_line_marks_the_block() -> None:
    smap = _smap()
    text = (DATA / "sysrq-t-x86_64.txt").read_text().replace("schedule+0x27/0xc0", "schedule+0x27/0xxc0", 1)
    ents = sysrq_oracles(text, smap)
    bad = [e for e in ents if e.get("stale")]
    assert len(bad) == 1 and "damaged line" in bad[0]["why"]
    # a repeated digit gives an offset past the function: caught by the size check
    text = (DATA / "sysrq-t-x86_64.txt").read_text().replace("kthreadd+0x2d3/0x2f0", "kthreadd+0x2dd3/0x2f0")
    bad = [e for e in sysrq_oracles(text, smap) if e.get("stale")]
    assert [e["pid"] for e in bad] == [2]


def test_riscv_style_lines_carry_addresses() -> None:
    text = ("[  1.0] task:sleep state:S stack:0 pid:77 tgid:77 ppid:1 flags:0x0\n"
            "[  1.0] Call Trace:\n"
            "[  1.0] [<ffffffff80a7854c>] __schedule+0x3a6/0xbd2\n"
            "[  1.0] [<ffffffff80a78e3a>] schedule+0x2a/0xd6\n")
    (t,) = parse_task_traces(text, None)
    assert t.pid == 77 and t.frames == ["0xffffffff80a7854c", "0xffffffff80a78e3a"]


def test_sysrq_l_block_of_one_cpu() -> None:
    text = ("NMI backtrace for cpu 0\n"
            "Call Trace:\n <TASK>\n schedule+0x27/0xc0\n</TASK>\n"
            "NMI backtrace for cpu 1\n"
            "RIP: 0010:schedule+0x27/0xc0\n"
            "Call Trace:\n <IRQ>\n __schedule+0x4ea/0xbe0\n </IRQ>\n <TASK>\n"
            "RIP: 0010:kthreadd+0x2d3/0x2f0\n"
            " ? __pfx_kthreadd+0x10/0x10\n 0xffffffffc020c099\n ret_from_fork_asm+0x1a/0x30\n"
            " </TASK>\n")
    smap = _smap()
    r = parse_regs_backtrace(text, 1, smap)
    assert r["frames"] == [_addr(smap, "__schedule", 0x4ea), "0xffffffffc020c099",
                           _addr(smap, "ret_from_fork_asm", 0x1a)]
    assert r["pt_regs"] == [{"after": 1, "pc": _addr(smap, "kthreadd", 0x2d3)}]
    assert r["unreliable"] == [_addr(smap, "__pfx_kthreadd", 0x10)] and "stale" not in r


def test_ftrace_stack_trace_block() -> None:
    smap = SystemMap(DATA / "System.map-riscv64-excerpt")
    text = (DATA / "ftrace-stacktrace-riscv.txt").read_text()
    (b,) = parse_ftrace_stack(text, smap)
    assert b["cpu"] == 1 and "stale" not in b
    # sym-addr gives the pc itself; the first printed frame is the first one the skip count left
    assert b["frames"][0] == hex(smap.by_name["trace_event_buffer_commit"][0] + 0x7c) == "0xffffffff8014e49c"
    # the kernel's riscv walk does not recover these fgraph-hijacked returns: printed as the trampoline
    assert b["frames"][-3:] == ["0xffffffff8000c9e0", "0xffffffff8000c9e0", "0xffffffff80a814e2"]
    assert len(b["frames"]) == 12 and b["text"].splitlines()[0].endswith("<stack trace>")
    # a damaged line (name/offset disagreeing with its address) marks the block stale
    bad = text.replace("hrtimer_interrupt+0xde/0x1fa", "hrtimer_interrupt+0xdf/0x1fa")
    (b,) = parse_ftrace_stack(bad, smap)
    assert b["stale"] and "disagrees with System.map" in b["why"]


def test_arm64_7x_source_and_flag_markers() -> None:
    # sid 7.2.13 arm64 sysrq-t: dump_backtrace_entry() appends " (T)", " (F)", " (K)", " (P)"
    smap = SystemMap(DATA / "System.map-arm64-7.2-excerpt")
    text = (DATA / "sysrq-t-arm64-7.2.txt").read_text()
    by_pid = {t.pid: t for t in parse_task_traces(text, smap)}
    md5 = by_pid[152]
    assert md5.corrupt is None and len(md5.frames) == 13
    assert md5.frames[0] == _addr(smap, "__switch_to", 0x180)          # (T)
    assert md5.frames[3] == _addr(smap, "anon_pipe_read", 0x300)      # (F)
    assert md5.frames[6] == _addr(smap, "__arm64_sys_read", 0x20)     # (K)
    exe = by_pid[153]
    assert exe.corrupt is None
    assert hex(smap.resolve("tlb_flush", 0x258, 0x5f8)) in exe.frames  # (P): the interrupted pc (5 static tlb_flush)
    assert not any(e.get("stale") for e in sysrq_oracles(text, smap))
