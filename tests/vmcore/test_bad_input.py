"""Bad vmcores: one VmcoreError line at open, or a MemoryFault on the page; never anything else."""

from __future__ import annotations

import gzip
import lzma
import random

import pytest

from unwind.formats.dump import DumpError
from unwind.core.memory import MemoryFault
from unwind.formats.vmcore import CorruptPageFault, VmcoreError, codecs, diskdump, open_vmcore
from unwind.formats.vmcore.errors import TruncatedFault

from .synth import KdumpSpec, Load, elf_vmcore, flatten, kdump_file, notes_blob, page_bytes, vmcoreinfo

RAM = set(range(24))


def _kdump(codec: int = codecs.DUMP_DH_COMPRESSED_ZLIB, **kw) -> bytes:
    dumped = {p: page_bytes(p) if p % 5 else bytes(4096) for p in RAM if p != 3}
    return kdump_file(KdumpSpec(max_mapnr=24, ram=RAM, dumped=dumped, codec=codec,
                                notes=notes_blob([(1, 0)], 27, vmcoreinfo()), **kw))


def _elf() -> bytes:
    return elf_vmcore([Load(0x1000, b"".join(page_bytes(p) for p in range(1, 5)))],
                      notes_blob([(1, 0), (2, 0)], 27, vmcoreinfo()))


def _open_and_read_all(path: str) -> str:
    """Open and read every page; the outcome as text. Only VmcoreError and MemoryFault may escape."""
    try:
        vm = open_vmcore(path)
    except VmcoreError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(path)
        return "error"
    with vm:
        for pfn in range(0, 32):
            try:
                vm.read_phys(pfn * 4096, 4096)
            except MemoryFault as e:
                assert "\n" not in str(e)
        vm.ranges, vm.prstatus, vm.vmcoreinfo_dict, vm.page_size
    return "opened"


def _one_line_error(path: str) -> str:
    with pytest.raises(VmcoreError) as e:
        open_vmcore(path)
    assert isinstance(e.value, DumpError)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _pages(vm) -> dict[int, bytes | type]:
    """Each pfn's bytes, or the fault reading it raises."""
    out: dict[int, bytes | type] = {}
    for pfn in range(32):
        try:
            out[pfn] = vm.read_phys(pfn * 4096, 4096)
        except MemoryFault as e:
            assert "\n" not in str(e)
            out[pfn] = type(e)
    return out


