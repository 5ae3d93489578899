"""The committed true kdumps: x86-64's (``corpora/x86_64/6.12.117+deb13-amd64/vmcore/kdump-*``) in detail, then
every arch's: the crash CPU first, its panic trace, the RAM a kdump's headers leave out, where KASLR put the kernel.

``kdump-NNN.elf.xz`` is ``/proc/vmcore`` of a 6.12 guest crashed by sysrq ``c`` with a kexec'ed crash
kernel, cut to the pages ``unwind`` and drgn read: ``kdump-000`` booted with ``nokaslr`` (CPU 0 panicked),
``kdump-001`` with KASLR on (CPU 1 panicked; its ``/proc/iomem`` and ``/proc/kallsyms`` lines kept beside it).
The crash CPU saved its registers in ``__crash_kexec()`` (``crash_setup_regs()``, ``rip = _THIS_IP_``), a
function with no ORC (``STACK_FRAME_NON_STANDARD``); the other CPU was stopped by the crash NMI. Oracles: the
first kernel's own panic trace (``kdump-NNN.console.txt``, printed by ``dump_stack()`` in ``panic()`` just before
``__crash_kexec()``) and drgn 0.3.0 on the full vmcore (``kdump-NNN.drgn-tasks.json.xz``; drgn unwinds
``__crash_kexec`` through its DWARF CFI).
"""

from __future__ import annotations

import json
import lzma
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from unwind.cli.main import main

HERE = Path(__file__).resolve().parents[2] / "corpora" / "x86_64" / "6.12.117+deb13-amd64"
#: x86-64's true kdumps: nokaslr (kdump-000) and KASLR on (kdump-001)
X86_KDUMPS = sorted((HERE / "vmcore").glob("kdump-*.elf.xz"))
_STAMP = re.compile(r"^\[\s*\d+\.\d+\] ")


@pytest.fixture(scope="module", params=X86_KDUMPS, ids=lambda p: p.name.split(".")[0])
def kdump(request) -> dict:
    """The slice (read as it is committed, xz), the slim image, drgn's tasks, the console's panic trace and the
    crash CPU, pid and comm its panic header names."""
    elf = request.param
    stem = elf.name.split(".")[0]
    drgn = json.loads(lzma.decompress(elf.with_name(f"{stem}.drgn-tasks.json.xz").read_bytes()))
    console = elf.with_name(f"{stem}.console.txt").read_text().splitlines()
    trace = [_STAMP.sub("", ln) for ln in console]
    trace = trace[trace.index("Call Trace:") + 1:]
    con = panic_console(elf)
    return {"elf": elf, "slim": next(HERE.glob("vmlinux-*.slim.xz")), "drgn": {t["pid"]: t for t in drgn["tasks"]},
            "panic_trace": trace[:trace.index(" </TASK>") + 1], "cpu": str(con.cpu), "pid": con.pid,
            "head": f"pid {con.pid} ({con.comm}) on cpu{con.cpu}:"}


