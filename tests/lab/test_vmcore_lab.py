"""Offline parts of the lab's vmcore making: ``capture --vmcore``, the makedumpfile input copy, guest modules."""

import json
import subprocess
from pathlib import Path

import pytest
from elftools.construct.lib import Container
from elftools.elf.elffile import ELFFile
from elftools.elf.structs import ELFStructs

from unwind.lab.boot import BootOptions, build_initramfs, qemu_command
from unwind.lab.capture import parse_vmcore_formats, write_qemu_vmcores
from unwind.lab.fetch import Kernel
from unwind.lab.guest import CaptureError
from unwind.lab.modules import LAB_MODULE_QEMU_ARGS, LAB_MODULES, _modname
from unwind.lab.vmcores import VmcoreToolError, phdrs_first_copy


def test_vmcore_formats_are_checked_per_arch() -> None:
    assert parse_vmcore_formats("elf, kdump-zlib", "arm64") == ["elf", "kdump-zlib"]
    assert parse_vmcore_formats("elf,paging", "x86_64") == ["elf", "paging"]
    with pytest.raises(CaptureError, match="only for x86_64"):
        parse_vmcore_formats("paging", "riscv")
    with pytest.raises(CaptureError, match="unknown vmcore format 'kdump-xz'"):
        parse_vmcore_formats("elf,kdump-xz", "x86_64")


class FakeMonitor:
    """Answers HMP dump-guest-memory like QEMU: writes the file named last (unless told not to)."""

    def __init__(self, write: bool = True) -> None:
        self.lines: list[str] = []
        self.write = write

    def cmd(self, line: str) -> str:
        self.lines.append(line)
        if self.write:
            Path(line.split()[-1]).write_bytes(b"\x7fELF")
            return ""
        return "Error: dump: failed to save memory"


def test_qemu_vmcores_are_named_after_the_dump(tmp_path) -> None:
    mon = FakeMonitor()
    names = write_qemu_vmcores(mon, tmp_path / "stop-003-random.bin.xz", ["elf", "paging", "kdump-zlib"])
    assert names == ["stop-003-random.elf", "stop-003-random.paging.elf", "stop-003-random.kdump-zlib.flat"]
    assert mon.lines == [f"dump-guest-memory {tmp_path}/stop-003-random.elf",
                         f"dump-guest-memory -p {tmp_path}/stop-003-random.paging.elf",
                         f"dump-guest-memory -z {tmp_path}/stop-003-random.kdump-zlib.flat"]


def test_qemu_writing_nothing_is_one_line(tmp_path) -> None:
    with pytest.raises(CaptureError, match=r"QEMU wrote no stop-000-random.elf: Error: dump: failed"):
        write_qemu_vmcores(FakeMonitor(write=False), tmp_path / "stop-000-random.bin.xz", ["elf"])


def _qemu72_elf(path: Path) -> tuple[bytes, bytes]:
    """An ELF core laid out as QEMU 7.2 writes it: section headers at 64, program headers after them."""
    s = ELFStructs(little_endian=True, elfclass=64)
    s.create_basic_structs()
    s.create_advanced_structs(e_type="ET_CORE", e_machine="EM_X86_64")
    note = b"\x0b\0\0\0\x08\0\0\0\0\0\0\0VMCOREINFO\0\0OSRELEAS"
    mem = bytes(range(256)) * 16
    shoff, phoff = 64, 64 + 2 * 64
    notes_off = phoff + 2 * 56
    mem_off = notes_off + len(note)
    ehdr = s.Elf_Ehdr.build(Container(
        e_ident=Container(EI_MAG=[0x7F, 0x45, 0x4C, 0x46], EI_CLASS="ELFCLASS64", EI_DATA="ELFDATA2LSB",
                          EI_VERSION="EV_CURRENT", EI_OSABI="ELFOSABI_SYSV", EI_ABIVERSION=0),
        e_type="ET_CORE", e_machine="EM_X86_64", e_version="EV_CURRENT", e_entry=0, e_phoff=phoff,
        e_shoff=shoff, e_flags=0, e_ehsize=8, e_phentsize=56, e_phnum=2, e_shentsize=64, e_shnum=2,
        e_shstrndx=0))
    shdrs = bytes(128)
    phdrs = s.Elf_Phdr.build(Container(p_type="PT_NOTE", p_flags=0, p_offset=notes_off, p_vaddr=0, p_paddr=0,
                                       p_filesz=len(note), p_memsz=len(note), p_align=0)) + \
        s.Elf_Phdr.build(Container(p_type="PT_LOAD", p_flags=0, p_offset=mem_off, p_vaddr=0x1000,
                                   p_paddr=0x1000, p_filesz=len(mem), p_memsz=len(mem), p_align=0))
    path.write_bytes(ehdr + shdrs + phdrs + note + mem)
    return note, mem


def test_makedumpfile_copy_has_the_program_headers_after_the_elf_header(tmp_path) -> None:
    note, mem = _qemu72_elf(tmp_path / "q.elf")
    phdrs_first_copy(tmp_path / "q.elf", tmp_path / "m.elf")
    raw = (tmp_path / "m.elf").read_bytes()
    with open(tmp_path / "m.elf", "rb") as f:
        elf = ELFFile(f)
        assert (elf.header["e_phoff"], elf.header["e_ehsize"], elf.header["e_shnum"]) == (64, 64, 0)
        segs = [(s["p_type"], s["p_offset"], s.data()) for s in elf.iter_segments()]
    # makedumpfile reads phdr i at 64 + 56 * i: the same segments, with their data where it was
    assert [(t, d) for t, _, d in segs] == [("PT_NOTE", note), ("PT_LOAD", mem)]
    assert raw[64 + 56:64 + 56 + 4] == b"\x01\0\0\0"  # PT_LOAD
    assert raw.endswith(note + mem)


