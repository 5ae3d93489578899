"""riscv64 translation on page tables built by construction (Sv39/Sv48/Sv57, 4K..512G, Svnapot), and
finding the kernel's own vmcoreinfo_note when the dump has no VMCOREINFO.

PTEs are encoded here from the RISC-V privileged spec: V 0, R 1, W 2, X 3, A 6, D 7, PPN [53:10],
PBMT [62:61], N 63; a valid entry with R=W=X=0 points to the next table.
"""

from __future__ import annotations

import pytest

from unwind.arch.riscv import mm
from unwind.formats.dump import DumpError
from unwind.core.memory import NotMapped
from unwind.core.registry import get
from unwind.formats.vmcore.virtual import VirtualMemory
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from tests.vmcore.phys import RadixTables, SparsePhys

V, R, W, X, A, D, N = 1, 2, 4, 8, 1 << 6, 1 << 7, 1 << 63
PBMT_IO = 2 << 61
LEVELS = {39: [(30, 9), (21, 9), (12, 9)], 48: [(39, 9), (30, 9), (21, 9), (12, 9)],
          57: [(48, 9), (39, 9), (30, 9), (21, 9), (12, 9)]}


def tables(va_bits: int, alloc_base: int = 0x80000000) -> RadixTables:
    return RadixTables(SparsePhys(alloc_base=alloc_base), LEVELS[va_bits], lambda pa: (pa >> 12) << 10 | V,
                       lambda pa, lvl: (pa >> 12) << 10 | V | R | W | A | D | PBMT_IO)


@pytest.mark.parametrize("va_bits", [39, 48, 57])
def test_leaves_at_every_level(va_bits):
    t = tables(va_bits)
    levels = LEVELS[va_bits]
    base = -(1 << (va_bits - 1)) & ((1 << 64) - 1)  # the lowest kernel (upper-half) address
    root_size = 1 << levels[0][0]
    x = mm.RiscvTranslator(t.phys, t.root, va_bits=va_bits)
    for depth, (shift, _) in enumerate(levels):  # 4K up to the root's 1G / 512G / 256T leaf
        size = 1 << shift
        va = base + (depth + 1) * root_size + 5 * size * (depth > 0)
        pa = 3 * size
        t.map(va, pa, depth)
        assert x.translate(va + size - 8) == pa + size - 8
        if depth > 0:
            with pytest.raises(NotMapped):
                x.translate(va + size)


def test_svnapot_64k():
    t = tables(39)
    va = 0xFFFFFFC000010000
    for i in range(16):  # the path to the PTEs, then the 16 identical NAPOT PTEs whose PPN ends in 0b1000
        t.map(va + i * 4096, 0x90000000, 2)
    pmd = int.from_bytes(t.phys.read_phys(t.root + 8 * ((va >> 30) & 511), 8), "little")
    pte_table = ((int.from_bytes(t.phys.read_phys(((pmd >> 10) << 12) + 8 * ((va >> 21) & 511), 8), "little")
                  >> 10) << 12)
    for i in range(16):
        slot = pte_table + 8 * (((va >> 12) + i) & 511)
        t.phys.write_u64(slot, N | (((0x90000000 >> 12) | 0b1000) << 10) | V | R | W | A | D)
    x = mm.RiscvTranslator(t.phys, t.root, va_bits=39)
    assert x.translate(va + 0x5678) == 0x90005678
    assert x.translate(va + 0xFFF8) == 0x9000FFF8


@pytest.mark.parametrize("va_bits,addr", [(39, 0xFFFFFF0000000000), (48, 0xFFFE000000000000),
                                          (57, 0xFE00000000000000)])
def test_non_canonical(va_bits, addr):
    with pytest.raises(NotMapped, match="canonical"):
        mm.RiscvTranslator(SparsePhys(), 0x1000, va_bits=va_bits).translate(addr)


def info(**kv: str) -> VmcoreInfo:
    return VmcoreInfo.parse("".join(f"{k}={v}\n" for k, v in kv.items()))


KLINK = 0xFFFFFFFF80000000  # KERNEL_LINK_ADDR: the last 2 GiB
LOAD = 0x80200000           # where OpenSBI leaves the image on QEMU virt
PAGE_OFFSET_SV57 = 0xFF60000000000000