def _run(capsys, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().out.splitlines()


def _trace(lines: list[str]) -> list[str]:
    """The lines between ``Call Trace:`` and the stop line."""
    return lines[lines.index("Call Trace:") + 1:next(i for i, ln in enumerate(lines) if ln.startswith("-- stop"))]


def _from_panic(trace: list[str]) -> list[str]:
    """The lines after panic()'s own frame (the console's and ours differ only below it)."""
    i = next(i for i, ln in enumerate(trace) if ln.lstrip(" ?").startswith("panic+"))
    return trace[i + 1:]


def test_faithful_crash_cpu_is_what_the_kernels_unwinder_prints_from_those_registers(kdump, capsys) -> None:
    """unwind_next_frame() from the NT_PRSTATUS regs: ORC_TYPE_UNDEFINED -> goto err, so the printer
    marks every text word '?'; those words, from panic's frame up, are the console's lines. The walk ends
    where the kernel's does, at a function objtool skips by design: a clean, truncated stop (exit 0), and
    the reliable walk fails as arch_stack_walk_reliable() does on unwind_error()."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", kdump["cpu"],
                   "--reliable")
    assert rc == 0 and out[0] == kdump["head"] and out[1] == "RIP: 0010:__crash_kexec+0x120/0x140"
    trace = _trace(out)
    words = [ln for ln in trace if ln not in (" <TASK>", " </TASK>")]
    assert words and all(ln.startswith(" ? ") for ln in words)
    console = [ln.replace(" ? ", " ") for ln in _from_panic(kdump["panic_trace"]) if ln.startswith(" ")]
    ours = [ln.replace(" ? ", " ") for ln in _from_panic(trace)]
    kernel_words = console[:console.index(" entry_SYSCALL_64_after_hwframe+0x76/0x7e") + 1]
    assert ours[:len(kernel_words)] == kernel_words
    stop, reliable = out[-2], out[-1]
    assert stop.startswith("-- stop: the kernel's unwinder stops here: ") and stop.endswith("(clean, truncated)")
    assert "is UNDEFINED" in stop and "STACK_FRAME_NON_STANDARD" in stop and "--complete" in stop
    assert reliable.startswith("-- reliable: no: ")


def test_complete_crash_cpu_prints_the_kernels_panic_trace(kdump, capsys) -> None:
    """--complete: the caller of __crash_kexec proven by its call, then ORC: from panic's frame up,
    line for line the trace the kernel printed (the user-mode register block without its Code: line)."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", kdump["cpu"],
                   "--complete")
    assert rc == 0 and out[-1].startswith("-- stop: reached user-mode registers")
    trace = _trace(out)
    assert " panic+0x123/0x2db [complete: called __crash_kexec]" in trace
    assert " panic+0x118/0x2db" in kdump["panic_trace"]  # the console's panic frame is its dump_stack() call
    assert _from_panic(trace) == [ln for ln in _from_panic(kdump["panic_trace"]) if not ln.startswith("Code: ")]


def test_complete_crash_cpu_equals_drgn(kdump, capsys) -> None:
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", kdump["cpu"],
                   "--complete", "--json")
    frames = json.loads(out[0])["frames"]
    assert [int(f["pc"], 16) for f in frames] == [int(f["pc"], 16) for f in kdump["drgn"][kdump["pid"]]["frames"]]
    assert frames[1]["flags"][:2] == ["unreliable", "complete"] and frames[1]["source"] == "caller"


