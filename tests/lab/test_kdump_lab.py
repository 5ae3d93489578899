"""``unwind lab kdump`` helpers that need no QEMU: the console cut, the vmcore's length on the disk, the disk's
transport, and the kexec library closure's refusal of a library it cannot place."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from unwind.lab.boot import LabError
from unwind.lab.fetch import FetchError, Kernel
from unwind.lab.kdump import (IOMEM, KALLSYMS, between_markers, disk_transport, elf_size, kexec_tree,
                               panic_console)

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
KDUMPS = sorted(CORPORA.glob("*/*/vmcore/kdump-*.elf.xz"))

FULL = """[    9.0] Run /init as init process
kexec_crash_loaded: 1
CRASHING NOW
[   90.1] sysrq: Trigger a crash
[   90.2] Kernel panic - not syncing: sysrq triggered crash
[   90.3] Call trace:
[   90.4]  panic+0x160/0x378
[   90.5] Bye!
[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x000f0510]
[    0.000000] Linux version 6.12.117+deb13-arm64
"""


def test_the_console_kept_is_the_panicking_kernels_from_the_sysrq_line_on() -> None:
    kept = panic_console(FULL).splitlines()
    assert kept[0] == "[   90.1] sysrq: Trigger a crash" and kept[-1] == "[   90.5] Bye!"
    riscv = FULL.replace("[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x000f0510]\n", "")
    assert panic_console(riscv).splitlines()[-1] == "[   90.5] Bye!"  # riscv's first line is "Linux version"


def test_a_console_without_the_crash_is_refused() -> None:
    with pytest.raises(LabError, match="no 'sysrq: Trigger a crash'"):
        panic_console("[    9.0] Run /init as init process\n")


def test_what_init_printed_between_its_markers_is_kept_without_the_kernels_messages() -> None:
    """/init's /proc/kallsyms lines are kept, a kernel message printed among them left out; a console without both
    markers keeps nothing."""
    full = (f"kexec_crash_loaded: 1\r\n{IOMEM}\r\n00001000-0009fbff : System RAM\r\n{IOMEM}\r\n{KALLSYMS}\r\n"
            f"ffffffff8e200000 T _text\r\n[    9.840148] random: crng init done\r\nffffffff8eebe4c0 T panic\r\n"
            f"{KALLSYMS}\r\nCRASHING NOW\r\n")
    assert between_markers(full, KALLSYMS) == "ffffffff8e200000 T _text\nffffffff8eebe4c0 T panic\n"
    assert between_markers(full, IOMEM) == "00001000-0009fbff : System RAM\n"
    assert between_markers(full.split(KALLSYMS)[0] + KALLSYMS + "\n", KALLSYMS) == ""


@pytest.mark.parametrize("vmcore", KDUMPS, ids=lambda p: p.parts[-4])
def test_the_vmcore_ends_where_its_elf_headers_say_not_where_the_disk_does(vmcore: Path, tmp_path: Path) -> None:
    """The capture kernel writes /proc/vmcore to the start of a larger disk: the file is cut at its last segment."""
    data = lzma.decompress(vmcore.read_bytes())
    disk = tmp_path / "disk.raw"
    disk.write_bytes(data + b"\0" * 65536)
    assert elf_size(disk) == len(data)


def _kernel(tmp_path: Path, arch: str, config: str) -> Kernel:
    (tmp_path / "config").write_text(config)
    return Kernel(arch, "6.12.117+deb13-test", tmp_path)


def test_the_disk_uses_the_transport_the_kernel_has_built_in(tmp_path: Path) -> None:
    assert disk_transport(_kernel(tmp_path, "arm64", "CONFIG_VIRTIO_BLK=m\nCONFIG_VIRTIO_PCI=y\n"
                                  "CONFIG_VIRTIO_MMIO=m\n")) == ("virtio-blk-pci", ("virtio_blk",))
    assert disk_transport(_kernel(tmp_path, "riscv", "CONFIG_VIRTIO_BLK=m\nCONFIG_VIRTIO_MMIO=m\n")) == \
        ("virtio-blk-device", ("virtio_blk", "virtio_mmio"))
    with pytest.raises(LabError, match="neither virtio PCI nor virtio MMIO"):
        disk_transport(_kernel(tmp_path, "x86_64", "CONFIG_VIRTIO_BLK=y\n"))


def test_kexec_needing_a_library_of_no_known_package_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The closure fetches only what DT_NEEDED names; a name it cannot place is one line, not a guess."""
    import unwind.lab.kdump as kdump

    root = tmp_path / "tools" / "kexec-arm64" / "usr" / "sbin"
    root.mkdir(parents=True)
    (root / "kexec").write_bytes(b"")
    monkeypatch.setattr(kdump, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(kdump, "ensure_apt_source", lambda suite, arch: None)
    monkeypatch.setattr(kdump, "_interp", lambda path: "/lib/ld-linux-aarch64.so.1")
    monkeypatch.setattr(kdump, "_needed", lambda path: ["libnowhere.so.9"])
    with pytest.raises(FetchError, match="kexec needs libnowhere.so.9: no Debian package"):
        kexec_tree("arm64")


def test_the_first_kernels_init_reads_back_the_payload_the_disk_was_given(tmp_path) -> None:
    """The crash kernel and its initramfs go on the disk past the vmcore's room; /init's dd commands, run here with
    the disk and /kdump pointed at files, give back the same bytes (sizes not a whole MiB on purpose)."""
    import subprocess

    from unwind.lab.kdump import payload_commands, write_payload

    files = [("Image", bytes(range(256)) * 9001), ("initrd.gz", b"\x1f\x8b" + b"x" * (3 << 20))]
    disk = tmp_path / "disk.raw"
    disk.write_bytes(b"\xee" * (7 << 20))
    write_payload(disk, 2, files)
    (tmp_path / "kdump").mkdir()
    script = payload_commands(2, [(n, len(d)) for n, d in files])
    script = script.replace("/dev/vda", str(disk)).replace("/kdump/", f"{tmp_path}/kdump/")
    subprocess.run(["sh", "-c", script], check=True)
    for name, data in files:
        assert (tmp_path / "kdump" / name).read_bytes() == data


def test_a_slice_describes_the_ram_its_source_did_and_reads_the_pages_cut_away_as_excluded(tmp_path) -> None:
    """slice_elf of a committed kdump slice down to two of its pages: the same PT_LOAD ranges to p_memsz, those
    two pages' bytes, a page cut away raises ExcludedPageFault, RAM the source never described a plain miss."""
    from elftools.elf.elffile import ELFFile

    from unwind.core.memory import ExcludedPage, MemoryFault
    from unwind.formats.vmcore.errors import ExcludedPageFault
    from unwind.formats.vmcore.opening import open_vmcore
    from unwind.lab.vmcores import slice_elf

    src = tmp_path / "src.elf"
    src.write_bytes(lzma.decompress(next(v for v in KDUMPS if v.parts[-4] == "riscv").read_bytes()))
    with open(src, "rb") as f:
        held = [(s["p_paddr"], s["p_filesz"]) for s in ELFFile(f).iter_segments()
                if s["p_type"] == "PT_LOAD" and s["p_filesz"]]
    a, b = held[len(held) // 2][0] >> 12, held[-1][0] >> 12
    cut = slice_elf(src, tmp_path / "cut.elf", {a, b})

    def described(path: Path) -> list[tuple[int, int]]:
        with open(path, "rb") as f:
            spans = sorted((s["p_paddr"], s["p_paddr"] + s["p_memsz"]) for s in ELFFile(f).iter_segments()
                           if s["p_type"] == "PT_LOAD")
        out: list[tuple[int, int]] = []
        for lo, hi in spans:
            if out and lo <= out[-1][1]:
                out[-1] = (out[-1][0], max(hi, out[-1][1]))
            else:
                out.append((lo, hi))
        return out

    assert described(cut) == described(src)
    whole, part = open_vmcore(src), open_vmcore(cut)
    for pfn in (a, b):
        assert part.read_phys(pfn << 12, 4096) == whole.read_phys(pfn << 12, 4096)
    gone = next(p for p, n in held if p >> 12 not in (a, b) and n >= 8192) + 4096
    whole.read_phys(gone, 8)
    with pytest.raises(ExcludedPageFault):
        part.read_phys(gone, 8)
    hole = described(src)[0][1]  # the first byte past the first described range
    with pytest.raises(MemoryFault) as e:
        part.read_phys(hole, 8)
    assert not isinstance(e.value, ExcludedPage)
