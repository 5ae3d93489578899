"""The translation shortcuts claim only what the kernel maps that way; the rest is walked.

Page tables built by construction (``tests/vmcore/phys.py``) with the image laid out as
``map_kernel()`` leaves it, and something else mapped where the image offset would point
wrong: the answer of every translation is known before the translator runs.
"""

from __future__ import annotations

import pytest

from unwind.arch.arm64 import mm as arm64_mm
from unwind.arch.riscv import mm as riscv_mm
from unwind.arch.x86_64 import mm as x86_mm
from unwind.core.memory import NotMapped
from unwind.formats.vmcore.virtual import VirtualMemory
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
from tests.vmcore.phys import RadixTables, SparsePhys

U64 = (1 << 64) - 1
PAGE = 4096

# --- arm64, 4K pages, 48-bit VA: descriptors as the Arm ARM lays them out ---
AF, SH_INNER, ARM_TABLE, ARM_PAGE = 1 << 10, 0b11 << 8, 0b11, 0b11
#: Debian 6.1's arm64 image (System.map): _text .. _stext is .head.text, 64 KiB
ARM_SYMBOLS = {"_text": 0xFFFF800008000000, "_stext": 0xFFFF800008010000, "_etext": 0xFFFF800008D00000,
               "__start_rodata": 0xFFFF800008D00000, "__inittext_begin": 0xFFFF800009660000,
               "__inittext_end": 0xFFFF800009740000, "__initdata_begin": 0xFFFF800009740000,
               "__initdata_end": 0xFFFF800009CB0000, "_data": 0xFFFF800009CB0000, "_end": 0xFFFF80000A010000}
KIMAGE_VOFFSET = 0xFFFF7FFFC8000000  # the image loaded at physical 0x40000000
#: the first frame record the user's report read from .head.text through the image offset
HEAD_TEXT_RECORD = (0x34000040B9000C40, 0xA9BE7BFDD65F03C0)


def arm64_tables() -> RadixTables:
    phys = SparsePhys(alloc_base=0x48000000)
    return RadixTables(phys, [(39, 9), (30, 9), (21, 9), (12, 9)],
                       lambda pa: pa | SH_INNER | ARM_TABLE, lambda pa, lvl: pa | SH_INNER | AF | ARM_PAGE)