def test_complete_crash_cpu_is_not_reliable(kdump, capsys) -> None:
    """The frame --complete proves (panic's, where drgn has it too) is not one the reliable walk may take."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--cpu", kdump["cpu"],
                   "--complete", "--reliable")
    panic = int(kdump["drgn"][kdump["pid"]]["frames"][1]["pc"], 16)
    assert out[-1].startswith(f"-- reliable: no: complete-mode frame at {panic:#x}")


def test_every_other_task_equals_drgn(kdump, capsys) -> None:
    """The other CPU (stopped by the crash NMI) and every blocked task walk as drgn does (faithful mode)."""
    rc, out = _run(capsys, "replay", str(kdump["elf"]), "--vmlinux", str(kdump["slim"]), "--all", "--json")
    ours = {o["task"]["pid"]: o for o in map(json.loads, out) if o["task"]["pid"] != kdump["pid"]}
    drgn = {pid: t for pid, t in kdump["drgn"].items() if pid != kdump["pid"] and "frames" in t}
    assert set(drgn) <= set(ours) and len(drgn) > 50
    for pid, t in drgn.items():
        assert [f["pc"] for f in ours[pid]["frames"]] == [f["pc"] for f in t["frames"]], pid


def _with_words(mem, words: dict[int, int]):
    """The memory ``mem`` with the words at these addresses replaced."""
    from unwind.core.memory import Memory, Segment

    segs = []
    for seg in mem.segments:
        data = bytearray(seg.data)
        for addr, value in words.items():
            if seg.start <= addr and addr + 8 <= seg.end:
                data[addr - seg.start:addr - seg.start + 8] = value.to_bytes(8, "little")
        segs.append(Segment(seg.start, bytes(data)))
    return Memory(segs, mem.holes)


def test_complete_takes_only_a_return_from_a_call_to_that_function(kdump, monkeypatch) -> None:
    """A text word that returns from a call to another function (here sysrq_handle_crash's return into
    __handle_sysrq, which follows 'call panic'), put below the real slot, is passed over; with the real
    slot gone there is no caller to prove and the walk stops as in faithful mode, saying why."""
    from unwind.session.replay import Session
    from unwind.core.target import Options
    from unwind.core.walk import StopReason

    s = Session.load(kdump["elf"], vmlinux=kdump["slim"])
    task = s.select(cpu=int(kdump["cpu"]))[0]
    good = s.replay(task, Options(complete=True))
    slot = good.frames[1].sp - 8
    sp = task.regs["rsp"]
    decoy = good.frames[2].pc  # returns into sysrq_handle_crash's caller: the call before it is not to __crash_kexec
    real = s.dump.task_memory
    monkeypatch.setattr(s.dump, "task_memory", lambda t: _with_words(real(t), {sp + 8: decoy}))
    assert [f.pc for f in s.replay(task, Options(complete=True)).frames] == [f.pc for f in good.frames]
    monkeypatch.setattr(s.dump, "task_memory", lambda t: _with_words(real(t), {slot: 0}))
    cut = s.replay(task, Options(complete=True))
    assert len(cut.frames) == 1 and cut.stop.reason is StopReason.KERNEL_LIMIT
    assert "no return address above sp follows a call" in cut.stop.detail


# -- every committed true kdump --------------------------------------------------------------------------------

#: the true kdumps: /proc/vmcore of a panic (sysrq c), cut to what unwind and drgn read, beside the console of the
#: kernel that panicked (``unwind lab kdump``, ``unwind lab kdump-slice``)
ALL_KDUMPS = sorted((HERE.parents[1]).glob("*/*/vmcore/kdump-*.elf.xz"))
#: riscv's kdump-001 was made while the lab put the crash kernel in the first kernel's initramfs: kexec-tools
#: 2.0.32 leaves the freed initrd range out of the ELF headers, and the kernel had reused it for both CPUs' stacks
#: or the page tables that map them, so no CPU can be walked from it (its /proc/iomem, kept beside it, says so)
STACKS_LEFT_OUT = [v for v in ALL_KDUMPS if v.parts[-4] == "riscv" and v.name.startswith("kdump-001.")]
#: the kdumps whose crash CPU can be walked
KDUMPS = [v for v in ALL_KDUMPS if v not in STACKS_LEFT_OUT]
#: panic()'s header: print_modules(), then dump_stack()'s "CPU: 0 UID: 0 PID: 1 Comm: init ..." (lib/dump_stack.c)
_HEADER = re.compile(r"^CPU: (\d+) UID: \d+ PID: (\d+) Comm: (\S+)")
#: a trace line: x86 and arm64 " [? ]sym+off/len", riscv "[<address>] sym+off/len"
_FRAME = re.compile(r"^(?: \? | |\[<[0-9a-f]+>\] )(\S+)")


@dataclass(frozen=True)
class PanicConsole:
    """What the panicking kernel printed: the CPU and task of dump_stack()'s header, and its trace."""

    cpu: int
    pid: int
    comm: str
    #: from the line after "Call trace:" to the last frame line (x86's register block and </TASK> included)
    trace: list[str]


def panic_console(vmcore: Path) -> PanicConsole:
    """The console kept beside a kdump vmcore, read as the kernel printed it (timestamps dropped)."""
    lines = [_STAMP.sub("", ln) for ln in vmcore.with_name(vmcore.name.split(".")[0] + ".console.txt")
             .read_text().splitlines()]
    cpu, pid, comm = next(m.groups() for ln in lines if (m := _HEADER.match(ln)))
    start = next(i for i, ln in enumerate(lines) if ln.lower() == "call trace:") + 1
    end = max(i for i, ln in enumerate(lines) if ln.startswith((" ", "[<"))) + 1
    return PanicConsole(int(cpu), int(pid), comm, lines[start:end])


def _symbol(line: str) -> str:
    m = _FRAME.match(line)
    return m.group(1) if m else ""


def _after_panic(trace: list[str]) -> list[str]:
    """The lines after panic()'s own frame: the console's is its dump_stack() call, ours its __crash_kexec()
    call; the callers below are the same calls."""
    i = next(i for i, ln in enumerate(trace) if _symbol(ln).startswith("panic+"))
    return [ln for ln in trace[i + 1:] if not ln.startswith("Code: ")]