def image_tables(va_bits: int) -> RadixTables:
    t = tables(va_bits, alloc_base=0x84000000)
    for off in range(0, 0x2000000, 1 << 21):
        t.map(KLINK + off, LOAD + off, len(LEVELS[va_bits]) - 2)
    return t


def test_translator_from_vmcoreinfo():
    t = image_tables(57)
    swapper = KLINK + 0x1400000
    t.phys.pages[(LOAD + 0x1400000) >> 12] = t.phys.pages[t.root >> 12]
    vi = info(**{"NUMBER(va_kernel_pa_offset)": f"{KLINK - LOAD:#x}", "SYMBOL(swapper_pg_dir)": f"{swapper:x}",
                 "NUMBER(VA_BITS)": "57", "NUMBER(PAGE_OFFSET)": f"{PAGE_OFFSET_SV57:#x}",
                 "NUMBER(phys_ram_base)": str(0x80000000)})
    x = get("riscv").translator(vi, t.phys, {"_start": KLINK, "_end": KLINK + 0x2000000}.get)
    assert x.translate(PAGE_OFFSET_SV57 + 0x1234) == 0x80001234  # linear map, no table
    assert x.translate(KLINK + 0x345678) == LOAD + 0x345678
    walk = mm.RiscvTranslator(t.phys, LOAD + 0x1400000, va_bits=57)
    assert walk.translate(KLINK + 0x345678) == LOAD + 0x345678


@pytest.mark.parametrize("kv,msg", [
    ({}, "va_kernel_pa_offset"),
    ({"NUMBER(va_kernel_pa_offset)": "0x1"}, "swapper_pg_dir"),
    ({"NUMBER(va_kernel_pa_offset)": "0x1", "SYMBOL(swapper_pg_dir)": "ffffffff81400000",
      "NUMBER(VA_BITS)": "40"}, "Sv39"),
    ({"NUMBER(va_kernel_pa_offset)": "0x1", "SYMBOL(swapper_pg_dir)": "ffffffff81400000",
      "NUMBER(VA_BITS)": "1" * 30}, "not a number"),
])
def test_bad_vmcoreinfo_is_one_dump_error(kv, msg):
    with pytest.raises(DumpError, match=msg):
        mm.translator(info(**kv), SparsePhys(), {}.get)


@pytest.mark.parametrize("va_bits", [39, 48, 57])
def test_find_vmcoreinfo_through_the_image_symbols(va_bits):
    t = image_tables(va_bits)
    note_sym, swapper = KLINK + 0x1500008, KLINK + 0x1400000
    t.phys.pages[(LOAD + 0x1400000) >> 12] = t.phys.pages[t.root >> 12]
    # the note: a page of the linear map, at a physical page of its own; its text crosses into a second page
    desc = (f"OSRELEASE=6.12.0\nNUMBER(VA_BITS)={va_bits}\n" + "X" * 4100 + "\n").encode()
    note = (11).to_bytes(4, "little") + len(desc).to_bytes(4, "little") + bytes(4) + b"VMCOREINFO\0\0" + desc
    note_pa, note_va = 0x86000000, (-(1 << (va_bits - 1)) & ((1 << 64) - 1)) + 0x6000000
    t.phys.write(note_pa, note)
    t.map(note_va, note_pa, len(LEVELS[va_bits]) - 1)
    t.map(note_va + 4096, note_pa + 4096, len(LEVELS[va_bits]) - 1)
    t.phys.write_u64(LOAD + 0x1500008, note_va)
    syms = {"_start": KLINK, "vmcoreinfo_note": note_sym, "swapper_pg_dir": swapper}.get
    vi, how = get("riscv").vmcoreinfo_from_memory(t.phys, [(0x80000000, 0x90000000)], syms)
    assert vi["OSRELEASE"] == "6.12.0" and vi.number("NUMBER(VA_BITS)") == va_bits
    assert "0x80200000" in how and "vmcoreinfo_note" in how
    with pytest.raises(DumpError, match="not found"):
        mm.find_vmcoreinfo(t.phys, [(0x80000000, 0x90000000)],
                           {"_start": KLINK, "vmcoreinfo_note": note_sym + 8, "swapper_pg_dir": swapper}.get)
    with pytest.raises(DumpError, match="lacks"):
        mm.find_vmcoreinfo(t.phys, [(0x80000000, 0x90000000)], {}.get)


