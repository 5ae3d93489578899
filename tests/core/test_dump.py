"""The dump format: round trip, notes readelf sees, and every malformed input."""

from __future__ import annotations

import lzma
import os
import shutil
import struct
import subprocess
import sys
import types

import pytest

from unwind.cli.main import main
from unwind.core import registry
from unwind.formats import dump as dump_module
from unwind.formats.dump import Dump, DumpError, DumpWriter, written_by_unwind
from unwind.dev.synth import SynthDump

from .toy import BACKEND


def sample() -> SynthDump:
    sd = SynthDump(BACKEND, release="6.12.99-test")
    task = sd.stack("task", 0x10000, 0x4000, pid=7)
    task.put(0x10100, 0x10200, 0x2000)
    task.put(0x10200, 0, 0)
    irq = sd.stack("irq", 0x40000, 0x4000, cpu=0)
    irq.put(0x43F00, 0x10100, 0x3000)
    sd.blocked_task(7, "worker", {"fp": 0x10100, "pc": 0x1000},
                    fgraph=[{"ret": 0x2000, "retp": 0x10108, "func": 0x1F00}],
                    kretprobes=[{"ret": 0x3000, "fp": 0x10200}])
    sd.running_task(8, "busy", 0, {"fp": 0x43F00, "pc": 0x2FFF, "sp": 0x43EF0})
    sd.vmcoreinfo["NUMBER(KERNELPACMASK)"] = "0xfff0000000000000"
    sd.oracles.append({"source": "sysrq-t", "pid": 7, "cpu": None, "frames": ["0x1000", "0x2000"]})
    return sd


def test_round_trip_is_identical():
    raw = sample().to_bytes()
    d = Dump(raw)
    w = DumpWriter(d.backend)
    for seg in d.memory.segments:
        w.add_memory(seg.start, seg.data)
    for c in d.cpus:
        w.add_cpu(c.cpu, c.regs)
    w.vmcoreinfo = d.vmcoreinfo_text
    w.meta = d.meta
    assert w.to_bytes() == raw


def test_reader_sees_everything_written():
    d = sample().dump()
    assert d.arch == "toy" and d.release == "6.12.99-test"
    assert d.vmcoreinfo["NUMBER(KERNELPACMASK)"] == "0xfff0000000000000"
    assert d.memory.read_u64(0x43F08) == 0x3000
    tasks = {t.pid: t for t in d.tasks()}
    assert tasks[8].running and tasks[8].regs["pc"] == 0x2FFF and tasks[8].cpu == 0
    assert [s.kind for s in tasks[8].stacks] == ["irq"]
    assert not tasks[7].running and tasks[7].context == {"fp": 0x10100, "pc": 0x1000}
    assert [s.kind for s in tasks[7].stacks] == ["task"]
    assert (tasks[7].fgraph[0].ret, tasks[7].fgraph[0].retp) == (0x2000, 0x10108)
    assert (tasks[7].kretprobes[0].ret, tasks[7].kretprobes[0].fp) == (0x3000, 0x10200)
    assert d.oracles()[0]["frames"] == ["0x1000", "0x2000"]


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_compressed_dumps(tmp_path, suffix):
    p = tmp_path / f"d.bin{suffix}"
    sd = sample()
    sd.to_bytes()
    sd.writer.write(p)
    assert p.read_bytes()[:2] in (b"\xfd7", b"\x1f\x8b")
    assert Dump.open(p).memory.read_u64(0x43F08) == 0x3000