def _kdump_id(p: Path) -> str:
    return f"{p.parts[-4]}-{p.parts[-3]}-{p.name.split('.')[0]}"


def _slim(vmcore: Path) -> str:
    return str(next(vmcore.parents[1].glob("vmlinux-*.slim.xz")))


@pytest.mark.parametrize("vmcore", KDUMPS, ids=_kdump_id)
def test_replay_shows_the_crash_cpu_first(vmcore: Path, capsys) -> None:
    """Plain ``replay`` lists the running tasks with the CPU that panicked first, as crash's ``bt`` starts from
    the panic task: the CPU and task the kernel named in its own panic header."""
    con = panic_console(vmcore)
    rc, out = _run(capsys, "replay", str(vmcore), "--vmlinux", _slim(vmcore))
    heads = [ln for ln in out if re.match(r"pid \d+ \(.*\) on cpu\d+:$", ln)]
    assert heads[0] == f"pid {con.pid} ({con.comm}) on cpu{con.cpu}:"
    assert len(heads) >= 2  # the other CPUs follow


@pytest.mark.parametrize("vmcore", KDUMPS, ids=_kdump_id)
def test_complete_crash_cpu_equals_the_console_panic_trace(vmcore: Path, capsys) -> None:
    """``--complete`` on the crash CPU: from panic() down, line for line the trace the kernel printed."""
    con = panic_console(vmcore)
    rc, out = _run(capsys, "replay", str(vmcore), "--vmlinux", _slim(vmcore), "--cpu", str(con.cpu), "--complete")
    assert rc == 0 and out[0] == f"pid {con.pid} ({con.comm}) on cpu{con.cpu}:"
    ours = out[1:next(i for i, ln in enumerate(out) if ln.startswith("-- stop"))]
    expected = _after_panic(con.trace)
    assert len(expected) >= 5
    assert _after_panic(ours) == expected


def _diff_oracle(capsys, vmcore: Path, console: Path) -> tuple[int, dict, list[str]]:
    """``unwind diff VMCORE --oracle CONSOLE``: exit status, its one comparison (JSON) and its text lines."""
    rc, out = _run(capsys, "diff", str(vmcore), "--vmlinux", _slim(vmcore), "--oracle", str(console), "--json")
    (compared,) = json.loads(out[0])["compared"]
    rc_text, text = _run(capsys, "diff", str(vmcore), "--vmlinux", _slim(vmcore), "--oracle", str(console))
    assert rc_text == rc
    return rc, compared, text


@pytest.mark.parametrize("vmcore", KDUMPS, ids=_kdump_id)
def test_diff_oracle_compares_the_panic_trace_below_panic(vmcore: Path, capsys) -> None:
    """``diff --oracle`` of the console: the panic trace (printed by dump_stack() in panic()) against the crash CPU's
    walk (from the registers __crash_kexec() saved, later on the same stack), compared below panic()'s frame, where
    the two moments part: every frame the console printed below it, as the console printed it (read here with this
    file's own pattern), and the comparison says so. x86-64's faithful walk has no frame there (__crash_kexec has no
    ORC, so the kernel's unwinder prints only '?' words), so its --complete walk is compared, and said to be."""
    con = panic_console(vmcore)
    rc, c, text = _diff_oracle(capsys, vmcore, vmcore.with_name(vmcore.name.split(".")[0] + ".console.txt"))
    below = [_symbol(ln) for ln in _after_panic(con.trace) if "+0x" in ln and not ln.startswith(" ? ")]
    assert rc == 0 and c["agrees"] and c["task"] == f"pid {con.pid} ({con.comm}) on cpu{con.cpu}"
    i, j = c["cut"]
    assert c["printed"][i:] == c["replayed"][j:] == [s.split("/")[0] for s in below] and len(below) >= 5
    assert [p.split("+")[0] for p in c["parted"]] == ["panic", "panic"] and c["parted"][0] != c["parted"][1]
    assert c["mode"] == ("complete" if vmcore.parts[-4] == "x86_64" else "faithful")
    assert any(f"compared from printed frame {i} and {c['mode']} replayed frame {j}, below {c['parted'][0]} and "
               f"{c['parted'][1]}, where they part" in ln for ln in text)
    if c["mode"] == "complete":
        assert "--complete looks for the caller" in c["faithful_stop"]
        assert any("the faithful walk holds none of the printed functions" in ln and "compared with the --complete "
                   "walk" in ln for ln in text)
    assert text[-1].endswith("1 traces: 1 agree, 0 differ, 0 unmatched")


