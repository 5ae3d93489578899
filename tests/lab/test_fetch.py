"""Offline parts of the kernel fetcher, on apt and dpkg-deb output recorded from Debian's archive."""

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from unwind.lab.fetch import (WANTED_BUSYBOX, FetchError, build_id, canonical_arch, deb_file_name,
                              extract_roles, fetch, find_kernel, kernel_packages, newest_in_suite,
                              parse_depends, parse_madison, release_from_depends, suite_archives,
                              wanted_debug_members, wanted_members)

APT = Path(__file__).parent / "data" / "apt"
needs_dpkg = pytest.mark.skipif(shutil.which("dpkg") is None, reason="version order is dpkg's")


def test_arch_spellings() -> None:
    assert canonical_arch("amd64") == "x86_64"
    assert canonical_arch("aarch64") == "arm64"
    assert canonical_arch("riscv64") == "riscv"
    with pytest.raises(FetchError, match="unknown arch 'sparc'"):
        canonical_arch("sparc")


def test_bad_suite_is_refused_before_any_apt_call() -> None:
    with pytest.raises(FetchError, match="bad suite name"):
        fetch("arm64", "trixie; rm -rf /")
    with pytest.raises(FetchError, match="bad kernel release"):
        fetch("arm64", "trixie", "6.1 && reboot")


def test_build_id_of_an_elf() -> None:
    ls = shutil.which("ls")
    bid = build_id(ls)
    assert len(bid) in (0, 40) and all(c in "0123456789abcdef" for c in bid)


def test_madison_lines_give_version_and_archive() -> None:
    entries = parse_madison((APT / "madison-linux-image-amd64.txt").read_text())
    assert entries == [("7.2.13-1", "sid"), ("6.12.117-1", "trixie"), ("6.1.192-3", "bookworm-security"),
                       ("6.1.176-1", "bookworm")]


def test_a_suite_includes_its_security_and_updates_archives() -> None:
    assert {"bookworm", "bookworm-security", "bookworm-updates"} <= suite_archives("bookworm")
    assert "unstable" in suite_archives("sid")
    assert "trixie" not in suite_archives("bookworm")


@needs_dpkg
def test_bookworm_takes_the_security_kernel_and_each_suite_its_own() -> None:
    entries = parse_madison((APT / "madison-linux-image-amd64.txt").read_text())
    assert newest_in_suite(entries, "bookworm") == "6.1.192-3"
    assert newest_in_suite(entries, "trixie") == "6.12.117-1"
    assert newest_in_suite(entries, "sid") == "7.2.13-1"
    assert newest_in_suite(parse_madison((APT / "madison-linux-image-riscv64.txt").read_text()), "bookworm") is None


@needs_dpkg
def test_newest_is_debian_version_order_not_name_order() -> None:
    # by name "6.9" > "6.12" and "1:1.35" < "1.38"; dpkg says otherwise
    assert newest_in_suite([("6.12.1-1", "sid"), ("6.9.12-1", "sid")], "sid") == "6.12.1-1"
    assert newest_in_suite([("1:1.35.0-4", "sid"), ("1.38.0-3", "sid")], "sid") == "1:1.35.0-4"
    assert newest_in_suite([("6.12~rc1-1", "sid"), ("6.12-1", "sid")], "sid") == "6.12-1"


@needs_dpkg
def test_busybox_is_per_suite_and_cached_under_its_version() -> None:
    entries = parse_madison((APT / "madison-busybox-static-arm64.txt").read_text())
    versions = {s: newest_in_suite(entries, s) for s in ("bookworm", "trixie", "sid")}
    assert versions == {"bookworm": "1:1.35.0-4+deb12u1+b1", "trixie": "1:1.37.0-6+b9", "sid": "1:1.38.0-3+b1"}
    names = {deb_file_name("busybox-static", v, "arm64") for v in versions.values()}
    assert len(names) == 3
    assert deb_file_name("busybox-static", versions["trixie"], "arm64") == "busybox-static_1%3a1.37.0-6+b9_arm64.deb"


