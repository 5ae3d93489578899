"""Address translations of a real vmcore checked against drgn's, and recorded for the default tests.

drgn (PyPI ``drgn``, imported only here) opens the same vmcore with the same
vmlinux and answers, for a sample of kernel virtual addresses it finds itself
(kernel-image variables, every task's ``task_struct`` and stack, per-CPU
areas, module memory), ``follow_phys(init_mm, va)`` and the bytes there. Our
:class:`~unwind.formats.vmcore.virtual.VirtualMemory` must give the same physical
address and the same bytes.

:func:`record` also keeps the physical pages our translation read (page
tables, the variables the shortcuts need) with drgn's answers, so a test can
replay the translation of a real kernel's page tables without the vmcore:
``python -m unwind.lab.translations VMCORE VMLINUX ARCH -o OUT.json.xz [--capture DUMP]``.
drgn translates no riscv addresses; there the capture of the same stop is the
oracle, or QEMU's own MMU: ``--take-from-qemu MONITOR`` stops a running guest,
dumps it to VMCORE and asks HMP ``gva2gpa`` for each sampled address.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import lzma
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from unwind.core import registry
from unwind.formats.image import Image
from unwind.core.memory import MemoryFault
from unwind.formats.vmcore.virtual import PhysReader, VirtualMemory
from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

#: image variables every generation has, read as a first sample
IMAGE_SYMBOLS = ("init_task", "jiffies", "linux_banner", "init_mm", "swapper_pg_dir", "__per_cpu_offset",
                 "init_uts_ns", "vmcoreinfo_note")
#: the image symbols the translators use for their shortcuts
SHORTCUT_SYMBOLS = ("_text", "_end", "_start", "_stext", "_etext", "__start_rodata", "__end_rodata",
                    "__inittext_begin", "_data", "_sdata", "__init_begin", "__init_end", "page_offset_base",
                    "vmalloc_base", "kasan_early_shadow_page")
#: the link-time symbols a search for the kernel's own VMCOREINFO reads (riscv)
FIND_SYMBOLS = ("_start", "_stext", "vmcoreinfo_note", "swapper_pg_dir", "kernel_map", "phys_ram_base", "satp_mode")
#: bytes compared per address
SAMPLE_BYTES = 64
_DRGN_ARCH = {"x86_64": "X86_64", "arm64": "AARCH64", "riscv": "RISCV64"}


class TranslationMismatch(Exception):
    """Our translation of a vmcore disagrees with drgn's."""


@dataclass
class PageRecorder:
    """A physical reader that remembers every page it served."""

    phys: PhysReader
    page_size: int = 4096
    pages: dict[int, bytes] = field(default_factory=dict)

    def read_phys(self, paddr: int, size: int) -> bytes:
        data = self.phys.read_phys(paddr, size)
        first, last = paddr // self.page_size, (paddr + max(size, 1) - 1) // self.page_size
        for pfn in range(first, last + 1):
            if pfn not in self.pages:
                self.pages[pfn] = self.phys.read_phys(pfn * self.page_size, self.page_size)
        return data


def drgn_program(vmcore: str | Path, vmlinux: str | Path, arch: str) -> Any:
    """drgn's Program on the vmcore, with the platform given (drgn needs it for QEMU's x86 ELF)."""
    import drgn

    flags = drgn.PlatformFlags.IS_64_BIT | drgn.PlatformFlags.IS_LITTLE_ENDIAN
    prog = drgn.Program(drgn.Platform(getattr(drgn.Architecture, _DRGN_ARCH[arch]), flags))
    prog.set_core_dump(str(vmcore))
    prog.load_debug_info([str(vmlinux)])
    return prog


def sample_addresses(prog: Any, limit: int = 400) -> list[tuple[int, str]]:
    """Kernel virtual addresses drgn finds on its own, each with what it is."""
    from drgn.helpers.linux.cpumask import for_each_possible_cpu
    from drgn.helpers.linux.module import for_each_module
    from drgn.helpers.linux.percpu import per_cpu_ptr
    from drgn.helpers.linux.pid import for_each_task

    out: list[tuple[int, str]] = []
    for name in IMAGE_SYMBOLS:
        try:
            out.append((prog.symbol(name).address, f"&{name}"))
        except LookupError:
            continue
    try:
        rq = prog["runqueues"].address_of_()
        for cpu in for_each_possible_cpu(prog):
            out.append((per_cpu_ptr(rq, cpu).value_(), f"runqueues[{cpu}]"))
    except (LookupError, ValueError):
        pass
    for task in for_each_task(prog):
        pid = task.pid.value_()
        stack = task.stack.value_()
        out += [(task.value_(), f"task {pid}"), (stack, f"stack of {pid}"), (stack + 0x3FF8, f"stack top of {pid}")]
        if len(out) >= limit:
            break
    try:
        for mod in for_each_module(prog):
            for member in ("mem", "core_layout"):
                try:
                    base = mod.member_(member)
                    base = base[0].base if member == "mem" else base.base
                    out.append((base.value_(), f"module {mod.name.string_().decode()}"))
                    break
                except (LookupError, AttributeError):
                    continue
    except LookupError:
        pass
    return out


