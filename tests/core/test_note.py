"""The UNWIND note's schema: each group of crashes a mutation campaign found, as the
one-line error naming the key path, or the dropped optional key, that replaces it."""

from __future__ import annotations

import copy
import json
import struct

import pytest

from unwind.core.dumpinfo import BpfSymbol, FtraceTrampoline
from unwind.formats.dump import Dump, DumpError
from unwind.core.memory import Memory, Segment
from unwind.formats.note import NoteError, validate_note
from unwind.core.stackinfo import StackInfo
from unwind.dev.synth import SynthDump
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo, vmcoreinfo_number
from unwind.core.walk import FRAME_LIMIT_SLACK, frame_limit

from .test_dump import sample


def written(edit=None, raw: bytes | None = None, sd: SynthDump | None = None) -> bytes:
    """The sample dump with its note edited (``edit(meta)``) or replaced by ``raw``."""
    sd = sd or sample()
    sd.to_bytes()
    meta = copy.deepcopy(sd.writer.meta)
    if edit is not None:
        edit(meta)
    sd.writer.note_json = raw if raw is not None else json.dumps(meta).encode()
    return sd.writer.to_bytes()


def refused(edit=None, raw: bytes | None = None, sd: SynthDump | None = None) -> str:
    with pytest.raises(DumpError) as e:
        Dump(written(edit, raw, sd), "d.bin")
    text = str(e.value)
    assert "\n" not in text
    return text


def opened(edit) -> Dump:
    return Dump(written(edit), "d.bin")


def test_the_sample_opens_without_warnings():
    d = opened(lambda m: None)
    assert d.warnings == []
    assert [t.pid for t in d.tasks()] == [8, 7]


# --- _hex on 'zz', on a list, on null; out-of-range addresses ------------------------------------

@pytest.mark.parametrize("value", ["zz", ["0x10"], None, 4096, "0x" + "f" * 17, "-0x10", "0x", " 0x10", True])
def test_a_bad_address_names_its_key_path(value):
    def edit(m):
        m["tasks"][0]["fgraph"][0]["retp"] = value
    assert refused(edit).endswith("malformed UNWIND note: tasks[0].fgraph[0].retp: not a hex address")


def test_every_address_read_is_a_u64():
    d = opened(lambda m: m["tasks"][0]["context"].update(pc="0xffffffffffffffff"))
    assert next(t for t in d.tasks() if t.pid == 7).context["pc"] == 2**64 - 1


# --- string indices and 'str' has no attribute 'get'/'items' ------------------------------------

@pytest.mark.parametrize("where, value, path", [
    ("tasks", "abc", "tasks: not an array"),
    ("stacks", ["x"], "stacks[0]: not an object"),
    ("cpus", [7], "cpus[0]: not an object"),
])
def test_a_container_of_the_wrong_type_is_refused(where, value, path):
    assert refused(lambda m: m.update({where: value})).endswith(path)


def test_a_context_that_is_not_an_object_is_refused():
    assert refused(lambda m: m["tasks"][0].update(context="fp")).endswith("tasks[0].context: not an object")


# --- KeyError for ret, retp, fp, kind, low, high, addr, size ------------------------------------

@pytest.mark.parametrize("path", [("tasks", 0, "fgraph", 0, "ret"), ("tasks", 0, "fgraph", 0, "retp"),
                                  ("tasks", 0, "kretprobes", 0, "fp"), ("stacks", 0, "kind"),
                                  ("stacks", 1, "low"), ("stacks", 1, "high")])
def test_a_missing_required_key_is_named(path):
    def edit(m):
        parent = m
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
    name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    assert refused(edit).endswith(f"{name}: missing")


def test_the_walks_read_the_note_as_typed_values():
    d = opened(lambda m: m.update(ftrace_trampolines=[{"addr": "0x2000", "size": 64, "save_regs": True}],
                                  bpf_symbols=[["0xffff800078100000", "0xffff800078100080", "bpf_prog_1"]]))
    assert d.info.ftrace_trampolines == (FtraceTrampoline(0x2000, 64, None, True),)
    assert d.info.bpf_symbols == (BpfSymbol(0xFFFF800078100000, 0xFFFF800078100080, "bpf_prog_1"),)


@pytest.mark.parametrize("row", [["0x10", "zz", "p"], ["0x10", "0x20"], 7, ["0x20", "0x10", "p"]])
def test_a_malformed_bpf_symbol_is_dropped_with_a_warning(row):
    good = ["0xffff800078100000", "0xffff800078100080", "bpf_prog_1"]
    d = opened(lambda m: m.update(bpf_symbols=[row, good]))
    assert d.info.bpf_symbols == (BpfSymbol(0xFFFF800078100000, 0xFFFF800078100080, "bpf_prog_1"),)
    assert any(w.startswith("d.bin: dropped bpf_symbols[0] (") for w in d.warnings), d.warnings