def arm64_translator(t: RadixTables) -> arm64_mm.Arm64Translator:
    """The translator a vmcore of that kernel gets (swapper_pg_dir in .rodata, at its image offset)."""
    swapper = ARM_SYMBOLS["__start_rodata"] + 0x900000
    t.phys.pages[(swapper - KIMAGE_VOFFSET) // PAGE] = t.phys.pages[t.root // PAGE]
    info = VmcoreInfo.parse(f"PAGESIZE=4096\nNUMBER(VA_BITS)=48\nNUMBER(kimage_voffset)={KIMAGE_VOFFSET:#x}\n"
                            f"NUMBER(PHYS_OFFSET)=0x40000000\nNUMBER(TCR_EL1_T1SZ)=16\n"
                            f"SYMBOL(swapper_pg_dir)={swapper:x}\nSYMBOL(_stext)={ARM_SYMBOLS['_stext']:x}\n")
    return arm64_mm.translator(info, t.phys, ARM_SYMBOLS.get)


def test_arm64_irq_stack_between_text_and_stext_is_read_through_the_page_tables():
    """6.1 maps the image from _stext: [_text, _stext) is vmalloc space, and there an IRQ stack
    (vmalloc'd, VMAP_STACK) lives in a page of its own, not at the image offset."""
    t = arm64_tables()
    head = ARM_SYMBOLS["_text"]
    head_pa = head - KIMAGE_VOFFSET
    # what the image offset points at: the .head.text bytes of the loaded image
    t.phys.write(head_pa + 0x3C0, b"".join(w.to_bytes(8, "little") for w in HEAD_TEXT_RECORD))
    # the IRQ stack's page, vmalloc'd somewhere else, holding the frame record the unwinder must read
    irq_page = t.phys.alloc()
    record = (0xFFFF80000A2B3F00, 0xFFFF800008123456)  # (fp, lr): the next record and a return into .text
    t.phys.write(irq_page + 0x3C0, b"".join(w.to_bytes(8, "little") for w in record))
    t.map(head, irq_page, 3)
    vm = VirtualMemory(t.phys, arm64_translator(t))
    assert vm.translator.translate(head + 0x3C0) == irq_page + 0x3C0
    assert (vm.read_u64(head + 0x3C0), vm.read_u64(head + 0x3C8)) == record
    snap = vm.snapshot([(head, head + PAGE)])  # how the walkers are given a stack
    assert snap.read_u64(head + 0x3C0) == record[0]


def test_arm64_hole_left_unmapped_is_not_read_at_the_image_offset():
    t = arm64_tables()
    t.phys.write(ARM_SYMBOLS["_text"] - KIMAGE_VOFFSET, b"MZ")  # the image header is in the dump
    tr = arm64_translator(t)
    with pytest.raises(NotMapped):
        tr.translate(ARM_SYMBOLS["_text"])


def test_arm64_freed_init_memory_is_walked():
    """free_initmem() unmaps [__init_begin, __init_end): the image offset no longer applies there."""
    t = arm64_tables()
    tr = arm64_translator(t)
    for name in ("__inittext_begin", "__initdata_begin"):
        with pytest.raises(NotMapped):
            tr.translate(ARM_SYMBOLS[name])


@pytest.mark.parametrize("name", ["_stext", "__start_rodata", "_data"])
def test_arm64_mapped_segments_keep_the_image_offset(name):
    """The segments map_kernel() maps and keeps: kimage_voffset, with no table read at all."""
    tr = arm64_translator(arm64_tables())
    va = ARM_SYMBOLS[name] + 0x1238
    assert tr.translate(va) == va - KIMAGE_VOFFSET


# --- x86-64, 4-level: the image gaps mark_rodata_ro() and free_initmem() free ---
X86_PRESENT, X86_RW = 1 << 0, 1 << 1
#: Debian 6.1's x86-64 image (System.map)
X86_SYMBOLS = {"_text": 0xFFFFFFFF81000000, "_etext": 0xFFFFFFFF81E01D32, "__start_rodata": 0xFFFFFFFF82000000,
               "__end_rodata": 0xFFFFFFFF828EB000, "_sdata": 0xFFFFFFFF82A00000,
               "__init_begin": 0xFFFFFFFF83044000, "__init_end": 0xFFFFFFFF83306000, "_end": 0xFFFFFFFF84430000}
START_KERNEL_MAP = 0xFFFFFFFF80000000


def test_x86_image_gaps_unmapped_with_pti_are_walked():
    """With PTI, free_kernel_image_pages() unmaps the text/rodata and rodata/data gaps and __init:
    the walk says so where the image offset would read freed pages."""
    phys = SparsePhys(alloc_base=0x10000000)
    t = RadixTables(phys, [(39, 9), (30, 9), (21, 9), (12, 9)],
                    lambda pa: pa | X86_PRESENT | X86_RW, lambda pa, lvl: pa | X86_PRESENT | X86_RW)
    text_pa = X86_SYMBOLS["_text"] - START_KERNEL_MAP  # phys_base 0
    t.map(X86_SYMBOLS["_text"], text_pa, 3)
    pgt = X86_SYMBOLS["_sdata"] + 0x8000
    phys.pages[(pgt - START_KERNEL_MAP) // PAGE] = phys.pages[t.root // PAGE]
    info = VmcoreInfo.parse(f"NUMBER(phys_base)=0\nSYMBOL(init_top_pgt)={pgt:x}\n")
    tr = x86_mm.translator(info, phys, X86_SYMBOLS.get)
    assert tr.translate(X86_SYMBOLS["_text"] + 0x10) == text_pa + 0x10
    assert tr.translate(X86_SYMBOLS["__start_rodata"]) == X86_SYMBOLS["__start_rodata"] - START_KERNEL_MAP
    for va in (X86_SYMBOLS["_etext"] + PAGE, X86_SYMBOLS["__end_rodata"], X86_SYMBOLS["__init_begin"]):
        with pytest.raises(NotMapped):
            tr.translate(va)


# --- riscv64 Sv57: the KASAN shadow starts inside PAGE_OFFSET + KERN_VIRT_SIZE ---
RISCV_V, RISCV_R, RISCV_W = 1, 2, 4
PAGE_OFFSET_SV57 = 0xFF60000000000000
KASAN_SHADOW_START_SV57 = 0xFFDF000000000000  # Documentation/arch/riscv/vm-layout.rst


def test_riscv_kasan_shadow_is_not_read_through_the_linear_map():
    phys = SparsePhys(alloc_base=0x84000000)
    t = RadixTables(phys, [(48, 9), (39, 9), (30, 9), (21, 9), (12, 9)], lambda pa: (pa >> 12) << 10 | RISCV_V,
                    lambda pa, lvl: (pa >> 12) << 10 | RISCV_V | RISCV_R | RISCV_W)
    shadow_page = phys.alloc()  # kasan_populate_early_shadow() maps the shadow to pages of its own
    t.map(KASAN_SHADOW_START_SV57, shadow_page, 4)
    klink, load = 0xFFFFFFFF80000000, 0x80200000
    swapper = klink + 0x1400000
    phys.pages[(load + 0x1400000) // PAGE] = phys.pages[t.root // PAGE]
    info = VmcoreInfo.parse(f"NUMBER(va_kernel_pa_offset)={klink - load:#x}\nSYMBOL(swapper_pg_dir)={swapper:x}\n"
                            f"NUMBER(VA_BITS)=57\nNUMBER(PAGE_OFFSET)={PAGE_OFFSET_SV57:#x}\n"
                            f"NUMBER(phys_ram_base)={0x80000000}\n")
    symbols = {"_start": klink, "_end": klink + 0x2000000, "kasan_early_shadow_page": klink + 0x1800000}
    tr = riscv_mm.translator(info, phys, symbols.get)
    assert tr.translate(KASAN_SHADOW_START_SV57 + 0x10) == shadow_page + 0x10
