"""The RAM the kernel had: ``iomem_resource``'s System RAM (kernel/resource.c, what /proc/iomem prints and
kexec-tools writes a crash kernel's ELF headers from), else memblock's memory (mm/memblock.c, kept after boot
on arm64 and riscv), and the crash kernel's reservation, which a kdump leaves out by design.
"""

from __future__ import annotations

from typing import NamedTuple

from unwind.formats.vmcore.physmem import PhysRange, merge_ranges
from .model import Kernel, KernelError, field_int

#: include/linux/ioport.h
IORESOURCE_MEM = 0x00000200
IORESOURCE_SYSRAM = 0x01000000
IORESOURCE_SYSTEM_RAM = IORESOURCE_MEM | IORESOURCE_SYSRAM
#: include/linux/memblock.h: MEMBLOCK_NOMAP, memory the kernel does not map (firmware's)
MEMBLOCK_NOMAP = 0x4
#: resources read at the most (a machine's iomem holds tens to a few thousand)
MAX_RESOURCES = 1 << 14
#: the members of ``struct resource`` a walk reads
_MEMBERS = ("start", "end", "flags", "parent", "sibling", "child")


class Resource(NamedTuple):
    """One ``struct resource``: ``[start, end]`` (``end`` inclusive, as the kernel keeps it), its flags and links."""

    start: int
    end: int
    flags: int
    parent: int
    sibling: int
    child: int


def read_resource(kernel: Kernel, addr: int) -> Resource:
    """The ``struct resource`` at ``addr`` (offsets from BTF)."""
    data = kernel.read_members(addr, "resource", _MEMBERS)
    return Resource(*(field_int(kernel.btf, data, "resource", m) for m in _MEMBERS))


# next_resource() (kernel/resource.c)
def next_resource(kernel: Kernel, res: Resource, skip_children: bool) -> int:
    """The resource after ``res`` in the tree's depth-first order (its first child unless ``skip_children``),
    0 at the end."""
    if not skip_children and res.child:
        return res.child
    seen = 0
    while not res.sibling and res.parent:
        res = read_resource(kernel, res.parent)
        seen += 1
        if seen > MAX_RESOURCES:
            raise ValueError("iomem_resource: the parent links loop")
    return res.sibling


# walk_system_ram_res() (kernel/resource.c), every range rather than a callback per range
def walk_system_ram_res(kernel: Kernel) -> list[PhysRange]:
    """The physical ranges of ``iomem_resource`` flagged ``IORESOURCE_SYSTEM_RAM`` ("System RAM"), merged.

    Raises :class:`~unwind.core.memory.MemoryFault` when the tree is not in the dump, ``ValueError`` when it
    loops or is larger than :data:`MAX_RESOURCES`; ``KernelError`` when the image has no ``iomem_resource``.
    """
    root = read_resource(kernel, kernel.require("iomem_resource"))
    found: list[tuple[int, int]] = []
    p, n = root.child, 0
    while p:
        n += 1
        if n > MAX_RESOURCES:
            raise ValueError(f"iomem_resource: more than {MAX_RESOURCES} resources")
        res = read_resource(kernel, p)
        if res.flags & IORESOURCE_SYSTEM_RAM == IORESOURCE_SYSTEM_RAM and res.end >= res.start:
            found.append((res.start, res.end + 1))
        p = next_resource(kernel, res, False)
    return merge_ranges(found)


# for_each_mem_range() (include/linux/memblock.h): memblock.memory without MEMBLOCK_NOMAP regions
def for_each_mem_range(kernel: Kernel) -> list[PhysRange]:
    """The ranges of ``memblock.memory`` the kernel maps (``MEMBLOCK_NOMAP`` ones skipped, as the kernel skips
    them), merged. Raises as :func:`walk_system_ram_res`; ``ValueError`` on a count past ``memory.max``,
    ``KernelError`` when memblock lies in the init section the kernel freed."""
    base = kernel.require("memblock")
    begin, end = kernel.symbol("__init_begin"), kernel.symbol("__init_end")
    if begin is not None and end is not None and begin <= base < end:  # __initdata_memblock without ARCH_KEEP_MEMBLOCK
        raise KernelError("memblock is init data, freed after boot (the kernel does not keep memblock)")
    cnt = kernel.read_u64(base + kernel.offsetof("memblock", "memory.cnt"))
    most = kernel.read_u64(base + kernel.offsetof("memblock", "memory.max"))
    if cnt > most or most > MAX_RESOURCES:
        raise ValueError(f"memblock.memory: {cnt} of {most} regions")
    regions = kernel.read_u64(base + kernel.offsetof("memblock", "memory.regions"))
    size = kernel.btf.sizeof("memblock_region")
    found = []
    for i in range(cnt):
        data = kernel.read_members(regions + i * size, "memblock_region", ("base", "size", "flags"))
        start, length = (field_int(kernel.btf, data, "memblock_region", m) for m in ("base", "size"))
        if not field_int(kernel.btf, data, "memblock_region", "flags") & MEMBLOCK_NOMAP:
            found.append((start, start + length))
    return merge_ranges(found)


# crashk_res, crashk_low_res (kernel/crash_reserve.c): the memory crashkernel= reserved
def crash_kernel_ranges(kernel: Kernel) -> list[PhysRange]:
    """The crash kernel's reservations (``crashk_res``, ``crashk_low_res``): RAM a kdump leaves out by design."""
    out = []
    for name in ("crashk_res", "crashk_low_res"):
        addr = kernel.symbol(name)
        if addr is not None:
            res = read_resource(kernel, addr)
            if res.end > res.start:
                out.append((res.start, res.end + 1))
    return merge_ranges(out)


def subtract_ranges(ranges: list[PhysRange], holes: list[PhysRange]) -> list[PhysRange]:
    """The parts of ``ranges`` outside every one of ``holes`` (both sorted and merged)."""
    out: list[PhysRange] = []
    for r in ranges:
        start = r.start
        for h in holes:
            if h.end <= start or h.start >= r.end:
                continue
            if h.start > start:
                out.append(PhysRange(start, h.start))
            start = max(start, h.end)
        if start < r.end:
            out.append(PhysRange(start, r.end))
    return out