def _changed(console: str, index: int, by: int) -> str:
    """``console`` with the pc of the ``index``-th frame line below panic()'s raised by ``by``: its offset, and
    riscv's ``[<address>]`` with it."""
    lines = console.splitlines()
    at = [n for n, ln in enumerate(lines) if "+0x" in ln and _FRAME.match(_STAMP.sub("", ln)) and " ? " not in ln]
    first = next(k for k, n in enumerate(at) if _symbol(_STAMP.sub("", lines[n])).startswith("panic+"))
    n = at[first + 1 + index]
    for pattern in (r"\+0x([0-9a-f]+)/", r"\[<([0-9a-f]+)>\]"):
        if m := re.search(pattern, lines[n]):
            digits = f"{int(m.group(1), 16) + by:x}".rjust(len(m.group(1)), "0")
            lines[n] = lines[n][:m.start(1)] + digits + lines[n][m.end(1):]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("index", [0, 2], ids=["first-below-panic", "third-below-panic"])
@pytest.mark.parametrize("vmcore", KDUMPS, ids=_kdump_id)
def test_diff_oracle_fails_on_a_changed_frame(vmcore: Path, index: int, tmp_path: Path, capsys) -> None:
    """The same console with one frame below panic() changed (its offset, by 2) is one difference at that line
    (exit 1): the first frame below panic() too, which a comparison from the first frame both hold would leave out."""
    log = tmp_path / "console.txt"
    log.write_text(_changed(vmcore.with_name(vmcore.name.split(".")[0] + ".console.txt").read_text(), index, 2))
    rc, c, text = _diff_oracle(capsys, vmcore, log)
    assert rc == 1 and not c["agrees"] and len(c["differences"]) == 1
    (d,) = c["differences"]
    assert d["frame"] == c["cut"][0] + index and d["printed"] != d["replayed"]
    assert d["printed"].split("+")[0] == d["replayed"].split("+")[0]
    assert any(ln.startswith(f"{log}:{d['line']}: ") and f"printed {d['printed']}, replayed {d['replayed']}" in ln
               for ln in text)


def test_diff_oracle_of_a_kdump_whose_stacks_are_left_out_says_where_the_walk_ends(capsys) -> None:
    """riscv's kdump-001, whose crash CPU's stack the headers leave out: the walk ends after its first frame, so the
    printed frames are differences (exit 1), and the text says why the replay has none of them."""
    [vmcore] = STACKS_LEFT_OUT
    rc, c, text = _diff_oracle(capsys, vmcore, vmcore.with_name(vmcore.name.split(".")[0] + ".console.txt"))
    assert rc == 1 and c["mode"] == "faithful" and len(c["replayed"]) == 1
    assert c["stop"].startswith("memory not in the dump: ") and "leave out" in c["stop"]
    assert text[-2].endswith(f"the faithful walk ends after 1 frames: -- stop: {c['stop']}")


@pytest.mark.parametrize("value,first", [(1, 1), (-1, 0)], ids=["panic_cpu=1", "PANIC_CPU_INVALID"])
def test_the_cpu_panic_cpu_names_leads(value: int, first: int, monkeypatch, capsys) -> None:
    """The order comes from the kernel's panic_cpu (kernel/panic.c), not from the CPU numbers: on the arm64 kdump
    (cpu0 panicked) the word set to 1 puts cpu1 first; PANIC_CPU_INVALID (no panic, as in QEMU's dumps) leaves
    CPU order."""
    from unwind.kernel.model import Kernel

    vmcore = next(v for v in KDUMPS if v.parts[-4] == "arm64")
    real = Kernel.read

    def read(self: Kernel, addr: int, size: int) -> bytes:
        if size == 4 and addr == self.symbol("panic_cpu"):
            return value.to_bytes(4, "little", signed=True)
        return real(self, addr, size)

    monkeypatch.setattr(Kernel, "read", read)
    rc, out = _run(capsys, "replay", str(vmcore), "--vmlinux", _slim(vmcore))
    heads = [ln for ln in out if re.match(r"pid \d+ \(.*\) on cpu\d+:$", ln)]
    assert [h.rsplit("cpu", 1)[1] for h in heads] == [f"{first}:", f"{1 - first}:"]