def test_a_trampoline_without_addr_or_size_is_dropped_with_a_warning():
    d = opened(lambda m: m.update(ftrace_trampolines=[{"addr": "0x1000"}, {"addr": "0x2000", "size": 64}]))
    assert d.meta["ftrace_trampolines"] == [{"addr": "0x2000", "size": 64}]
    assert any("dropped ftrace_trampolines[0] (ftrace_trampolines[0].size: missing)" in w for w in d.warnings)


# --- '<=' between int and str; list indices given floats ----------------------------------------

def test_low_above_high_and_mixed_types():
    assert "stacks[0]: low 0x14000 is not below high 0x10000" in refused(
        lambda m: m["stacks"][0].update(low="0x14000", high="0x10000"))
    assert refused(lambda m: m["stacks"][0].update(cpu="0")).endswith("stacks[0].cpu: not an integer")


@pytest.mark.parametrize("value", [0.0, 1.5, True, -1, 8192])
def test_a_cpu_number_is_a_small_integer(value):
    text = refused(lambda m: m["tasks"][1].update(cpu=value))
    assert "tasks[1].cpu: " in text


def test_a_stack_range_larger_than_any_kernel_stack_is_refused():
    text = refused(lambda m: m["stacks"][0].update(low="0x0", high="0xffffffffffffffff"))
    assert "stacks[0]: 0xffffffffffffffff bytes is larger than any kernel stack" in text


# --- RecursionError inside json.loads; not JSON; not UTF-8 --------------------------------------

@pytest.mark.parametrize("raw, why", [(b"[" * 100000, "nested too deeply"), (b"{" * 5000 + b"}" * 5000, "not JSON"),
                                      (b'{"format": 1, "arch": "\xff"}', "not UTF-8"), (b"[1]", "not a JSON object"),
                                      (b"1" * 5000, "not JSON")])
def test_a_note_that_is_not_a_json_object(raw, why):
    assert why in refused(raw=raw)


# --- kernel / symbols not objects (Session.target, Target.symbol_address); a non-string release --

@pytest.mark.parametrize("key, value", [("kernel", "6.12"), ("kernel", {"release": 612}), ("symbols", ["x"]),
                                        ("symbols", {"vectors": 17})])
def test_a_malformed_optional_key_is_dropped(key, value):
    d = opened(lambda m: m.update({key: value}))
    assert any(w.startswith(f"d.bin: dropped {key}") for w in d.warnings)
    if key == "kernel":
        assert "kernel" not in d.meta and d.release == "6.12.99-test"  # from VMCOREINFO OSRELEASE
    else:
        assert d.meta.get("symbols", {}) == {}


def test_a_non_object_normalised_note_is_dropped():
    d = opened(lambda m: m["cpus"][0].update(normalised=["vectors+0x280"]))
    assert "normalised" not in d.meta["cpus"][0]
    assert any("dropped cpus[0].normalised" in w for w in d.warnings)


def test_unknown_context_keys_are_dropped():
    sd = SynthDump("arm64")
    sd.stack("task", 0x10000, 0x4000, pid=7)
    sd.blocked_task(7, "w", {"fp": 0x10100, "pc": 0x1000, "sp": 0x10000, "rip": 1})
    d = Dump(sd.to_bytes(), "a.bin")
    assert d.tasks()[0].context == {"fp": 0x10100, "pc": 0x1000, "sp": 0x10000}
    assert any("saved-context keys rip" in w for w in d.warnings)


def test_malformed_modules_are_dropped_one_by_one():
    good = {"name": "m", "addr": "0x5000", "state": 0, "regions": [{"kind": "text", "base": "0x5000", "size": 64}],
            "symbols": [["0x5000", "f"]]}
    bad = {"name": "n", "regions": [{"kind": "text", "base": 5, "size": 64}]}
    d = opened(lambda m: m.update(modules=[bad, good]))
    assert d.meta["modules"] == [good]
    assert any("dropped modules[0] (modules[0].regions[0].base: not a hex address)" in w for w in d.warnings)


def test_a_stack_tied_by_task_struct_and_a_bad_task_key():
    def edit(m):
        m["tasks"][0]["task"] = "0xffff888000001000"
        m["stacks"][0]["task"] = "0xffff888000001000"
    d = opened(edit)
    t = next(t for t in d.tasks() if t.pid == 7)
    assert t.task_struct == 0xffff888000001000 and [s.kind for s in t.stacks] == ["task"]
    d = opened(lambda m: m["stacks"][0].update(task="zz"))
    assert "task" not in d.meta["stacks"][0] and any("dropped stacks[0].task" in w for w in d.warnings)