def _damaged(data: bytes, suffix: str, damage: str) -> bytes:
    """A compressed dump with its stream damaged: ``cut`` in half, or its data made invalid (``bad``): gzip's
    first deflate block given the reserved block type (zlib's own error, not gzip's), xz's bytes flipped
    midway (its checks catch them)."""
    if damage == "cut":
        return data[:len(data) // 2]
    b = bytearray(data)
    if suffix == ".gz":
        b[10] = 0xFF  # after the 10-byte header (no name): BFINAL 1, BTYPE 11, which deflate reserves
    else:
        for i in range(len(b) // 2, len(b) // 2 + 16):
            b[i] ^= 0x5A
    return bytes(b)


@pytest.mark.parametrize("suffix, damage, said", [(".gz", "bad", "corrupt compressed dump: Error -3"),
                                                  (".gz", "cut", "corrupt compressed dump: Compressed file ended"),
                                                  (".xz", "bad", "corrupt compressed dump"),
                                                  (".xz", "cut", "corrupt compressed dump: the xz stream is truncated")])
def test_a_damaged_compressed_dump_is_one_line(tmp_path, capsys, suffix, damage, said):
    """Each way a compressed dump's stream breaks is a DumpError and exit 2 (a gzip dump whose deflate data
    zlib refuses raised zlib.error, a traceback, until the reader caught it)."""
    p = tmp_path / f"d.bin{suffix}"
    sd = sample()
    sd.to_bytes()
    sd.writer.write(p)
    p.write_bytes(_damaged(p.read_bytes(), suffix, damage))
    with pytest.raises(DumpError, match=said):
        Dump.open(p)
    assert main(["replay", str(p)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err


def test_a_compressed_dump_is_decompressed_once(tmp_path, monkeypatch):
    """Its headers and notes are read from its start before it is read whole (to refuse a vmcore unread),
    and the whole goes on from there: every byte comes out of the decompressor once."""
    p = tmp_path / "d.bin.xz"
    sd = sample()
    raw = sd.to_bytes()
    sd.writer.write(p)
    out: list[int] = []

    class Counted:
        def __init__(self, *args: object) -> None:
            self._dec = lzma.LZMADecompressor(*args)

        def __getattr__(self, name: str) -> object:
            return getattr(self._dec, name)

        def decompress(self, data: bytes, max_length: int = -1) -> bytes:
            got = self._dec.decompress(data, max_length)
            out.append(len(got))
            return got
    monkeypatch.setattr(dump_module, "lzma", types.SimpleNamespace(
        LZMADecompressor=Counted, FORMAT_XZ=lzma.FORMAT_XZ, LZMAError=lzma.LZMAError))
    assert Dump.open(p).memory.read_u64(0x43F08) == 0x3000
    assert len(out) > 1 and sum(out) == len(raw)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_file_that_does_not_start_as_elf_is_refused_from_its_start(capsys):
    """An uncompressed file whose first bytes are no ELF header is refused from them, not read whole first: a
    device such as /dev/zero (its size says 0, its reads never end) was read until memory ran out."""
    with pytest.raises(DumpError, match="not an ELF file"):
        Dump.open("/dev/zero")
    assert main(["replay", "/dev/zero"]) == 2
    assert capsys.readouterr().err.strip() == "unwind: error: /dev/zero: not an ELF file"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
def test_readelf_lists_the_notes(tmp_path):
    p = tmp_path / "d.bin"
    p.write_bytes(sample().to_bytes())
    out = subprocess.run(["readelf", "-n", "-l", str(p)], capture_output=True, text=True, check=True).stdout
    assert "NT_PRSTATUS" in out and "VMCOREINFO" in out and "UNWIND" in out
    assert out.count("LOAD") == 2


def _corrupt(raw: bytes, case: str) -> bytes:
    b = bytearray(raw)
    phoff = struct.unpack_from("<Q", b, 32)[0]
    if case == "not-elf":
        return b"MZ" + bytes(b[2:])
    if case == "elf32":
        b[4] = 1
    elif case == "big-endian":
        b[5] = 2
    elif case == "not-core":
        struct.pack_into("<H", b, 16, 2)
    elif case == "unknown-machine":
        struct.pack_into("<H", b, 18, 0x1234)
    elif case == "truncated":
        return bytes(b[: len(b) - 100])
    elif case == "truncated-header":
        return bytes(b[:40])
    elif case == "overlap":
        # make the second PT_LOAD start inside the first
        first = phoff + 56
        vaddr = struct.unpack_from("<Q", b, first + 16)[0]
        struct.pack_into("<Q", b, first + 56 + 16, vaddr + 8)
    elif case == "missing-note":
        i = b.find(b"UNWIND\0")
        b[i:i + 6] = b"XXXXXX"
    elif case == "malformed-note":
        i = b.find(b'{"arch"')
        b[i] = ord("[")
    elif case == "truncated-note":
        struct.pack_into("<Q", b, phoff + 32, 0x10_0000)   # PT_NOTE p_filesz past the file
    elif case == "note-past-segment":
        i = b.find(b"UNWIND\0")
        struct.pack_into("<I", b, i - 8, 0x7FFF_FFFF)  # the UNWIND note's n_descsz: past its PT_NOTE
    elif case == "top-of-memory":
        # the first PT_LOAD ends at 2**64 (found by the campaign, seed 2030 case 372509: the batch's
        # segment ends, u64 columns, wrapped)
        first = phoff + 56
        size = struct.unpack_from("<Q", b, first + 32)[0]
        struct.pack_into("<Q", b, first + 16, (1 << 64) - size)
    return bytes(b)


CASES = ["not-elf", "elf32", "big-endian", "not-core", "unknown-machine", "truncated", "truncated-header",
         "overlap", "missing-note", "malformed-note", "truncated-note", "note-past-segment", "top-of-memory"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_exit_2_with_one_line(tmp_path, capsys, case):
    p = tmp_path / "bad.bin"
    p.write_bytes(_corrupt(sample().to_bytes(), case))
    with pytest.raises(DumpError):
        Dump.open(p)
    assert main(["replay", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unwind: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_and_wrong_arch(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.bin")]) == 2
    p = tmp_path / "d.bin"
    p.write_bytes(sample().to_bytes())
    assert main(["replay", str(p), "--arch", "x86_64"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "disagrees with the dump" in err[1]


def test_python_dash_m_runs_the_cli():
    r = subprocess.run([sys.executable, "-m", "unwind", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "replay" in r.stdout


def test_a_compressed_vmcore_is_not_a_dump_but_loads_as_a_vmcore(capsys) -> None:
    """A QEMU vmcore (committed slice, xz) is an ELF core without our note: Dump.open says NotADump,
    Session.load and the commands read it as a vmcore, as they read the decompressed file."""
    import lzma
    import tempfile
    from pathlib import Path

    from unwind.formats.dump import NotADump

    vmcore = next((Path(__file__).resolve().parents[2] / "corpora").glob("x86_64/*/vmcore/stop-*.elf.xz"))
    slim = str(next(vmcore.parents[1].glob("vmlinux-*.slim.xz")))
    with pytest.raises(NotADump, match=r"a vmcore without the UNWIND note"):
        Dump.open(vmcore)
    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / "stop.elf"
        plain.write_bytes(lzma.decompress(vmcore.read_bytes()))
        outs = []
        for path in (plain, vmcore):
            capsys.readouterr()
            assert main(["ps", str(path), "--vmlinux", slim]) == 0
            outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0].splitlines()) > 50


def test_the_machine_number_picks_the_backend():
    for name in ("x86_64", "arm64", "riscv"):
        backend = registry.get(name)
        assert registry.for_e_machine(backend.e_machine) is backend
    with pytest.raises(registry.ArchError):
        registry.for_e_machine(0x1234)


def test_written_by_unwind_reads_the_first_note_segment_only(tmp_path):
    dump, other = tmp_path / "d.bin", tmp_path / "v.elf"
    dump.write_bytes(sample().to_bytes())
    other.write_bytes(_corrupt(sample().to_bytes(), "missing-note"))
    assert written_by_unwind(dump)
    assert not written_by_unwind(other)
    for case in ("truncated-header", "truncated-note", "not-elf", "elf32"):
        bad = tmp_path / f"{case}.bin"
        bad.write_bytes(_corrupt(sample().to_bytes(), case))
        assert not written_by_unwind(bad)
