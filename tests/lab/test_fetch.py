"""Offline parts of the kernel fetcher."""

import shutil

import pytest

from unwind.lab.fetch import FetchError, build_id, canonical_arch, fetch


def test_arch_spellings() -> None:
    assert canonical_arch("amd64") == "x86_64"
    assert canonical_arch("aarch64") == "arm64"
    assert canonical_arch("riscv64") == "riscv"
    with pytest.raises(FetchError, match="unknown arch 'sparc'"):
        canonical_arch("sparc")


def test_bad_suite_is_refused_before_any_apt_call() -> None:
    with pytest.raises(FetchError, match="bad suite name"):
        fetch("arm64", "trixie; rm -rf /")


def test_build_id_of_an_elf() -> None:
    ls = shutil.which("ls")
    bid = build_id(ls)
    assert len(bid) in (0, 40) and all(c in "0123456789abcdef" for c in bid)