def _show(package: str, version: str) -> str:
    for block in (APT / "show-kernels.txt").read_text().split("\n\n"):
        if f"Package: {package}\n" in block and f"Version: {version}\n" in block:
            return block
    raise AssertionError(f"{package} {version} not recorded")


def test_release_and_packages_of_sid_split_kernel() -> None:
    meta = parse_depends(_show("linux-image-riscv64", "7.2.13-1"))
    release = release_from_depends(meta, "riscv64")
    assert release == "7.2.13+deb14-riscv64"
    image = parse_depends(_show(f"linux-image-{release}", "7.2.13-1"))
    assert kernel_packages(release, image) == [f"linux-base-{release}", f"linux-binary-{release}",
                                               f"linux-modules-{release}", f"linux-image-{release}"]


def test_release_and_packages_of_bookworm_kernel() -> None:
    release = release_from_depends(parse_depends(_show("linux-image-amd64", "6.1.192-3")), "amd64")
    assert release == "6.1.0-57-amd64"
    # its Depends name linux-base (the tools), not linux-base-<release>
    assert kernel_packages(release, parse_depends(_show(f"linux-image-{release}", "6.1.192-3"))) == \
        [f"linux-image-{release}"]


def _tar_from_listing(listing: str, drop: str | None = None) -> io.BytesIO:
    """A tar with the members of a ``dpkg-deb -c`` listing, each file holding its own name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for line in listing.splitlines():
            m = re.match(r"(\S)\S+ \S+ +\d+ \S+ \S+ (\S+)(?: -> (\S+))?$", line)
            if not m or (drop and m.group(2) == drop):
                continue
            info = tarfile.TarInfo(m.group(2))
            if m.group(1) == "l":
                info.type, info.linkname = tarfile.SYMTYPE, m.group(3)
                tar.addfile(info)
            elif m.group(1) == "-":
                data = m.group(2).encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def test_sid_boot_image_and_config_come_from_usr_lib_modules(tmp_path) -> None:
    r = "7.2.13+deb14-riscv64"
    wanted = wanted_members(r)
    base = _tar_from_listing((APT / f"contents-linux-base-{r}.txt").read_text())
    found, links = extract_roles(base, wanted, tmp_path)
    assert set(found) == {"config"} and not links
    assert found["config"].read_bytes() == f"./usr/lib/modules/{r}/config".encode()
    binary = _tar_from_listing((APT / f"contents-linux-binary-{r}.txt").read_text())
    found, _ = extract_roles(binary, {"boot-image": wanted["boot-image"]}, tmp_path)
    assert found["boot-image"].read_bytes() == f"./usr/lib/modules/{r}/vmlinuz".encode()


def test_sid_debug_vmlinux_is_the_file_behind_the_boot_symlink(tmp_path) -> None:
    r = "7.2.13+deb14-riscv64"
    listing = (APT / f"contents-linux-image-{r}-dbg.txt").read_text()
    assert f"./usr/lib/debug/boot/vmlinux-{r} -> ../lib/modules/{r}/vmlinux" in listing
    found, links = extract_roles(_tar_from_listing(listing), wanted_debug_members(r), tmp_path)
    assert found["vmlinux"].read_bytes() == f"./usr/lib/debug/lib/modules/{r}/vmlinux".encode()
    assert found["System.map"].read_bytes() == f"./usr/lib/debug/lib/modules/{r}/System.map".encode()
    assert not links


def test_a_symlink_met_first_is_followed_in_the_same_pass(tmp_path) -> None:
    listing = ("lrwxrwxrwx root/root 0 2026-10-28 15:01 ./bin/busybox -> ../opt/bb/busybox\n"
               "-rwxr-xr-x root/root 9 2026-10-28 15:01 ./opt/bb/busybox\n")
    found, links = extract_roles(_tar_from_listing(listing), WANTED_BUSYBOX, tmp_path)
    assert found["busybox"].read_bytes() == b"./opt/bb/busybox" and not links


def test_a_symlink_whose_target_was_passed_asks_for_a_second_pass(tmp_path) -> None:
    listing = ("-rwxr-xr-x root/root 9 2026-10-28 15:01 ./opt/bb/busybox\n"
               "lrwxrwxrwx root/root 0 2026-10-28 15:01 ./usr/bin/busybox -> /opt/bb/busybox\n")
    found, links = extract_roles(_tar_from_listing(listing), WANTED_BUSYBOX, tmp_path)
    assert not found and links == {"busybox": "./opt/bb/busybox"}


def _fake_kernel(cache: Path, release: str, version: str, arch: str = "x86_64") -> None:
    d = cache / "kernels" / release
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({"arch": arch, "release": release, "version": version}))


@needs_dpkg
def test_find_kernel_takes_the_newest_version(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path))
    _fake_kernel(tmp_path, "6.9.12-amd64", "6.9.12-1")
    _fake_kernel(tmp_path, "6.12.117+deb13-amd64", "6.12.117-1")
    _fake_kernel(tmp_path, "7.2.13+deb14-arm64", "7.2.13-1", "arm64")
    assert find_kernel("x86_64").release == "6.12.117+deb13-amd64"
    assert find_kernel("x86_64", "6.9.12-amd64").release == "6.9.12-amd64"
    with pytest.raises(FetchError, match="no fetched kernel for riscv"):
        find_kernel("riscv")


@needs_dpkg
def test_find_kernel_keeps_flavours_apart(tmp_path, monkeypatch) -> None:
    """The 16K-page kernel of a release is another kernel: picked only by its flavour or its release."""
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path))
    _fake_kernel(tmp_path, "6.12.117+deb13-arm64", "6.12.117-1", "arm64")
    _fake_kernel(tmp_path, "6.12.117+deb13-arm64-16k", "6.12.117-1", "arm64")
    _fake_kernel(tmp_path, "6.1.0-57-arm64", "6.1.192-3", "arm64")
    assert find_kernel("arm64").release == "6.12.117+deb13-arm64"
    assert find_kernel("arm64", flavour="arm64").release == "6.12.117+deb13-arm64"
    assert find_kernel("arm64", flavour="arm64-16k").release == "6.12.117+deb13-arm64-16k"
    assert find_kernel("arm64", "6.12.117+deb13-arm64-16k").flavour == "arm64-16k"
    assert find_kernel("arm64", "6.1.0-57-arm64").flavour == "arm64"
    (tmp_path / "kernels" / "6.12.117+deb13-arm64-16k" / "kernel.json").unlink()
    with pytest.raises(FetchError, match="no fetched kernel for arm64 --flavour arm64-16k in .*; run: unwind "
                                         "kernels fetch --arch arm64 --flavour arm64-16k$"):
        find_kernel("arm64", flavour="arm64-16k")


def test_unknown_or_mismatched_flavour_is_refused_before_any_apt_call() -> None:
    with pytest.raises(FetchError, match="unknown arm64 kernel flavour 'arm64-4m'; expected one of arm64, arm64-16k"):
        fetch("arm64", "trixie", flavour="arm64-4m")
    with pytest.raises(FetchError, match="unknown x86_64 kernel flavour 'arm64-16k'"):
        fetch("x86_64", "trixie", flavour="arm64-16k")
    with pytest.raises(FetchError, match="6.12.117\\+deb13-arm64 is not of flavour arm64-16k"):
        fetch("arm64", "trixie", "6.12.117+deb13-arm64", flavour="arm64-16k")


def test_cli_flavour_error_is_one_line(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "unwind", "lab", "boot", "--arch", "arm64", "--flavour", "arm64-4m"],
                       capture_output=True, text=True, env={"UNWIND_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["unwind: error: unknown arm64 kernel flavour 'arm64-4m'; "
                                             "expected one of arm64, arm64-16k"]


def test_fetch_help_states_the_host_changes() -> None:
    r = subprocess.run([sys.executable, "-m", "unwind", "kernels", "fetch", "--help"], capture_output=True, text=True)
    out = " ".join(r.stdout.split())
    assert r.returncode == 0
    for change in ("dpkg --add-architecture", "/etc/apt/sources.list.d/unwind-SUITE.sources",
                   "/etc/apt/preferences.d/unwind-SUITE", "apt-get install", "bookworm-security"):
        assert change in out, change
