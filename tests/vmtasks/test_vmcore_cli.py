"""Bad vmcores on the command line: one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.formats import elfcore
from unwind.core import registry
from unwind.cli.main import main

CORPORA = Path(__file__).resolve().parents[2] / "corpora"


def _elf_vmcore(machine: str, vmcoreinfo: str | None, phys: bytes = bytes(4096), truncate: int = 0) -> bytes:
    """A QEMU-style ELF vmcore: one PT_NOTE (PRSTATUS, VMCOREINFO) and one physical PT_LOAD at 0."""
    backend = registry.for_machine(machine)
    n = len(backend.prstatus_regs)
    notes = elfcore.note("CORE", elfcore.NT_PRSTATUS, elfcore.prstatus_bytes(n, [0] * n, 1))
    if vmcoreinfo is not None:
        notes += elfcore.note("VMCOREINFO", 0, vmcoreinfo.encode())
    off = elfcore.Elf64_Ehdr.sizeof() + 2 * elfcore.Elf64_Phdr.sizeof()
    phdrs = [dict(p_type=elfcore.PT_NOTE, p_flags=0, p_offset=off, p_vaddr=0, p_paddr=0, p_filesz=len(notes),
                  p_memsz=len(notes), p_align=4),
             dict(p_type=elfcore.PT_LOAD, p_flags=6, p_offset=off + len(notes), p_vaddr=0, p_paddr=0,
                  p_filesz=len(phys), p_memsz=len(phys), p_align=8)]
    ehdr = elfcore.Elf64_Ehdr.build(dict(
        e_type=elfcore.ET_CORE, e_machine=backend.e_machine, e_version=1, e_entry=0,
        e_phoff=elfcore.Elf64_Ehdr.sizeof(), e_shoff=0, e_flags=backend.e_flags, e_ehsize=64, e_phentsize=56,
        e_phnum=2, e_shentsize=0, e_shnum=0, e_shstrndx=0))
    raw = ehdr + b"".join(elfcore.Elf64_Phdr.build(p) for p in phdrs) + notes + phys
    return raw[:len(raw) - truncate] if truncate else raw


def _slim(arch: str) -> Path:
    return next((CORPORA / arch).glob("*/vmlinux-*.slim.xz"))


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("command", ["replay", "ps"])
def test_riscv_without_vmcoreinfo_needs_the_image_then_finds_the_kernels_own(tmp_path, capsys, command) -> None:
    """QEMU writes no VMCOREINFO for riscv: the image must be named, then the note is searched in memory."""
    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_RISCV", None))
    rc, err = _run(capsys, command, str(p))
    assert rc == 2 and "--vmlinux" in err and len(err.splitlines()) == 1
    rc, err = _run(capsys, command, str(p), "--vmlinux", str(_slim("riscv")))
    assert rc == 2 and "vmcoreinfo_note was not found" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["replay", "ps"])
def test_no_vmcoreinfo(tmp_path, capsys, command) -> None:
    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_X86_64", None))
    rc, err = _run(capsys, command, str(p))
    assert rc == 2 and "no VMCOREINFO" in err and len(err.splitlines()) == 1


def test_wrong_vmlinux_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_X86_64", "OSRELEASE=6.12.0\nBUILD-ID=" + "ab" * 20 + "\n"))
    rc, err = _run(capsys, "replay", str(p), "--vmlinux", str(_slim("x86_64")))
    assert rc == 2 and "does not match" in err and len(err.splitlines()) == 1


def test_image_of_another_arch_is_refused(tmp_path, capsys) -> None:
    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_X86_64", "OSRELEASE=6.12.0\n"))
    rc, err = _run(capsys, "ps", str(p), "--vmlinux", str(_slim("arm64")))
    assert rc == 2 and "EM_AARCH64" in err and "EM_X86_64" in err and len(err.splitlines()) == 1


def test_no_image_found(tmp_path, capsys) -> None:
    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_AARCH64", "OSRELEASE=6.12.0\nBUILD-ID=" + "cd" * 20 + "\n"))
    rc, err = _run(capsys, "convert", str(p), "-o", str(tmp_path / "out.bin"))
    assert rc == 2 and "no image with build-id" in err and len(err.splitlines()) == 1


def test_truncated_vmcore(tmp_path, capsys) -> None:
    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_X86_64", "OSRELEASE=6.12.0\n", truncate=100))
    rc, err = _run(capsys, "replay", str(p))
    assert rc == 2 and "truncated" in err and len(err.splitlines()) == 1


def test_riscv_vmcoreinfo_found_in_memory_is_taken(tmp_path, monkeypatch) -> None:
    """What the backend finds in memory becomes the dump's VMCOREINFO (release, build-id, numbers)."""
    from unwind.formats.image import open_image
    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo
    from unwind.formats.vmdump import VmcoreFile

    p = tmp_path / "vmcore"
    p.write_bytes(_elf_vmcore("EM_RISCV", None))
    vmcore = VmcoreFile.open(str(p))
    image = open_image(_slim("riscv"))
    found = VmcoreInfo.parse(f"OSRELEASE=6.12.0\nBUILD-ID={image.build_id}\nNUMBER(VA_BITS)=57\n")
    monkeypatch.setattr(type(vmcore.backend), "vmcoreinfo_from_memory",
                        lambda self, phys, ranges, symbol, btf=None: (found, "found it"))
    text, how = vmcore.vmcoreinfo_from_memory(image)
    info = VmcoreInfo.parse(text)
    assert how == "found it"
    assert info.get("OSRELEASE") == "6.12.0" and info.get("BUILD-ID") == image.build_id
    assert info.get("NUMBER(VA_BITS)") == "57"


