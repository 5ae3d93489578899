"""Synthetic vmcores of every format: each read must return the bytes the file was built from."""

from __future__ import annotations

import os

import pytest

from unwind.formats import elfcore
from unwind.core.memory import MemoryFault
from unwind.formats.vmcore.errors import TruncatedFault
from unwind.formats.vmcore import (DiskDump, ElfVmcore, ExcludedPageFault, VmcoreError, codecs,
                           detect_format, is_vmcore, open_vmcore)

from .synth import KdumpSpec, Load, elf_vmcore, flatten, kdump_file, notes_blob, page_bytes, vmcoreinfo

CODECS = [codecs.DUMP_DH_COMPRESSED_ZLIB, codecs.DUMP_DH_COMPRESSED_LZO, codecs.DUMP_DH_COMPRESSED_SNAPPY,
          codecs.DUMP_DH_COMPRESSED_ZSTD, 0]
X86_NREGS = 27


def _write(tmp_path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _pages(pfns, size=4096):
    return b"".join(page_bytes(p, size) for p in pfns)


# --- ELF -------------------------------------------------------------------------------------------

def _elf(tmp_path, qemu: bool = False) -> str:
    extra = [("QEMU", 0, bytes(440))] if qemu else []
    notes = notes_blob([(1, 100), (0, 200), (4242, 300)], X86_NREGS, vmcoreinfo(), extra)
    loads = [
        Load(0x1000, _pages(range(1, 4))),                      # pfns 1..3
        Load(0x4000, _pages(range(4, 6)), vaddr=0xffff888000004000, tail=0x2000),  # 4..5, 6..7 not in the file
        Load(0x10000, _pages(range(16, 18))),                   # 16..17
        Load(0x1000, _pages(range(1, 2)), vaddr=0xffffffff81000000),  # the same bytes again (kernel image)
    ]
    return _write(tmp_path, "vmcore.elf", elf_vmcore(loads, notes, note_split=356))


def test_elf_reads_each_page_at_its_physical_address(tmp_path):
    with open_vmcore(_elf(tmp_path)) as vm:
        assert isinstance(vm, ElfVmcore) and vm.format == "elf"
        for pfn in (1, 2, 3, 4, 5, 16, 17):
            assert vm.read_phys(pfn * 4096, 4096) == page_bytes(pfn)
        # a read across two PT_LOADs that touch (pfn 3 | pfn 4)
        assert vm.read_phys(0x4000 - 8, 16) == page_bytes(3)[-8:] + page_bytes(4)[:8]
        assert vm.read_phys_u64(0x10008) == int.from_bytes(page_bytes(16)[8:16], "little")
        assert [(r.start, r.end) for r in vm.ranges] == [(0x1000, 0x6000), (0x10000, 0x12000)]


def test_elf_notes_machine_and_virtual_loads(tmp_path):
    with open_vmcore(_elf(tmp_path)) as vm:
        assert vm.machine == "EM_X86_64"
        assert [p.pid for p in vm.prstatus] == [1, 0, 4242]
        assert [p.regs[0] for p in vm.prstatus] == [100, 200, 300]
        assert all(len(p.regs) == X86_NREGS and len(p.desc) == 336 for p in vm.prstatus)
        assert vm.vmcoreinfo == vmcoreinfo() and vm.vmcoreinfo_dict["PAGESIZE"] == "4096"
        assert vm.page_size == 4096
        assert [(v.vaddr, v.paddr, v.size) for v in vm.virtual_loads] == [
            (0xffff888000004000, 0x4000, 0x4000), (0xffffffff81000000, 0x1000, 0x1000)]


def test_elf_hole_is_a_plain_fault_and_memsz_tail_is_excluded(tmp_path):
    with open_vmcore(_elf(tmp_path)) as vm:
        with pytest.raises(MemoryFault) as hole:
            vm.read_phys(0x8000, 8)
        assert not isinstance(hole.value, ExcludedPageFault)
        with pytest.raises(ExcludedPageFault, match="excluded from the dump"):
            vm.read_phys(0x6010, 8)
        with pytest.raises(MemoryFault):
            vm.read_phys(0x12000 - 4, 8)   # runs off the end of a segment
        assert vm.contains_phys(0x1000, 0x5000) and not vm.contains_phys(0x5ff8, 16)


def test_kexec_per_cpu_note_segments_padded_and_pn_xnum(tmp_path):
    """kexec-tools writes one PT_NOTE per CPU buffer (zero-padded); QEMU past 0xfffe segments uses PN_XNUM."""
    notes = notes_blob([(7, 1), (9, 2)], X86_NREGS, vmcoreinfo())
    loads = [Load(pfn * 4096, page_bytes(pfn)) for pfn in range(0, 600, 3)]
    path = _write(tmp_path, "x.elf", elf_vmcore(loads, notes, note_split=356, note_pad=64, xnum=True))
    with open_vmcore(path) as vm:
        assert [p.pid for p in vm.prstatus] == [7, 9] and vm.vmcoreinfo == vmcoreinfo()
        assert len(vm.ranges) == 200
        assert vm.read_phys(597 * 4096, 4096) == page_bytes(597)


@pytest.mark.parametrize(("number", "name"), [(62, "EM_X86_64"), (183, "EM_AARCH64"), (243, "EM_RISCV"),
                                              (2, "EM_SPARC"), (0, "EM_NONE"), (0xBEEF, None)])
def test_the_machine_is_named_as_pyelftools_names_it(tmp_path, number, name):
    """e_machine: a backend's name, else pyelftools' (ENUM_E_MACHINE); a number with no name is no machine."""
    notes = notes_blob([(7, 1)], X86_NREGS, vmcoreinfo())
    path = _write(tmp_path, "m.elf", elf_vmcore([Load(0, _pages([0]))], notes, e_machine=number))
    with open_vmcore(path) as vm:
        assert vm.machine == name


@pytest.mark.parametrize(("byte", "value", "message"), [(4, 1, "only 64-bit little-endian ELF vmcores are read "
                                                               "(this one is 32-bit LE)"),
                                                        (5, 2, "(this one is 64-bit BE)"), (4, 7, "ELF class 7"),
                                                        (16, 2, "not an ELF core file (e_type 2)")])
def test_an_elf_header_that_is_no_vmcore_s_is_one_line(tmp_path, byte, value, message):
    raw = bytearray(elf_vmcore([Load(0, _pages([0]))], notes_blob([(7, 1)], X86_NREGS, vmcoreinfo())))
    raw[byte] = value
    with pytest.raises(VmcoreError, match=message.replace("(", r"\(").replace(")", r"\)")):
        open_vmcore(_write(tmp_path, "h.elf", bytes(raw)))


def test_qemu_paging_tail_is_a_hole(tmp_path):
    with open_vmcore(_elf(tmp_path, qemu=True)) as vm:
        with pytest.raises(MemoryFault) as e:
            vm.read_phys(0x6010, 8)
        assert not isinstance(e.value, ExcludedPageFault)


def test_project_dump_is_not_a_vmcore(tmp_path):
    notes = notes_blob([(1, 0)], X86_NREGS) + elfcore.note("UNWIND", elfcore.NT_UNWIND_META, b"{}")
    own = _write(tmp_path, "own.bin", elf_vmcore([Load(0, _pages([0]))], notes))
    assert not is_vmcore(own)
    assert is_vmcore(_elf(tmp_path))
    assert detect_format(_elf(tmp_path)) == "elf"


# --- kdump-compressed ----------------------------------------------------------------------------

RAM = set(range(0, 40)) | set(range(64, 80))      # pfns 40..63 are a hole
EXCLUDED = {5, 6, 70}                              # RAM filtered out (-d 31)
ZERO = {7, 8, 71}                                  # zero pages share one record


def _spec(codec: int, bs: int = 4096, **kw) -> KdumpSpec:
    dumped = {p: (bytes(bs) if p in ZERO else page_bytes(p, bs)) for p in sorted(RAM - EXCLUDED)}
    notes = notes_blob([(1, 10), (2, 20)], X86_NREGS, vmcoreinfo(4096))
    kw.setdefault("vmcoreinfo", vmcoreinfo(4096))
    return KdumpSpec(max_mapnr=80, ram=RAM, dumped=dumped, codec=codec, block_size=bs, notes=notes, **kw)


def _check_kdump(vm, bs: int = 4096):
    for pfn in sorted(RAM - EXCLUDED):
        want = bytes(bs) if pfn in ZERO else page_bytes(pfn, bs)
        assert vm.read_phys(pfn * bs, bs) == want, pfn
    assert vm.read_phys(2 * bs - 4, 8) == page_bytes(1, bs)[-4:] + page_bytes(2, bs)[:4]
    for pfn in EXCLUDED:
        with pytest.raises(ExcludedPageFault, match="excluded from the dump") as e:
            vm.read_phys(pfn * bs + 8, 8)
        assert e.value.addr == pfn * bs + 8 and e.value.page == pfn * bs
        assert vm.is_excluded(pfn * bs)
    for paddr in (45 * bs, 80 * bs, 1 << 40):      # a hole, the first pfn past max_mapnr, far beyond
        with pytest.raises(MemoryFault) as f:
            vm.read_phys(paddr, 8)
        assert not isinstance(f.value, ExcludedPageFault)
    with pytest.raises(ExcludedPageFault):         # a read that reaches into an excluded page
        vm.read_phys(5 * bs - 4, 8)
    assert [(r.start // bs, r.end // bs) for r in vm.ranges] == [(0, 40), (64, 80)]
    assert [p.pid for p in vm.prstatus] == [1, 2] and vm.prstatus[1].regs[:2] == (20, 21)
    assert vm.vmcoreinfo_dict["OSRELEASE"] == "6.12.0-synthetic"


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: codecs.CODEC_NAMES.get(c, "none"))
def test_kdump_every_codec(tmp_path, codec):
    path = _write(tmp_path, "dump.kdump", kdump_file(_spec(codec)))
    with open_vmcore(path) as vm:
        assert isinstance(vm, DiskDump) and vm.format == "kdump" and vm.machine == "EM_X86_64"
        assert vm.compression == [codecs.CODEC_NAMES[codec]] if codec else vm.compression == []
        _check_kdump(vm)


@pytest.mark.parametrize("codec", [codecs.DUMP_DH_COMPRESSED_ZLIB, codecs.DUMP_DH_COMPRESSED_SNAPPY])
def test_kdump_qemu_arm64_64k_blocks_unknown_machine(tmp_path, codec):
    """QEMU writes 64 KiB blocks on arm64 whatever the guest's page size, and utsname "Unknown"."""
    spec = _spec(codec, bs=65536, machine="Unknown")
    spec.notes = notes_blob([(1, 10), (2, 20)], 34, vmcoreinfo(4096))
    with open_vmcore(_write(tmp_path, "arm64.kdump", kdump_file(spec))) as vm:
        assert vm.block_size == 65536 and vm.page_size == 4096
        assert vm.machine == "EM_AARCH64" and vm.machine_source == "NT_PRSTATUS size"
        _check_kdump(vm, 65536)


def test_kdump_header_version_5_uses_32bit_max_mapnr(tmp_path):
    with open_vmcore(_write(tmp_path, "v5.kdump", kdump_file(_spec(1, header_version=5)))) as vm:
        assert vm.max_mapnr == 80
        _check_kdump(vm)


def test_kdump_incomplete_dump_faults_on_the_pages_it_never_wrote(tmp_path):
    """makedumpfile sets DUMP_DH_COMPRESSED_INCOMPLETE when the disk fills: the tail of the file is missing."""
    spec = _spec(codecs.DUMP_DH_COMPRESSED_ZLIB, status_extra=codecs.DUMP_DH_COMPRESSED_INCOMPLETE)
    full = kdump_file(spec)
    with open_vmcore(_write(tmp_path, "full.kdump", full)) as vm:
        cut = vm._desc_start + 30 * 24     # the descriptors of the first 30 dumped pages survive
    path = _write(tmp_path, "cut.kdump", full[:cut])
    with open_vmcore(path) as vm:
        assert vm.incomplete and vm.damage is not None and vm.damage.what == "incomplete"
        dumped = sorted(RAM - EXCLUDED)
        with pytest.raises(TruncatedFault, match="beyond the end of the file"):
            vm.read_phys(dumped[40] * 4096, 8)
        with pytest.raises(TruncatedFault, match="beyond the end of the file"):
            vm.read_phys(dumped[5] * 4096, 8)    # its descriptor survives, its data does not
        assert {a // 4096 for r in vm.damage.absent for a in range(r.start, r.end, 4096)} == set(dumped)


def test_kdump_split_file_holds_only_its_pfn_range(tmp_path):
    spec = _spec(codecs.DUMP_DH_COMPRESSED_ZLIB)
    spec.dumped = {p: b for p, b in spec.dumped.items() if 16 <= p < 72}
    spec.split = (16, 72)
    with open_vmcore(_write(tmp_path, "split.kdump", kdump_file(spec))) as vm:
        assert vm.read_phys(20 * 4096, 4096) == page_bytes(20)
        for pfn in (2, 75):
            with pytest.raises(MemoryFault) as e:
                vm.read_phys(pfn * 4096, 8)
            assert not isinstance(e.value, ExcludedPageFault)


# --- flattened -----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS[:4], ids=lambda c: codecs.CODEC_NAMES[c])
def test_flattened_kdump_reads_like_the_reassembled_file(tmp_path, codec):
    plain = kdump_file(_spec(codec))
    path = _write(tmp_path, "dump.flat", flatten(plain, record=1000, seed=codec, overwrite_header=True))
    assert detect_format(path) == "flattened-kdump"
    with open_vmcore(path) as vm:
        assert vm.format == "flattened-kdump" and vm._src.size == len(plain)
        assert vm._src.pread(0, len(plain)) == plain
        _check_kdump(vm)


def test_flattened_elf(tmp_path):
    raw = open(_elf(tmp_path), "rb").read()
    path = _write(tmp_path, "elf.flat", flatten(raw, record=3000, seed=7))
    with open_vmcore(path) as vm:
        assert vm.format == "flattened-elf"
        assert vm.read_phys(0x10000, 4096) == page_bytes(16)


def test_flattened_index_is_cached_by_size_and_mtime(tmp_path, monkeypatch):
    from unwind.formats.vmcore import flattened

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(flattened, "CACHE_MIN_RECORDS", 1)
    path = _write(tmp_path, "dump.flat", flatten(kdump_file(_spec(1)), record=512))
    with open_vmcore(path):
        pass
    cached = list((tmp_path / "cache").rglob("*.npy"))
    assert len(cached) == 1
    calls = []
    monkeypatch.setattr(flattened, "_index_records", lambda src: calls.append(src) or [])
    with open_vmcore(path) as vm:
        _check_kdump(vm)
    assert calls == []


# --- laziness ------------------------------------------------------------------------------------

def _count_preads(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = os.pread

    def pread(fd, n, off):
        sizes.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", pread)
    return sizes


def test_opening_a_sparse_8g_elf_reads_only_headers(tmp_path, monkeypatch):
    size = 8 << 30                         # one 8 GiB PT_LOAD backed by a sparse file
    notes = notes_blob([(1, 0)], X86_NREGS, vmcoreinfo())
    ehdr_len = elfcore.Elf64_Ehdr.sizeof() + 2 * elfcore.Elf64_Phdr.sizeof()
    data_off = -(-(ehdr_len + len(notes)) // 4096) * 4096
    phdrs = [dict(p_type=elfcore.PT_NOTE, p_flags=0, p_offset=ehdr_len, p_vaddr=0, p_paddr=0,
                  p_filesz=len(notes), p_memsz=len(notes), p_align=0),
             dict(p_type=elfcore.PT_LOAD, p_flags=6, p_offset=data_off, p_vaddr=0, p_paddr=0,
                  p_filesz=size, p_memsz=size, p_align=0)]
    ehdr = elfcore.Elf64_Ehdr.build(dict(
        e_type=4, e_machine=62, e_version=1, e_entry=0, e_phoff=64, e_shoff=0, e_flags=0, e_ehsize=64,
        e_phentsize=56, e_phnum=2, e_shentsize=0, e_shnum=0, e_shstrndx=0))
    path = tmp_path / "big.elf"
    with open(path, "wb") as f:
        f.write(ehdr + b"".join(elfcore.Elf64_Phdr.build(p) for p in phdrs) + notes)
        f.seek(data_off + 0x12345000)
        f.write(page_bytes(0x12345))
        f.truncate(data_off + size)
    sizes = _count_preads(monkeypatch)
    with open_vmcore(path) as vm:
        opened = sum(sizes)
        assert vm.read_phys(0x12345000, 4096) == page_bytes(0x12345)
    assert opened < 64 << 10


def test_opening_a_4g_kdump_reads_headers_and_bitmaps_only(tmp_path, monkeypatch):
    mapnr = 1 << 20                        # 4 GiB of 4 KiB pages
    ram = set(range(mapnr))
    spec = KdumpSpec(max_mapnr=mapnr, ram=ram, dumped={p: page_bytes(p) for p in range(0, mapnr, 4096)})
    path = _write(tmp_path, "big.kdump", kdump_file(spec))
    sizes = _count_preads(monkeypatch)
    with open_vmcore(path) as vm:
        opened = sum(sizes)
        assert vm.read_phys(4096 * 4096 * 5, 16) == page_bytes(4096 * 5)[:16]
        with pytest.raises(ExcludedPageFault):
            vm.read_phys(4096 * 3, 8)
    assert opened < 2 * (mapnr // 8) + (64 << 10)    # the two bitmaps plus a few headers


def test_decoded_pages_are_cached_within_a_bound(tmp_path, monkeypatch):
    path = _write(tmp_path, "dump.kdump", kdump_file(_spec(codecs.DUMP_DH_COMPRESSED_ZSTD)))
    with open_vmcore(path, cache_bytes=3 * 4096) as vm:
        sizes = _count_preads(monkeypatch)
        vm.read_phys(0x1000, 8)
        first = len(sizes)
        vm.read_phys(0x1100, 8)
        vm.read_phys(0x1ff8, 8)
        assert len(sizes) == first            # same page: no new read
        for pfn in (2, 3, 4, 9):
            vm.read_phys(pfn * 4096, 8)
        assert len(vm._cache) == 3 and vm._cache_bytes <= 3 * 4096
        before = len(sizes)
        vm.read_phys(0x1000, 8)               # evicted: read again
        assert len(sizes) > before


def test_bitmap_runs_across_chunks(monkeypatch):
    """RAM ranges from bitmap 1, found a chunk at a time, equal a bit-by-bit scan."""
    import random

    from unwind.formats.vmcore import diskdump

    def naive(bm: bytes, n: int) -> list[tuple[int, int]]:
        out, start = [], None
        for i in range(n + 1):
            bit = i < n and bm[i >> 3] >> (i & 7) & 1
            if bit and start is None:
                start = i
            elif not bit and start is not None:
                out.append((start, i))
                start = None
        return out

    monkeypatch.setattr(diskdump, "RUN_CHUNK_BITS", 64)
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randrange(1, 700)
        bm = bytes(rng.choice((0, 255, rng.randrange(256))) for _ in range((n + 7) // 8 + rng.randrange(3)))
        assert diskdump._bit_runs(bm, n, "x") == naive(bm, n)
    monkeypatch.setattr(diskdump, "MAX_RANGES", 10)
    with pytest.raises(VmcoreError, match="more than 10 RAM ranges"):
        diskdump._bit_runs(b"\x55" * 8, 64, "x")