@pytest.mark.parametrize("kind", ["kdump", "flat", "flat-in-order", "elf"])
def test_every_truncation_keeps_what_is_left(tmp_path, kind, monkeypatch):
    """Cut anywhere: refused in one line when no header, or neither notes nor memory, is left; else every page
    reads as in the whole file or raises TruncatedFault, the notes are the whole file's first ones, and
    ``damage`` says the file is cut and lists the pages that fault (a page read and the scan for what is
    missing are two paths; the scan runs in chunks of 3 descriptors and 8 pfns here)."""
    monkeypatch.setattr(diskdump, "DESC_CHUNK", 3)
    monkeypatch.setattr(diskdump, "LACKING_CHUNK_BITS", 8)
    full = {"kdump": _kdump(), "flat": flatten(_kdump(), record=2048, seed=1),
            "flat-in-order": flatten(_kdump(), record=2048, seed=None, sparse=False), "elf": _elf()}[kind]
    whole = tmp_path / "whole"
    whole.write_bytes(full)
    with open_vmcore(whole) as vm:
        want, notes = _pages(vm), vm.notes
    path = tmp_path / "cut"
    cuts = sorted(set(range(0, 600, 7)) | set(range(600, len(full), max(1, len(full) // 97))))
    outcomes = set()
    for cut in cuts:
        path.write_bytes(full[:cut])
        try:
            vm = open_vmcore(str(path))
        except VmcoreError as e:
            msg = str(e)
            assert "\n" not in msg and msg.startswith(str(path))
            assert "truncated" in msg or "too short" in msg, (cut, msg)
            outcomes.add("refused")
            continue
        with vm:
            assert vm.damage is not None and vm.damage.present == vm._src.size, cut
            assert vm.notes == notes[:len(vm.notes)] and (vm.notes or vm.ranges), cut
            pages = _pages(vm)
            for pfn, got in pages.items():
                assert got == want[pfn] or got is TruncatedFault, (cut, pfn, got)
                outcomes.add("salvaged" if got == want[pfn] and got is not TruncatedFault else "absent")
            listed = {p for r in vm.damage.absent for p in range(r.start // 4096, -(-r.end // 4096))}
            faulting = {p for p, got in pages.items() if got is TruncatedFault}
            # a flattened file's gaps fault too, and the ELF's size says nothing of them
            assert listed == faulting if not kind.startswith("flat") else listed <= faulting, cut
    # a shuffled stream that leaves out its zero blocks: cut, its gaps may be lost records, and the bitmaps are one
    assert outcomes == ({"refused"} if kind == "flat" else {"refused", "salvaged", "absent"})


def test_bad_magic_and_compressed_files(tmp_path):
    cases = {
        "empty": b"",
        "text": b"this is not a vmcore at all\n" * 4,
        "gzip": gzip.compress(_elf()),
        "xz-text": lzma.compress(b"this is not a vmcore at all\n" * 4),
        "xz-garbage": lzma.compress(_elf())[:12] + bytes(range(256)) * 4,
        "diskdump": b"DISKDUMP" + bytes(600),
    }
    msgs = {}
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        msgs[name] = _one_line_error(str(p))
    assert "not a vmcore" in msgs["text"] and "DISKDUMP" in msgs["diskdump"]
    assert "gzip-compressed; decompress it first" in msgs["gzip"]
    assert "xz-compressed, but what it holds is not a vmcore" in msgs["xz-text"]
    assert "xz-compressed: corrupt xz data" in msgs["xz-garbage"]
    assert "cannot read" in _one_line_error(str(tmp_path / "missing"))
    assert "cannot read" in _one_line_error(str(tmp_path)) or "read error" in _one_line_error(str(tmp_path))


def test_a_cut_xz_stream_is_read_as_far_as_it_decompresses(tmp_path):
    p = tmp_path / "cut.xz"
    p.write_bytes(lzma.compress(_elf())[:-40])
    with open_vmcore(p) as vm:
        assert vm.damage is not None and "the xz stream ends early" in str(vm.damage)
        assert [n.name for n in vm.notes] == ["CORE", "CORE", "VMCOREINFO"]
        assert vm.read_phys(0x1000, 4096) == page_bytes(1)


def test_unknown_compression_in_the_header(tmp_path):
    p = tmp_path / "x.kdump"
    p.write_bytes(_kdump(status_extra=0x40))
    assert "unknown compression" in _one_line_error(str(p))


def test_bad_block_size(tmp_path):
    raw = bytearray(_kdump())
    raw[428:432] = (4095).to_bytes(4, "little")
    p = tmp_path / "x.kdump"
    p.write_bytes(raw)
    assert "block_size 4095" in _one_line_error(str(p))


@pytest.mark.parametrize("override,why", [
    (dict(size=4097, flags=0), "uncompressed page of 4097 bytes"),
    (dict(size=5000), "compressed page of 5000 bytes"),
    (dict(flags=0x3), "unknown compression flags 0x3"),
    (dict(flags=codecs.DUMP_DH_COMPRESSED_SNAPPY), "snappy"),
    (dict(offset=1 << 40), "descriptor says"),
    (dict(size=0), "descriptor says 0 bytes"),
])
def test_a_corrupt_page_is_a_memory_fault_of_its_own(tmp_path, override, why):
    p = tmp_path / "x.kdump"
    p.write_bytes(_kdump(page_overrides={7: override}))
    with open_vmcore(p) as vm:
        with pytest.raises(CorruptPageFault, match="corrupt in the dump") as e:
            vm.read_phys(7 * 4096 + 16, 8)
        assert why in str(e.value)
        assert vm.read_phys(8 * 4096, 4096) == page_bytes(8)


@pytest.mark.parametrize("kind", ["kdump-zlib", "kdump-lzo", "kdump-snappy", "kdump-zstd", "flat", "elf"])
def test_mutated_files_never_raise_anything_else(tmp_path, kind):
    codec = {"kdump-zlib": 1, "kdump-lzo": 2, "kdump-snappy": 4, "kdump-zstd": 0x20}.get(kind, 1)
    base = {"flat": flatten(_kdump(), record=4096, seed=2), "elf": _elf()}.get(kind) or _kdump(codec)
    rng = random.Random(kind)
    path = tmp_path / "m"
    outcomes = set()
    for _ in range(60):
        raw = bytearray(base)
        for _ in range(rng.choice((1, 2, 8))):
            pos = rng.randrange(min(len(raw), rng.choice((600, 5000, len(raw)))))
            raw[pos] = rng.randrange(256)
        path.write_bytes(raw)
        outcomes.add(_open_and_read_all(str(path)))
    assert "opened" in outcomes


def test_an_oversized_vmcoreinfo_names_the_file(tmp_path):
    p = tmp_path / "big-info.elf"
    p.write_bytes(elf_vmcore([Load(0, page_bytes(0))], notes_blob([(1, 0)], 27, "PAGESIZE=4096\n" * 10000)))
    msg = _one_line_error(str(p))
    assert msg.startswith(str(p)) and "VMCOREINFO" in msg


@pytest.mark.parametrize("kind", ["kdump", "flat", "elf"])
def test_an_xz_vmcore_reads_as_the_file_inside(tmp_path, kind):
    """Each format xz-compressed: the same format, notes and pages as the plain file."""
    full = {"kdump": _kdump(), "flat": flatten(_kdump(), record=2048, seed=1), "elf": _elf()}[kind]
    plain, packed = tmp_path / "plain", tmp_path / "plain.xz"
    plain.write_bytes(full)
    packed.write_bytes(lzma.compress(full))
    with open_vmcore(plain) as a, open_vmcore(packed) as b:
        assert (a.format, a.ranges, a.vmcoreinfo_dict) == (b.format, b.ranges, b.vmcoreinfo_dict)
        assert [n.desc for n in a.notes] == [n.desc for n in b.notes]
        for pfn in range(32):
            try:
                want: bytes | str = a.read_phys(pfn * 4096, 4096)
            except MemoryFault as e:
                want = type(e).__name__
            try:
                got: bytes | str = b.read_phys(pfn * 4096, 4096)
            except MemoryFault as e:
                got = type(e).__name__
            assert got == want, pfn


def test_an_xz_bomb_is_refused(tmp_path, monkeypatch):
    from unwind.formats.vmcore import source

    monkeypatch.setattr(source, "XZ_MAX_BYTES", 1 << 20)
    p = tmp_path / "big.xz"
    p.write_bytes(lzma.compress(_elf() + bytes(2 << 20)))
    with pytest.raises(VmcoreError, match="decompresses to more than 1 MiB"):
        open_vmcore(p)