def test_a_release_or_build_id_not_in_the_kernels_form_is_dropped_with_a_warning() -> None:
    """OSRELEASE is utsname's release (at most 64 characters), BUILD-ID 40 hex digits (%20phN)."""
    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

    warnings: list[str] = []
    good = VmcoreInfo.parse("OSRELEASE=6.12.0-1-amd64\nBUILD-ID=" + "0a" * 20 + "\n").checked(warnings.append)
    assert dict(good) == {"OSRELEASE": "6.12.0-1-amd64", "BUILD-ID": "0a" * 20} and not warnings
    for text in ("OSRELEASE=" + "6" * 65, "BUILD-ID=" + "0a" * 21, "BUILD-ID=" + "0A" * 20, "BUILD-ID=zz"):
        warnings.clear()
        assert dict(VmcoreInfo.parse(text + "\nPAGESIZE=4096\n").checked(warnings.append)) == {"PAGESIZE": "4096"}
        assert len(warnings) == 1 and "dropped" in warnings[0] and len(warnings[0]) < 200


def test_a_riscv_vmcoreinfo_with_an_overlong_release_still_converts(tmp_path, capsys, monkeypatch) -> None:
    """The kernel's VMCOREINFO found in riscv memory is whatever memory holds: a release longer than
    utsname allows is left out of the converted dump, not written into a note that cannot be read."""
    import lzma

    from unwind.formats.vmcore.vmcoreinfo import VmcoreInfo

    committed = next((CORPORA / "riscv").glob("*/vmcore/*.elf.xz"))
    image = str(next(committed.parent.parent.glob("vmlinux-*.slim.xz")))
    vmcore = tmp_path / "vmcore"
    vmcore.write_bytes(lzma.decompress(committed.read_bytes()))
    parse = VmcoreInfo.parse.__func__  # type: ignore[attr-defined]

    def overlong_release(cls, text):
        if isinstance(text, str):
            text = text.replace("OSRELEASE=", "OSRELEASE=" + "x" * 600, 1)
        return parse(cls, text)
    monkeypatch.setattr(VmcoreInfo, "parse", classmethod(overlong_release))
    out = tmp_path / "out.bin"
    rc = main(["convert", str(vmcore), "--vmlinux", image, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 0 and out.exists(), err
    assert "OSRELEASE='xxx" in err and "dropped" in err
    assert main(["replay", str(out), "--vmlinux", image]) == 0
