"""Images: symbols from ELF agree with System.map, slim images keep what replay needs."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from unwind.formats.image import Image, ImageError, find_image
from unwind.formats.slim import write_slim
from unwind.kernel.symbols import SymbolTable

CACHE = Path(os.environ.get("UNWIND_CACHE", Path.home() / ".cache" / "unwind")) / "kernels"

C_SOURCE = """
static int helper(int x) { return x * 3; }
int leaf(int x) { return x + 1; }
int caller(int x) { return helper(leaf(x)) + 2; }
int main(void) { return caller(4); }
"""


@pytest.fixture(scope="module")
def elf_exe(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a test ELF")
    d = tmp_path_factory.mktemp("elf")
    (d / "t.c").write_text(C_SOURCE)
    subprocess.run([cc, "-O1", "-fno-inline", "-Wl,--build-id=sha1", "-o", str(d / "t"), str(d / "t.c")], check=True)
    return d / "t"


def test_slim_keeps_build_id_symbols_and_text(elf_exe, tmp_path):
    full = Image(elf_exe)
    for name, with_text in (("t.slim", True), ("t.notext.slim.xz", False)):
        out = tmp_path / name
        write_slim(elf_exe, out, with_text=with_text)
        slim = Image(out)
        assert slim.build_id == full.build_id and len(slim.build_id) == 40
        assert slim.symbols.names == full.symbols.names and slim.symbols.addrs == full.symbols.addrs
        addr = full.symbols.address("caller")
        if with_text:
            assert slim.has_text and slim.text(addr, 16) == full.text(addr, 16)
        else:
            assert not slim.has_text and slim.text(addr, 16) is None
        assert out.stat().st_size < elf_exe.stat().st_size or with_text


def test_find_image_by_build_id(elf_exe, tmp_path, monkeypatch):
    bid = Image(elf_exe).build_id
    dumps = tmp_path / "corpus" / "x"
    dumps.mkdir(parents=True)
    dump = dumps / "d.bin"
    dump.write_bytes(b"")
    write_slim(elf_exe, tmp_path / "corpus" / f"vmlinux-{bid}.slim", with_text=False)
    write_slim(elf_exe, tmp_path / "corpus" / f"vmlinux-{'0' * 40}.slim", with_text=False)  # skipped by name
    found = find_image(bid, dump, None)
    assert found is not None and found.build_id == bid and bid in found.path.name
    assert find_image("f" * 40, dump, None) is None
    monkeypatch.setenv("UNWIND_IMAGE_PATH", str(tmp_path / "corpus"))
    assert find_image(bid, tmp_path / "elsewhere.bin", None) is not None
    with pytest.raises(ImageError, match="does not match"):
        find_image("f" * 40, dump, elf_exe)


def test_not_an_image(tmp_path):
    p = tmp_path / "vmlinux"
    p.write_bytes(b"not an elf")
    with pytest.raises(ImageError):
        Image(p)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["amd64", "arm64", "riscv64"])
def test_real_vmlinux_symbols_equal_system_map(flavor):
    kdir = next(iter(sorted(CACHE.glob(f"*-{flavor}"))), None)
    if kdir is None or not (kdir / "vmlinux").exists():
        pytest.skip(f"no downloaded {flavor} kernel in {CACHE} (unwind kernels fetch)")
    elf = Image(kdir / "vmlinux").symbols
    smap = SymbolTable.from_system_map(kdir / "System.map")
    assert elf.names == smap.names and elf.addrs == smap.addrs and elf.ends == smap.ends
    lo, hi = smap.address("_stext"), smap.address("_etext")
    for x in random.Random(1).sample(range(lo, hi), 2000):
        assert elf.format(x) == smap.format(x)


def test_cached_symbols_and_unpacked_images_equal_fresh_ones(elf_exe, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path / "cache"))
    packed = tmp_path / "t.slim.xz"
    write_slim(elf_exe, packed, with_text=True)
    first = Image(packed)
    fresh = first.symbols
    assert list((tmp_path / "cache" / "symbols").iterdir())
    assert list((tmp_path / "cache" / "images").iterdir())
    again = Image(packed)
    cached = again.symbols
    assert isinstance(again._file, io.BufferedReader)  # the unpacked copy, not a fresh decompression
    assert (cached.names, cached.addrs, cached.ends) == (fresh.names, fresh.addrs, fresh.ends)
    assert cached.address("caller") == fresh.address("caller")
    assert again.text(fresh.address("caller"), 8) == first.text(fresh.address("caller"), 8)


def test_slim_keeps_btf(elf_exe, tmp_path):
    from tests.core.test_btf import _blob

    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("no objcopy to add a .BTF section")
    (tmp_path / "btf").write_bytes(_blob())
    with_btf = tmp_path / "t.btf"
    subprocess.run([objcopy, "--add-section", f".BTF={tmp_path / 'btf'}", "--set-section-flags", ".BTF=alloc,readonly",
                    str(elf_exe), str(with_btf)], check=True)
    plain = Image(elf_exe)
    assert plain.btf is None and "no .BTF" in plain.btf_problem
    write_slim(with_btf, tmp_path / "t.slim.xz")
    slim = Image(tmp_path / "t.slim.xz")
    assert slim.btf is not None and slim.btf.offsetof("outer", "in.b") == 8