def test_virtual_memory_over_riscv_tables():
    t = tables(48)
    va = 0xFFFFAF8000000000 + 0x5000
    t.map(va, 0x91000000, 3)
    t.map(va + 4096, 0x93000000, 3)
    t.phys.write(0x91000FFC, b"abcd")
    t.phys.write(0x93000000, b"efgh")
    vm = VirtualMemory(t.phys, mm.RiscvTranslator(t.phys, t.root, va_bits=48))
    assert vm.read(va + 0xFFC, 8) == b"abcdefgh"


class _KernelMappingBtf:
    """The two BTF questions the rebuild asks, answered with the 7.x layout of struct kernel_mapping."""

    LAYOUT = {"virt_addr": 0, "virt_offset": 8, "phys_addr": 16, "size": 24, "va_pa_offset": 32,
              "page_offset": 40, "va_kernel_pa_offset": 48}

    def offsetof(self, type_: str, path: str) -> int:
        assert type_ == "kernel_mapping"
        return self.LAYOUT[path]


def test_vmcoreinfo_rebuilt_from_kernel_map_when_the_note_is_gone():
    t = image_tables(48)
    slide = 0x40000000  # a KASLR slide: kernel_map.virt_addr is the runtime image address
    syms = {"_start": KLINK, "_stext": KLINK + 0x2000, "vmcoreinfo_note": KLINK + 0x1500008,
            "swapper_pg_dir": KLINK + 0x1400000, "kernel_map": KLINK + 0x1600000, "phys_ram_base": KLINK + 0x1600100,
            "satp_mode": KLINK + 0x1600108}
    km = LOAD + 0x1600000
    lay = _KernelMappingBtf.LAYOUT
    t.phys.write_u64(km + lay["virt_addr"], KLINK + slide)
    t.phys.write_u64(km + lay["phys_addr"], LOAD)
    t.phys.write_u64(km + lay["page_offset"], 0xFFFFAF8000000000)
    t.phys.write_u64(km + lay["va_pa_offset"], 0xFFFFAF8000000000 - 0x80000000)
    t.phys.write_u64(km + lay["va_kernel_pa_offset"], KLINK + slide - LOAD)
    t.phys.write_u64(LOAD + 0x1600100, 0x80000000)
    t.phys.write_u64(LOAD + 0x1600108, 0x9 << 60)  # SATP_MODE_48
    t.phys.write_u64(LOAD + 0x1500008, 0xFFFFAF8000000000 + 0x6000000)  # the note's page: not in the dump
    vi, how = mm.find_vmcoreinfo(t.phys, [(0x80000000, 0x90000000)], syms.get, _KernelMappingBtf())
    assert "rebuilt from kernel_map" in how and "0x80200000" in how
    assert vi.number("NUMBER(VA_BITS)") == 48 and vi.word("NUMBER(PAGE_OFFSET)") == 0xFFFFAF8000000000
    assert vi.word("NUMBER(va_kernel_pa_offset)") == KLINK + slide - LOAD
    assert vi.symbol("swapper_pg_dir") == KLINK + slide + 0x1400000
    assert vi.number("NUMBER(phys_ram_base)") == 0x80000000
    with pytest.raises(DumpError, match="not found"):  # without BTF the layout is unknown: no rebuild
        mm.find_vmcoreinfo(t.phys, [(0x80000000, 0x90000000)], syms.get)
    # the note itself, reached through kernel_map.va_pa_offset: no page table maps it here
    desc = b"OSRELEASE=6.12.0\nNUMBER(VA_BITS)=48\n"
    t.phys.write(0x86000000, (11).to_bytes(4, "little") + len(desc).to_bytes(4, "little") + bytes(4)
                 + b"VMCOREINFO\0\0" + desc)
    vi, how = mm.find_vmcoreinfo(t.phys, [(0x80000000, 0x90000000)], syms.get, _KernelMappingBtf())
    assert "read from the kernel's vmcoreinfo_note" in how and vi["OSRELEASE"] == "6.12.0"
    t.phys.write(0x86000000, bytes(64))
    t.phys.write_u64(km + lay["phys_addr"], LOAD + PMD)  # kernel_map must say where the image is
    with pytest.raises(DumpError, match="not found"):
        mm.find_vmcoreinfo(t.phys, [(0x80000000, 0x90000000)], syms.get, _KernelMappingBtf())


PMD = 1 << 21
