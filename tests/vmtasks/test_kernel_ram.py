"""The kernel's RAM read from a synthetic kernel whose map is known by construction (unwind.kernel.ram).

The BTF's member offsets are not the kernel's (``parent`` before ``start``), so nothing can lean on a layout.
"""

from __future__ import annotations

import struct

import pytest

from unwind.core.memory import Memory, Segment
from unwind.formats.vmcore.physmem import PhysRange
from unwind.kernel.btf import Btf
from unwind.kernel.model import Kernel
from unwind.kernel.ram import (IORESOURCE_MEM, IORESOURCE_SYSTEM_RAM, MEMBLOCK_NOMAP, crash_kernel_ranges,
                               for_each_mem_range, subtract_ranges, walk_system_ram_res)

from .btfgen import BtfBuilder

BASE = 0xFFFF800080000000
#: struct resource: offsets shuffled on purpose
RES = {"parent": 0, "sibling": 8, "child": 16, "flags": 24, "start": 32, "end": 40, "name": 48, "desc": 56}
SIZE = 0x40
BUSY = 0x80000000


def _btf() -> Btf:
    b = BtfBuilder()
    b.struct("task_struct", 0x400, [("pid", b.u32, 0)])
    b.struct("thread_union", 0x4000, [("stack", b.array(b.long, 0x800), 0)], kind="union")
    b.struct("resource", SIZE, [(n, b.u32 if n == "desc" else b.long, off) for n, off in RES.items()])
    region = b.struct("memblock_region", 0x18, [("base", b.long, 0), ("size", b.long, 8), ("flags", b.u32, 0x10)])
    mtype = b.struct("memblock_type", 0x28, [("cnt", b.long, 0), ("max", b.long, 8), ("total_size", b.long, 0x10),
                                             ("regions", b.ptr(region), 0x18), ("name", b.voidp, 0x20)])
    b.struct("memblock", 0x60, [("bottom_up", b.char, 0), ("current_limit", b.long, 8), ("memory", mtype, 0x10),
                                ("reserved", mtype, 0x38)])
    return Btf(b.blob())


class _Map:
    """Memory holding ``iomem_resource`` and its tree, ``crashk_res`` and ``memblock``, at known addresses."""

    def __init__(self) -> None:
        self.mem = bytearray(0x10000)
        self.symbols = {"iomem_resource": BASE, "crashk_res": BASE + 0x1000, "memblock": BASE + 0x2000}
        self.next = BASE + 0x4000

    def resource(self, start: int, end: int, flags: int, parent: int = 0, at: int | None = None) -> int:
        addr = at if at is not None else self.next
        if at is None:
            self.next += SIZE
        for n, v in (("start", start), ("end", end), ("flags", flags), ("parent", parent)):
            struct.pack_into("<Q", self.mem, addr - BASE + RES[n], v)
        return addr

    def link(self, parent: int, children: list[int]) -> None:
        struct.pack_into("<Q", self.mem, parent - BASE + RES["child"], children[0])
        for a, b in zip(children, children[1:]):
            struct.pack_into("<Q", self.mem, a - BASE + RES["sibling"], b)

    def memblock(self, regions: list[tuple[int, int, int]]) -> None:
        array = BASE + 0x3000
        mb = self.symbols["memblock"] - BASE
        struct.pack_into("<QQQQ", self.mem, mb + 0x10, len(regions), 128, 0, array)
        for i, (base, size, flags) in enumerate(regions):
            struct.pack_into("<QQI", self.mem, array - BASE + i * 0x18, base, size, flags)

    def kernel(self) -> Kernel:
        return Kernel(Memory([Segment(BASE, bytes(self.mem))]), _btf(), self.symbols.get)


@pytest.fixture
def machine() -> _Map:
    """riscv's virt machine as its /proc/iomem shows it: firmware's reserved RAM, System RAM with the kernel and
    the crash kernel inside, a device, and RAM above 4 GiB."""
    m = _Map()
    root = m.resource(0, 2**64 - 1, IORESOURCE_MEM, at=m.symbols["iomem_resource"])
    uart = m.resource(0x10000000, 0x100000ff, IORESOURCE_MEM | BUSY, root)
    firmware = m.resource(0x80000000, 0x8003ffff, IORESOURCE_MEM | BUSY, root)
    ram = m.resource(0x80040000, 0xbfffffff, IORESOURCE_SYSTEM_RAM | BUSY, root)
    high = m.resource(0x100000000, 0x13fffffff, IORESOURCE_SYSTEM_RAM | BUSY, root)
    code = m.resource(0x80200000, 0x80dfffff, IORESOURCE_SYSTEM_RAM | BUSY, ram)
    crash = m.resource(0xacc00000, 0xbcbfffff, IORESOURCE_SYSTEM_RAM | BUSY, ram, at=m.symbols["crashk_res"])
    m.link(root, [uart, firmware, ram, high])
    m.link(ram, [code, crash])
    return m


def test_system_ram_is_every_system_ram_resource_merged(machine: _Map) -> None:
    k = machine.kernel()
    assert walk_system_ram_res(k) == [PhysRange(0x80040000, 0xc0000000), PhysRange(0x100000000, 0x140000000)]
    assert crash_kernel_ranges(k) == [PhysRange(0xacc00000, 0xbcc00000)]


def test_a_resource_tree_that_loops_is_refused(machine: _Map) -> None:
    root = machine.symbols["iomem_resource"]
    last = struct.unpack_from("<Q", machine.mem, root - BASE + RES["child"])[0] + 4 * SIZE  # "high"
    struct.pack_into("<Q", machine.mem, last - BASE + RES["sibling"], last)
    with pytest.raises(ValueError, match="more than"):
        walk_system_ram_res(machine.kernel())


def test_memblock_memory_without_its_nomap_regions(machine: _Map) -> None:
    machine.memblock([(0x80000000, 0x40000, MEMBLOCK_NOMAP), (0x80040000, 0x3ffc0000, 0),
                      (0x100000000, 0x40000000, 0)])
    assert for_each_mem_range(machine.kernel()) == [PhysRange(0x80040000, 0xc0000000),
                                                     PhysRange(0x100000000, 0x140000000)]


def test_memblock_with_more_regions_than_its_array_is_refused(machine: _Map) -> None:
    machine.memblock([(0x80000000, 0x1000, 0)])
    struct.pack_into("<Q", machine.mem, machine.symbols["memblock"] - BASE + 0x10, 129)
    with pytest.raises(ValueError, match="129 of 128"):
        for_each_mem_range(machine.kernel())


def test_subtract_ranges() -> None:
    ram = [PhysRange(0, 100), PhysRange(200, 300)]
    assert subtract_ranges(ram, [PhysRange(10, 20), PhysRange(90, 210), PhysRange(250, 260)]) == [
        PhysRange(0, 10), PhysRange(20, 90), PhysRange(210, 250), PhysRange(260, 300)]
    assert subtract_ranges(ram, []) == ram and subtract_ranges(ram, [PhysRange(0, 400)]) == []


def test_memblock_in_freed_init_data_is_not_read(machine: _Map) -> None:
    """Without ARCH_KEEP_MEMBLOCK memblock is __initdata_memblock: freed after boot, its bytes anyone's."""
    from unwind.kernel.model import KernelError

    machine.memblock([(0x80000000, 0x1000, 0)])
    machine.symbols |= {"__init_begin": machine.symbols["memblock"] - 0x100, "__init_end": BASE + 0x8000}
    with pytest.raises(KernelError, match="init data"):
        for_each_mem_range(machine.kernel())