# -- RAM a kdump's headers leave out --------------------------------------------------------------------------

#: the kdumps made with the first kernel's /proc/iomem kept beside them (``unwind lab kdump`` prints it before the crash)
IOMEM_KDUMPS = [v for v in ALL_KDUMPS if v.with_name(v.name.split(".")[0] + ".iomem.txt").exists()]
_IOMEM = re.compile(r"^( *)([0-9a-f]+)-([0-9a-f]+) : (.*)$")
_LEFT_OUT = re.compile(r"the dump's headers leave out \d+ KiB of the kernel's RAM \(.*\): physical (.*)$")


def _iomem_ram(vmcore: Path) -> list[tuple[int, int]]:
    """The System RAM the kernel printed in /proc/iomem, less its "Crash kernel" (``[start, end)``, merged)."""
    ram, crash = [], []
    for line in vmcore.with_name(vmcore.name.split(".")[0] + ".iomem.txt").read_text().splitlines():
        indent, start, end, name = _IOMEM.match(line).groups()
        if name == "System RAM" and not indent:
            ram.append((int(start, 16), int(end, 16) + 1))
        elif name == "Crash kernel":
            crash.append((int(start, 16), int(end, 16) + 1))
    return _minus(ram, crash)


def _minus(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` less ``holes``, written out page-free (byte sets would be too large): sorted, merged."""
    points = sorted({p for r in ranges + holes for p in r})
    keep = [(a, b) for a, b in zip(points, points[1:])
            if any(s <= a and b <= e for s, e in ranges) and not any(s <= a and b <= e for s, e in holes)]
    out: list[tuple[int, int]] = []
    for a, b in keep:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _pt_loads(vmcore: Path) -> list[tuple[int, int]]:
    """The slice's PT_LOADs to their p_memsz, as pyelftools reads them."""
    from elftools.elf.elffile import ELFFile
    import io

    elf = ELFFile(io.BytesIO(lzma.decompress(vmcore.read_bytes())))
    return [(s["p_paddr"], s["p_paddr"] + s["p_memsz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]


@pytest.mark.parametrize("vmcore", IOMEM_KDUMPS, ids=_kdump_id)
def test_the_ram_the_headers_leave_out_is_said_once(vmcore: Path, capsys) -> None:
    """The load says once on stderr which RAM the dump's ELF headers leave out (nothing when none is): the kernel's
    System RAM (its own /proc/iomem, printed before the crash) less its crash kernel and less every PT_LOAD
    (pyelftools)."""
    expected = _minus(_iomem_ram(vmcore), _pt_loads(vmcore))
    capsys.readouterr()
    main(["replay", str(vmcore), "--vmlinux", _slim(vmcore), "--cpu", str(panic_console(vmcore).cpu)])
    said = [[tuple(int(x, 16) for x in r.split("-")) for r in m.group(1).split(", ")]
            for ln in capsys.readouterr().err.splitlines() if (m := _LEFT_OUT.search(ln))]
    assert said == ([expected] if expected else [])


def test_a_walk_into_ram_the_headers_leave_out_stops_saying_so(capsys) -> None:
    """Each CPU whose stack (or the page table that maps it) lies in RAM the headers leave out stops on the address,
    saying the dump's headers leave it out, an error: ``replay`` exits 1, the dump's defect. The crash CPU, named by
    the console's panic header, still comes first."""
    [vmcore] = STACKS_LEFT_OUT
    con = panic_console(vmcore)
    rc, out = _run(capsys, "replay", str(vmcore), "--vmlinux", _slim(vmcore))
    heads = [ln for ln in out if re.match(r"pid \d+ \(.*\) on cpu\d+:$", ln)]
    stops = [ln for ln in out if ln.startswith("-- stop:")]
    assert rc == 1 and heads[0] == f"pid {con.pid} ({con.comm}) on cpu{con.cpu}:" and len(stops) == len(heads) == 2
    for stop in stops:
        assert re.fullmatch(r"-- stop: memory not in the dump: frame->ra: 0x[0-9a-f]{16} \(\+8\) is in RAM of the "
                            r"dumped kernel that the dump's headers leave out \(its page, or the page table that maps "
                            r"it\) \(ERROR\)", stop), stop


@pytest.mark.parametrize("vmcore", KDUMPS, ids=_kdump_id)
def test_a_kdump_whose_headers_leave_out_no_stack_walks_every_task(vmcore: Path, capsys) -> None:
    """Every kdump but the one whose stacks were left out: RAM may still be left out (riscv's kdump-000: memblock's
    reservations; x86's kdump-001: the low 640K kexec-tools keeps out), but no task's walk needs it and none stops
    on an error; ``replay --all`` exits 0."""
    rc, out = _run(capsys, "replay", str(vmcore), "--vmlinux", _slim(vmcore), "--all")
    stops = [ln for ln in out if ln.startswith("-- stop:")]
    assert rc == 0 and len(stops) > 50 and not [ln for ln in out if "leave out" in ln or "(ERROR)" in ln]


# -- where KASLR put the kernel --------------------------------------------------------------------------------

#: the kdumps made with the first kernel's /proc/kallsyms lines kept beside them (``unwind lab kdump`` prints
#: _text's and those of the functions a sysrq c panic runs through)
KALLSYMS_KDUMPS = [v for v in ALL_KDUMPS if v.with_name(v.name.split(".")[0] + ".kallsyms.txt").exists()]
_SYMBOL = re.compile(r"^([^+\s]+)\+(0x[0-9a-f]+)/0x[0-9a-f]+")


def _kallsyms(vmcore: Path) -> dict[str, int]:
    """The symbols' addresses the running kernel printed in /proc/kallsyms."""
    lines = vmcore.with_name(vmcore.name.split(".")[0] + ".kallsyms.txt").read_text().splitlines()
    return {name: int(addr, 16) for addr, _kind, name in map(str.split, lines)}


def _kernel_code(vmcore: Path) -> int:
    """Where /proc/iomem says the kernel's code starts in physical memory."""
    for line in vmcore.with_name(vmcore.name.split(".")[0] + ".iomem.txt").read_text().splitlines():
        indent, start, end, name = _IOMEM.match(line).groups()
        if name == "Kernel code":
            return int(start, 16)
    raise AssertionError(f"{vmcore.name}: no Kernel code in /proc/iomem")


@pytest.mark.parametrize("vmcore", KALLSYMS_KDUMPS, ids=_kdump_id)
def test_the_kaslr_slide_is_where_the_running_kernel_said_its_text_was(vmcore: Path, capsys) -> None:
    """KASLR was on: the running kernel's /proc/kallsyms puts ``_text`` away from the image's link address. The
    load's slide is that distance, the crash CPU's frames name the functions at the addresses kallsyms gave them,
    and its pc lies as far into the physical "Kernel code" of /proc/iomem as it lies past ``_text``."""
    from unwind.session.replay import Session

    kallsyms = _kallsyms(vmcore)
    s = Session.load(vmcore, vmlinux=_slim(vmcore))
    slide = kallsyms["_text"] - s.dump.image.image.symbols.address("_text")
    assert slide != 0 and s.dump.image.slide == slide
    con = panic_console(vmcore)
    rc, out = _run(capsys, "replay", str(vmcore), "--vmlinux", _slim(vmcore), "--cpu", str(con.cpu), "--complete",
                   "--json")
    frames = json.loads(out[0])["frames"]
    named = [(m.group(1), int(f["pc"], 16) - int(m.group(2), 16)) for f in frames if (m := _SYMBOL.match(f["symbol"]))]
    placed = [(name, start) for name, start in named if name in kallsyms]
    assert {name for name, _ in placed} >= {"__crash_kexec", "panic", "sysrq_handle_crash"}
    assert placed == [(name, kallsyms[name]) for name, _ in placed]
    pc = int(frames[0]["pc"], 16)
    assert s.dump.memory.page_phys(pc) == _kernel_code(vmcore) + pc - kallsyms["_text"]