def test_offsets_of_the_wrong_shape_are_dropped():
    d = opened(lambda m: m.update(offsets={"pt_regs": {"size": 336, "members": {"pc": 256}},
                                            "pt_bad": {"size": "zz"}}))
    assert d.meta["offsets"] == {"pt_regs": {"size": 336, "members": {"pc": 256}}}


def test_the_task_list_is_built_once_and_handed_out_as_copies():
    d = opened(lambda m: None)
    a, b = d.tasks(), d.tasks()
    assert a == b and all(x is not y for x, y in zip(a, b))


def test_validate_note_drops_in_place_and_names_the_fatal_path():
    note = {"format": 1, "arch": "x", "symbols": {"a": "zz", "b": "0x1"}}
    said = []
    validate_note(note, warn=said.append)
    assert note["symbols"] == {"b": "0x1"} and said == ["dropped symbols.a (symbols.a: not a hex address)"]
    with pytest.raises(NoteError, match=r"^format: "):
        validate_note({"format": 2, "arch": "x"})


# --- VMCOREINFO values parsed unguarded (riscv _resolve, user_task_size) --------------------------

@pytest.mark.parametrize("line", ["NUMBER(VA_BITS)=100000", "NUMBER(VA_BITS)=-1", "NUMBER(VA_BITS)=zz",
                                  "NUMBER(VA_BITS)=" + "9" * 5000, "NUMBER(MODULES_VADDR)=0x1ffffffffffffffff",
                                  "SYMBOL(_stext)=0x", "PAGESIZE=3"])
def test_a_bad_vmcoreinfo_number_is_dropped_at_open(line):
    info = VmcoreInfo.parse(line + "\nOSRELEASE=6.12\n")
    said = []
    kept = info.checked(said.append)
    assert dict(kept) == {"OSRELEASE": "6.12"} and len(said) == 1 and "dropped" in said[0]
    assert vmcoreinfo_number(dict(info), line.partition("=")[0]) is None


def test_vmcoreinfo_numbers_in_both_syntaxes_and_the_first_line_wins():
    info = VmcoreInfo.parse("NUMBER(VA_BITS)=39\nNUMBER(VA_BITS)=48\nSYMBOL(x)=ffffffff81000000\n"
                            "NUMBER(KERNELPACMASK)=0xff80000000000000\n")
    assert vmcoreinfo_number(info, "NUMBER(VA_BITS)") == 39
    assert vmcoreinfo_number(info, "SYMBOL(x)") == 0xFFFFFFFF81000000
    assert vmcoreinfo_number(dict(info), "NUMBER(KERNELPACMASK)") == 0xFF80000000000000


def test_vmcoreinfo_equality_is_the_entries_whatever_the_text():
    """Equal entries are equal however they were written; the same text checked and not checked differs by what
    the check dropped; a mapping of other entries, or a dict of them, is told apart."""
    text = "OSRELEASE=6.12\nNUMBER(VA_BITS)=100000\nPAGESIZE=4096\n"
    parsed, checked = VmcoreInfo.parse(text), VmcoreInfo.parse(text).checked(lambda _: None)
    assert parsed == VmcoreInfo.parse(text) and checked == VmcoreInfo.parse(text).checked(lambda _: None)
    assert parsed != checked and len(parsed) == 3 and len(checked) == 2
    assert VmcoreInfo.parse(" PAGESIZE = 4096\njunk\nOSRELEASE=6.12\n") == checked  # other text, the same entries
    assert VmcoreInfo({"OSRELEASE": "6.12", "PAGESIZE": "4096"}) == checked == {"PAGESIZE": "4096", "OSRELEASE": "6.12"}
    assert checked != VmcoreInfo.parse("OSRELEASE=6.13\nPAGESIZE=4096\n") and checked != {"OSRELEASE": "6.12"}


def test_a_dump_drops_a_bad_vmcoreinfo_number_with_a_warning():
    sd = sample()
    sd.vmcoreinfo["NUMBER(VA_BITS)"] = str(2**70)
    d = Dump(sd.to_bytes(), "d.bin")
    assert "NUMBER(VA_BITS)" not in d.vmcoreinfo and d.vmcoreinfo["PAGESIZE"] == "4096"
    assert any("NUMBER(VA_BITS)" in w and "dropped" in w for w in d.warnings)


