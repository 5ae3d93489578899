"""The decoded real ORC table against ``objtool --dump=orc``, entry for entry (slow).

objtool comes from Debian's ``linux-kbuild`` package of the same kernel;
trixie's build needs glibc >= 2.38, so on an older host it runs under
trixie's own loader and libraries (``real-kernels.md`` §5). Everything is
fetched into the cache (``$UNWIND_CACHE`` or ``~/.cache/unwind``) once.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from unwind.arch.x86_64.orc import load_orc
from unwind.formats.image import Image

pytestmark = pytest.mark.slow


def _kernel():
    from unwind.lab.fetch import FetchError, cache_dir, find_kernel
    try:
        return find_kernel("x86_64"), cache_dir()
    except FetchError as e:
        pytest.skip(f"no amd64 debug vmlinux in the cache ({e})")


def _objtool(release: str, cache: Path) -> list[str]:
    """The objtool command: the native binary when it runs, else trixie's loader and libraries."""
    root = cache / "objtool" / "root"
    kbuild = "linux-kbuild-" + re.sub(r"-amd64$", "", release)
    found = sorted(root.glob("usr/lib/linux-kbuild-*/tools/objtool/objtool.real-x86"))
    if not found:
        (cache / "objtool").mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["apt-get", "download", kbuild, "libc6/trixie", "libelf1t64/trixie", "zlib1g/trixie"],
                           cwd=cache / "objtool", check=True, capture_output=True, timeout=600)
            for deb in (cache / "objtool").glob("*.deb"):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            pytest.skip(f"cannot fetch objtool ({kbuild}) and trixie's libc: {e}")
        found = sorted(root.glob("usr/lib/linux-kbuild-*/tools/objtool/objtool.real-x86"))
        if not found:
            pytest.skip(f"{kbuild} has no tools/objtool/objtool.real-x86")
    native = [str(found[-1])]
    if subprocess.run(native + ["--help"], capture_output=True).returncode in (0, 129):
        return native
    libs = root / "usr/lib/x86_64-linux-gnu"
    return [str(libs / "ld-linux-x86-64.so.2"), "--library-path", str(libs)] + native


def test_decoded_table_equals_objtool_dump():
    kernel, cache = _kernel()
    cmd = _objtool(kernel.release, cache) + ["--dump=orc", str(kernel.vmlinux)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-500:]
    want = out.stdout.splitlines()
    table = load_orc(Image(kernel.vmlinux), kernel.release)
    got = [f"{table.ip(i):x}:{table.entry(i)}" for i in range(len(table))]
    assert len(got) == len(want) == 450_712
    mismatches = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"