def drgn_answers(prog: Any, addrs: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """drgn's physical address and bytes for each sampled address (``None`` where drgn faults)."""
    from drgn import FaultError
    from drgn.helpers.linux.mm import follow_phys

    init_mm = prog["init_mm"].address_of_()
    out = []
    for va, what in addrs:
        try:
            pa = follow_phys(init_mm, va).value_()
        except (FaultError, ValueError, LookupError):
            pa = None
        try:
            data = prog.read(va, SAMPLE_BYTES).hex()
        except FaultError:
            data = None
        out.append({"va": va, "what": what, "pa": pa, "bytes": data})
    return out


def vmcoreinfo_of(vmcore: Any, arch: str, image: Image, phys: PhysReader) -> tuple[VmcoreInfo, str | None]:
    """The dump's VMCOREINFO, or the kernel's own found in memory (riscv QEMU dumps), with how it was found."""
    info = VmcoreInfo.parse(vmcore.vmcoreinfo or "")
    if info:
        return info, None
    return registry.get(arch).vmcoreinfo_from_memory(phys, [(r.start, r.end) for r in vmcore.ranges],
                                                     image.symbols.address, image.btf)


def kaslr_offset(info: VmcoreInfo, link_symbol: Callable[[str], int | None]) -> int:
    """Runtime minus link-time addresses: ``SYMBOL(_stext)`` against the image's (every arch writes it)."""
    runtime, link = info.symbol("_stext"), link_symbol("_stext")
    if runtime is not None and link is not None:
        return runtime - link
    return info.hex("KERNELOFFSET") or 0


def our_memory(vmcore: Any, arch: str, image: Image, tables: PhysReader | None = None,
               shortcuts: bool = True) -> tuple[VirtualMemory, VmcoreInfo, dict[str, int], str | None]:
    """Our VirtualMemory over an opened vmcore, with the VMCOREINFO, runtime symbols and how it was found.

    ``tables`` serves the translator's own reads (a :class:`PageRecorder`);
    the data is read from the vmcore. Without ``shortcuts`` every address is walked.
    """
    tables = tables or vmcore
    info, how = vmcoreinfo_of(vmcore, arch, image, tables)
    offset = kaslr_offset(info, image.symbols.address)
    symbols = {n: a + offset for n in SHORTCUT_SYMBOLS if (a := image.symbols.address(n)) is not None}
    tr = registry.get(arch).translator(info, tables, symbols.get)
    if not shortcuts:
        tr.linear = ()
    return VirtualMemory(vmcore, tr), info, symbols, how


def info_text(info: VmcoreInfo) -> str:
    """VMCOREINFO back as its ``KEY=VALUE`` lines."""
    return "".join(f"{k}={v}\n" for k, v in info.items())


def compare(vm: VirtualMemory, answers: list[dict[str, Any]]) -> list[str]:
    """Every disagreement between our translation and the oracle's (drgn, QEMU), as lines; empty when they agree."""
    bad = []
    for a in answers:
        va, what, want = a["va"], a["what"], a["pa"]
        try:
            pa: int | None = vm.page_phys(va)
        except MemoryFault as e:
            pa = None
            if want is not None:
                bad.append(f"{va:#x} ({what}): the oracle says {want:#x}, ours faults: {e}")
                continue
        if pa != want:
            bad.append(f"{va:#x} ({what}): the oracle says {want and hex(want)}, ours {pa and hex(pa)}")
            continue
        if "bytes" not in a:  # an oracle of addresses only (QEMU's gva2gpa)
            continue
        try:
            ours = vm.read(va, SAMPLE_BYTES).hex()
        except MemoryFault as e:
            if a["bytes"] is not None:
                bad.append(f"{va:#x} ({what}): the oracle reads it, ours faults: {e}")
            continue
        if a["bytes"] is None:
            bad.append(f"{va:#x} ({what}): the oracle faults (excluded or absent), ours reads it")
        elif ours != a["bytes"]:
            bad.append(f"{va:#x} ({what}): bytes differ from the oracle's")
    return bad


def compare_capture(vm: VirtualMemory, capture: str | Path) -> tuple[int, list[str]]:
    """Bytes of every segment of the project's capture of the same stop (read through QEMU's MMU) vs ours.

    Returns the number of bytes compared and each disagreement as a line.
    """
    from unwind.formats.dump import Dump

    bad, n = [], 0
    for seg in Dump.open(capture).memory.segments:
        try:
            ours = vm.read(seg.start, len(seg.data))
        except MemoryFault as e:
            bad.append(f"{seg.start:#x}+{len(seg.data):#x}: captured, ours faults: {e}")
            continue
        n += len(ours)
        if ours != seg.data:
            first = next(i for i, (a, b) in enumerate(zip(ours, seg.data)) if a != b)
            bad.append(f"{seg.start:#x}+{len(seg.data):#x}: differs from the capture first at {seg.start + first:#x}")
    return n, bad


def record(vmcore_path: str | Path, vmlinux: str | Path, arch: str, out: str | Path,
           sample_from: str | Path | None = None, capture: str | Path | None = None,
           qemu_gva2gpa: str | Path | None = None) -> dict[str, Any]:
    """Check our translation against drgn's (not on riscv) and the capture's bytes; write what a test replays.

    ``sample_from`` is another vmcore of the same stop where drgn can list
    the tasks (a filtered dump may lack pages ``for_each_task`` walks);
    ``capture`` the project's dump of the same stop; ``qemu_gva2gpa`` a JSON
    list of ``{"va", "qemu"}`` that QEMU's HMP ``gva2gpa`` answered for the
    stopped guest, taken instead of drgn (riscv). The xz JSON written keeps
    drgn's answers, a SHA-256 of each captured segment, and the physical pages
    our translator read, plus those the captured bytes came from.
    """
    from unwind.formats.vmcore import open_vmcore

    image = Image(vmlinux)
    answers: list[dict[str, Any]] = []
    how = []
    if qemu_gva2gpa is not None:
        with open(qemu_gva2gpa) as f:
            answers = [{"va": int(r["va"], 16), "what": r.get("what", "sampled"), "pa": int(r["qemu"], 16)}
                       for r in json.load(f) if r["qemu"] is not None]
        how.append(f"QEMU's own MMU: HMP gva2gpa of each address, with the guest stopped ({Path(qemu_gva2gpa).name})")
    elif arch != "riscv":  # drgn translates no riscv addresses
        import drgn

        prog = drgn_program(vmcore_path, vmlinux, arch)
        answers = drgn_answers(prog, sample_addresses(drgn_program(sample_from, vmlinux, arch) if sample_from
                                                      else prog))
        how.append(f"drgn {drgn.__version__}: follow_phys(init_mm, va) and prog.read(va, {SAMPLE_BYTES}) on "
                   f"{Path(vmcore_path).name}; addresses sampled by drgn"
                   f"{' on ' + Path(sample_from).name if sample_from else ''} (image variables, for_each_task "
                   "task_struct and stack, per-CPU runqueues, modules)")
    segments: list[dict[str, Any]] = []
    with open_vmcore(vmcore_path) as vmc:
        rec = PageRecorder(vmc, vmc.page_size)
        ranges = vmc.ranges
        vm, info, symbols, found = our_memory(vmc, arch, image, rec)
        walk, _, _, _ = our_memory(vmc, arch, image, rec, shortcuts=False)
        # the page tables alone must agree too, where the shortcuts answered
        bad = compare(vm, answers) + compare(walk, answers)
        if capture is not None:
            data = VirtualMemory(rec, vm.translator)  # the captured bytes' pages are kept too
            for mem in (data, walk):
                bad += compare_capture(mem, capture)[1]
            from unwind.formats.dump import Dump

            segments = [{"va": hex(seg.start), "size": len(seg.data), "sha256": hashlib.sha256(seg.data).hexdigest()}
                        for seg in Dump.open(capture).memory.segments]
            how.append(f"every segment of {Path(capture).name} (the project's capture of the same stop, read "
                       "through QEMU's MMU) equals our read of the vmcore")
        if bad:
            raise TranslationMismatch(f"{len(bad)} of our reads differ: " + "; ".join(bad[:5]))
    doc = {
        "how": "; ".join(how) + f". vmcore {Path(vmcore_path).name}, {Path(vmlinux).name} (build-id "
                                f"{image.build_id}); pages: what our translation read",
        "arch": arch, "vmcoreinfo": info_text(info), "vmcoreinfo_found": found,
        "symbols": {k: hex(v) for k, v in symbols.items()},
        "page_size": vm.page_size,
        "pages": {hex(pfn): base64.b64encode(data).decode() for pfn, data in sorted(rec.pages.items())},
        "translations": [{"va": hex(a["va"]), "what": a["what"], "pa": None if a["pa"] is None else hex(a["pa"])}
                         for a in answers],
        "capture": segments,
        "ranges": [[hex(r.start), hex(r.end)] for r in ranges],
        "link_symbols": {n: hex(a) for n in FIND_SYMBOLS if (a := image.symbols.address(n)) is not None},
    }
    with lzma.open(out, "wt") as f:
        json.dump(doc, f, indent=0)
    return doc


def _hmp(sock: Any, command: str, wait: float) -> str:
    """One HMP command on a monitor socket; its output without the terminal escapes."""
    import re
    import socket
    import time

    sock.sendall((command + "\n").encode())
    time.sleep(wait)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except socket.timeout:
        pass
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", data.decode(errors="replace"))


def take_from_qemu(monitor: str | Path, vmcore: str | Path, vmlinux: str | Path) -> Path:
    """Stop a lab guest, dump it to ``vmcore`` and ask QEMU's MMU (HMP ``gva2gpa``) where our sampled addresses are.

    The addresses are every task's ``task_struct``, stack bottom and top word
    (as our Session lists them) and a few image variables; QEMU answers with
    the stopped vCPU's own translation. Writes and returns ``VMCORE.gva2gpa.json``
    (``[{"va", "what", "qemu"}]``), the input of ``record(..., qemu_gva2gpa=)``.
    """
    import re
    import socket

    from unwind.session.replay import Session

    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(monitor))
    sock.settimeout(0.5)
    _hmp(sock, "", 0.5)
    _hmp(sock, "stop", 0.5)
    if not Path(vmcore).exists():
        _hmp(sock, f"dump-guest-memory {vmcore}", 30)
    session = Session.load(vmcore, vmlinux=vmlinux)
    addrs = [(a, f"&{n}") for n in IMAGE_SYMBOLS[:3] if (a := session.symbols.address(n)) is not None]
    for t in session.dump.kernel_tasks():
        addrs += [(t.addr, f"task {t.pid}"), (t.stack, f"stack of {t.pid}"),
                  (t.stack + 0x3FF8, f"stack top of {t.pid}")]
    rows = []
    for va, what in addrs:
        m = re.search(r"gpa: (0x[0-9a-f]+)", _hmp(sock, f"gva2gpa {va:#x}", 0.15))
        rows.append({"va": hex(va), "what": what, "qemu": m.group(1) if m else None})
    sock.close()
    out = Path(f"{vmcore}.gva2gpa.json")
    out.write_text(json.dumps(rows))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m unwind.lab.translations VMCORE VMLINUX ARCH -o OUT``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vmcore")
    p.add_argument("vmlinux")
    p.add_argument("arch", choices=sorted(_DRGN_ARCH))
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--sample-from", help="another vmcore of the same stop to list the tasks in")
    p.add_argument("--capture", help="the project's dump of the same stop, to compare bytes with")
    p.add_argument("--qemu-gva2gpa", help="JSON [{va, qemu}] of QEMU's gva2gpa answers, instead of drgn")
    p.add_argument("--take-from-qemu", metavar="MONITOR", help="first stop the guest on this HMP socket, dump it to "
                   "VMCORE and write VMCORE.gva2gpa.json from QEMU's MMU (then used as --qemu-gva2gpa)")
    a = p.parse_args(argv)
    if a.take_from_qemu:
        a.qemu_gva2gpa = take_from_qemu(a.take_from_qemu, a.vmcore, a.vmlinux)
    doc = record(a.vmcore, a.vmlinux, a.arch, a.out, a.sample_from, a.capture, a.qemu_gva2gpa)
    print(f"{len(doc['translations'])} translations agree, {len(doc['capture'])} captured segments "
          f"with the capture; {len(doc['pages'])} pages kept in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