def test_riscv_user_task_size_with_a_huge_va_bits():
    from unwind.arch.riscv.user import DEFAULT_VA_BITS, user_task_size

    class T:
        vmcoreinfo = {"NUMBER(VA_BITS)": "1" + "0" * 30}
    assert user_task_size(T()) == 1 << (DEFAULT_VA_BITS - 1)


# --- container errors (construct ArrayError "missing terminator") ---------------------------------

def _note_header(data: bytes, name: bytes) -> int:
    off, size = struct.unpack_from("<QQ", data, 64 + 8)[0], struct.unpack_from("<Q", data, 64 + 32)[0]
    pos = off
    while pos < off + size:
        namesz, descsz = struct.unpack_from("<II", data, pos)
        if data[pos + 12:pos + 12 + namesz].rstrip(b"\0") == name:
            return pos
        pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    raise KeyError(name)


@pytest.mark.parametrize("field, value", [(0, 0xFFFF), (0, 3), (4, 0xFFFFFFFF), (0, 0)])
def test_a_broken_note_header_is_one_line(field, value):
    data = bytearray(sample().to_bytes())
    pos = _note_header(bytes(data), b"UNWIND")
    struct.pack_into("<I", data, pos + field, value)
    with pytest.raises(DumpError) as e:
        Dump(bytes(data), "d.bin")
    assert "\n" not in str(e.value) and str(e.value).startswith("d.bin: ")


@pytest.mark.parametrize("off, fmt, value", [(54, "<H", 0), (54, "<H", 0xFFFF), (32, "<Q", 2**64 - 1),
                                             (56, "<H", 0xFFFF), (64 + 56 + 16, "<Q", 2**64 - 8)])
def test_a_broken_elf_header_is_one_line(off, fmt, value):
    data = bytearray(sample().to_bytes())
    struct.pack_into(fmt, data, off, value)
    with pytest.raises(DumpError) as e:
        Dump(bytes(data), "d.bin")
    assert "\n" not in str(e.value)


# --- work bounded by what was captured ------------------------------------------------------------

def test_the_frame_limit_counts_captured_stack_bytes_only():
    mem = Memory([Segment(0x10000, bytes(0x1000)), Segment(0x20000, bytes(0x100))])
    stacks = [StackInfo(0x10000, 0x14000, "task", None), StackInfo(0x20000, 0x20100, "irq", 0),
              StackInfo(0x90000, 0x190000, "irq", 1)]
    assert frame_limit(stacks, mem) == (0x1000 + 0x100) // 16 + FRAME_LIMIT_SLACK
    assert frame_limit(stacks, mem, 8) == (0x1000 + 0x100) // 8 + FRAME_LIMIT_SLACK
    assert mem.captured(0x10800, 0x20080) == [(0x10800, 0x11000), (0x20000, 0x20080)]


def test_a_replay_stops_at_the_frame_limit_by_default():
    """A frame-record chain of one record per 16 bytes through a 4 KiB stack: more records than the limit
    allows only if the chain loops, which here it does (the last record points back to the first)."""
    from .toy import BACKEND

    sd = SynthDump(BACKEND)
    s = sd.stack("task", 0x10000, 0x1000, pid=7)
    for a in range(0x10000, 0x11000, 16):
        s.put(a, a + 16 if a + 16 < 0x11000 else 0x10000, 0x2000)
    sd.blocked_task(7, "loop", {"fp": 0x10000, "pc": 0x1000})
    session = sd.session()
    r = session.replay(session.dump.tasks()[0])
    assert len(r.frames) <= 0x1000 // 16 + FRAME_LIMIT_SLACK


# --- oracles_excluded: what the capture could not resolve stays text ----------------------------

def test_an_excluded_oracle_keeps_its_unresolved_frames_as_printed():
    # the capture leaves a trace out when the task ran meanwhile or a frame did not resolve; such a
    # frame is the kernel's own "symbol+off" text (a module not loaded in the lab's symbol table)
    excluded = {"source": "sysrq-t", "pid": 150, "stale": True, "why": "unresolved frame f+0x1d6",
                "frames": ["0xffffffff81d1657a", "f+0x1d6"], "unreliable": ["__pfx_f+0x10"]}
    d = opened(lambda m: m.update(oracles_excluded=[excluded]))
    assert d.meta["oracles_excluded"] == [excluded] and not d.warnings
    d = opened(lambda m: m.update(oracles_excluded=[dict(excluded, frames="f+0x1d6")]))
    assert "oracles_excluded" not in d.meta
    assert any("dropped oracles_excluded (oracles_excluded[0].frames: " in w for w in d.warnings)


def test_a_control_character_from_the_note_is_escaped_in_the_one_line():
    text = refused(lambda m: m.update(arch="0x1\n"))
    assert "note says arch 0x1\\x0a but the ELF machine is" in text