def test_makedumpfile_copy_refuses_a_header_that_does_not_fit(tmp_path) -> None:
    _qemu72_elf(tmp_path / "q.elf")
    data = bytearray((tmp_path / "q.elf").read_bytes())
    data[56:58] = (0xFFFF).to_bytes(2, "little")  # e_phnum = PN_XNUM
    (tmp_path / "x.elf").write_bytes(bytes(data))
    with pytest.raises(VmcoreToolError, match="PN_XNUM"):
        phdrs_first_copy(tmp_path / "x.elf", tmp_path / "m.elf")


def test_module_names_from_package_members() -> None:
    assert _modname("./usr/lib/modules/6.12.117+deb13-amd64/kernel/drivers/hid/uhid.ko.xz") == "uhid"
    assert _modname("./lib/modules/6.1.0-57-amd64/kernel/drivers/char/hw_random/virtio-rng.ko") == "virtio_rng"


def test_module_guest_gets_the_modules_and_the_scsi_host(tmp_path, initramfs_members) -> None:
    root = tmp_path / "k"
    (root / "modules").mkdir(parents=True)
    (root / "kernel.json").write_text(json.dumps({"arch": "x86_64", "release": "r"}))
    (root / "busybox").write_bytes(b"\x7fELF busybox")
    order = ["hid", *LAB_MODULES]
    for name in order:
        (root / "modules" / f"{name}.ko").write_bytes(name.encode())
    (root / "modules" / "order").write_text("\n".join(order) + "\n")
    k = Kernel("x86_64", "r", root)
    opts = BootOptions(modules=True)
    build_initramfs(k, tmp_path / "initrd.gz", opts)
    members = initramfs_members(tmp_path / "initrd.gz")
    assert {"modules/order", *(f"modules/{n}.ko" for n in order)} <= set(members)
    assert members["modules/hid.ko"][0] == b"hid"
    cmd = qemu_command(k, tmp_path, tmp_path / "initrd.gz", 1234, opts)
    assert " ".join(LAB_MODULE_QEMU_ARGS) in " ".join(cmd)
    assert " ".join(LAB_MODULE_QEMU_ARGS) not in " ".join(qemu_command(k, tmp_path, tmp_path / "i", 1, BootOptions()))


@pytest.mark.slow
@pytest.mark.parametrize("arch,flavour,suite", [("x86_64", None, "trixie"), ("arm64", None, "trixie"),
                                                ("riscv", None, "trixie"), ("arm64", "arm64-16k", "trixie"),
                                                ("arm64", "arm64-16k", "sid")])
def test_rebuild_the_committed_vmcore_slices(tmp_path, arch, flavour, suite) -> None:
    """The recipe of ``corpora/<arch>/<release>/vmcore/``: a 256 MB module guest, one stop, its slice.

    Needs network, QEMU, drgn (x86_64, arm64), strace and ~10 min per arch; the new slice must
    list the same tasks as drgn's ``for_each_task`` of the full vmcore it came from. The 16K-page
    arm64 kernels (trixie's 6.12, sid's 7.x) boot on ``-cpu max`` (16K granule, LPA2: 52-bit VA) and
    their slices keep the page tables behind every page a replay translates.
    """
    import lzma
    import sys

    from unwind.lab.fetch import find_kernel
    from unwind.lab.modules import fetch_module_debug
    from unwind.lab.vmcores import corpus_slice

    def unwind(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "unwind", *args], capture_output=True, text=True, timeout=3600)

    r = unwind("kernels", "fetch", "--arch", arch, "--suite", suite, *(["--flavour", flavour] if flavour else []))
    assert r.returncode == 0, r.stderr
    k = find_kernel(arch, Path(r.stdout.strip()).name)
    assert k.flavour == (flavour or {"x86_64": "amd64", "arm64": "arm64", "riscv": "riscv64"}[arch])
    boot = ["lab", "boot", "--arch", arch, "--release", k.release, "--mem", "256M", "--modules", "--restart"]
    if arch == "arm64" and not flavour:  # 48-bit VA at run time: makedumpfile <= 1.7.9 refuses 4K pages, 52-bit VA
        boot += ["--qemu-args", "-cpu max,lpa2=off,pauth-impdef=on"]
    assert (r := unwind(*boot)).returncode == 0, r.stderr
    try:
        r = unwind("capture", "--lab", arch, "--stops", "1", "--vmcore", "elf", "-o", str(tmp_path))
        assert r.returncode == 0, r.stderr
    finally:
        unwind("lab", "stop", "--arch", arch)
    elf = next(tmp_path.glob("stop-*.elf"))
    slim = next((Path(__file__).resolve().parents[2] / "corpora" / arch / k.release).glob("vmlinux-*.slim.xz"))
    files = corpus_slice(elf, next(tmp_path.glob("stop-*.bin.xz")), k.vmlinux, arch, tmp_path / "corpus",
                         fetch_module_debug(k) if arch != "riscv" else [], slim, tables=flavour is not None)
    sliced = tmp_path / "slice.elf"
    sliced.write_bytes(lzma.decompress(files[0].read_bytes()))
    r = unwind("ps", str(sliced), "--vmlinux", str(slim))
    assert r.returncode == 0, r.stderr
    if len(files) == 3:
        drgn = json.loads(lzma.decompress(files[2].read_bytes()))
        listed = {int(line.lstrip("> ").split()[0]) for line in r.stdout.splitlines()[1:]}
        assert {t["pid"] for t in drgn["tasks"]} <= listed
