"""Offline parts of ``unwind lab boot``: the QEMU command line, the /init, reuse of a running guest."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from unwind.lab.boot import (BootOptions, LabError, boot, build_initramfs, init_script, parse_mem,
                             qemu_command, running_differs)
from unwind.lab.fetch import Kernel


def _kernel(tmp_path: Path, arch: str = "x86_64", release: str = "6.1.0-57-amd64") -> Kernel:
    root = tmp_path / "kernels" / release
    root.mkdir(parents=True, exist_ok=True)
    (root / "kernel.json").write_text(json.dumps({"arch": arch, "release": release, "version": "6.1.192-3"}))
    (root / "busybox").write_bytes(b"\x7fELF busybox")
    return Kernel(arch, release, root)


@pytest.mark.parametrize("arch", ["x86_64", "arm64", "riscv"])
def test_printed_command_pastes_back_to_the_same_words(tmp_path, arch) -> None:
    k = _kernel(tmp_path, arch)
    opts = BootOptions(mem="384M", append="ftrace=function foo='a b'", qemu_args=("-cpu", "max,x=on"))
    cmd = qemu_command(k, tmp_path / "run dir", tmp_path / "initrd.gz", 1234, opts)
    assert shlex.split(shlex.join(cmd)) == cmd
    append = cmd[cmd.index("-append") + 1]
    assert append.startswith("console=tty") and append.endswith("ftrace=function foo='a b'")
    assert cmd[cmd.index("-m") + 1] == "384M"
    assert cmd[-2:] == ["-cpu", "max,x=on"]


def test_mem_sizes() -> None:
    assert parse_mem("512M") == "512M" and parse_mem("1G") == "1G" and parse_mem("768") == "768"
    for bad in ("", "1T", "-1G", "512 M", "1G; rm"):
        with pytest.raises(LabError, match="bad --mem"):
            parse_mem(bad)


def test_init_tracing_is_optional() -> None:
    full = init_script()
    assert "function_graph > $T/current_tracer" in full and "kprobe_events" in full
    plain = init_script(fgraph=False, kretprobe=False)
    assert "current_tracer" not in plain and "kprobe_events" not in plain and "UNWIND-LAB-READY" in plain
    assert "kprobe_events" in init_script(fgraph=False) and "current_tracer" not in init_script(fgraph=False)


def test_initramfs_takes_a_user_init(tmp_path, initramfs_members) -> None:
    k = _kernel(tmp_path)
    mine = tmp_path / "my-init"
    mine.write_text("#!/bin/busybox sh\necho UNWIND-LAB-READY\nexec sh\n")
    out = build_initramfs(k, tmp_path / "initrd.gz", BootOptions(init=str(mine)))
    members = initramfs_members(out)
    assert members["init"] == (mine.read_bytes(), 0o100755)
    assert members["bin/busybox"] == (b"\x7fELF busybox", 0o100755)
    assert members["sys/kernel/tracing"][1] == 0o40755
    with pytest.raises(LabError, match="cannot read --init"):
        build_initramfs(k, tmp_path / "initrd.gz", BootOptions(init=str(tmp_path / "missing")))


def _running(tmp_path: Path, monkeypatch, release: str, opts: BootOptions) -> None:
    """A lab.json for a live process (this test's own pid) running ``release``."""
    monkeypatch.setenv("UNWIND_CACHE", str(tmp_path))
    run = tmp_path / "run" / "x86_64"
    run.mkdir(parents=True)
    (run / "lab.json").write_text(json.dumps({"arch": "x86_64", "release": release, "pid": os.getpid(),
                                              "options": opts.to_json()}))


def test_running_guest_of_another_release_is_refused(tmp_path, monkeypatch) -> None:
    _running(tmp_path, monkeypatch, "6.12.117+deb13-amd64", BootOptions())
    k = _kernel(tmp_path)
    with pytest.raises(LabError, match=r"runs 6\.12\.117\+deb13-amd64, not 6\.1\.0-57-amd64.*--restart"):
        boot(k)


def test_running_guest_with_other_options_is_refused_and_same_one_reused(tmp_path, monkeypatch) -> None:
    _running(tmp_path, monkeypatch, "6.1.0-57-amd64", BootOptions(mem="512M"))
    k = _kernel(tmp_path)
    with pytest.raises(LabError, match="other options"):
        boot(k, BootOptions(mem="1G"))
    assert boot(k, BootOptions(mem="512M"))["pid"] == os.getpid()


def test_running_differs_reasons(tmp_path) -> None:
    k = _kernel(tmp_path)
    st = {"release": k.release, "options": BootOptions().to_json()}
    assert running_differs(st, k, BootOptions()) == ""
    assert running_differs(st, k, BootOptions(fgraph=False)) == "was booted with other options"
    assert "not 6.1.0-57-amd64" in running_differs({**st, "release": "7.2.13+deb14-amd64"}, k, BootOptions())


def test_cli_refuses_in_one_line(tmp_path, monkeypatch) -> None:
    _running(tmp_path, monkeypatch, "6.12.117+deb13-amd64", BootOptions())
    _kernel(tmp_path)
    r = subprocess.run([sys.executable, "-m", "unwind", "lab", "boot", "--arch", "x86_64", "--release",
                        "6.1.0-57-amd64"], capture_output=True, text=True, env={**os.environ})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--restart" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "unwind", "lab", "boot", "--arch", "x86_64", "--mem", "lots"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bad --mem" in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, "-m", "unwind", "lab", "boot", "--arch", "x86_64", "--qemu-args", "'open"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bad --qemu-args" in r.stderr and r.stderr.count("\n") == 1


def test_kaslr_guest_boots_without_nokaslr_and_is_another_guest(tmp_path) -> None:
    k = _kernel(tmp_path)
    words = {o.kaslr: qemu_command(k, tmp_path, tmp_path / "initrd.gz", 1234, o)[-1].split()
             for o in (BootOptions(), BootOptions(kaslr=True))}
    assert "nokaslr" in words[False] and "nokaslr" not in words[True]
    assert "kaslr" not in BootOptions().to_json()  # a guest booted before the option is the same guest
    assert BootOptions(kaslr=True).to_json()["kaslr"] is True


def test_fill_fills_a_tmpfs_of_that_size_before_ready(tmp_path, initramfs_members) -> None:
    script = init_script(fill=3584)
    assert "mount -t tmpfs -o size=3584m fill /fill" in script
    assert script.index("/fill/seed") < script.index("UNWIND-LAB-READY")
    assert "/fill" not in init_script()
    k = _kernel(tmp_path)
    out = build_initramfs(k, tmp_path / "initrd.gz", BootOptions(mem="4G", fill=3584))
    assert b"size=3584m" in initramfs_members(out)["init"][0]
    cmd = qemu_command(k, tmp_path, tmp_path / "initrd.gz", 1234, BootOptions(mem="4G", fill=3584))
    assert cmd[cmd.index("-m") + 1] == "4G"
    assert "fill" not in BootOptions().to_json()  # a guest booted before the option is the same guest
    assert running_differs({"release": k.release, "options": BootOptions().to_json()}, k, BootOptions(fill=64))


def test_cli_fill_reaches_the_boot_options(tmp_path, monkeypatch) -> None:
    from unwind.cli.main import main
    from unwind.lab import cli

    seen = []
    monkeypatch.setattr(cli, "find_kernel", lambda arch, release, flavour=None: _kernel(tmp_path))
    monkeypatch.setattr(cli, "boot", lambda k, opts, **kw: seen.append(opts) or {
        "arch": k.arch, "release": k.release, "pid": 1, "gdb": "", "monitor": "", "console": "", "console_log": ""})
    assert main(["lab", "boot", "--arch", "x86_64", "--mem", "4G", "--fill", "3584"]) == 0
    assert seen == [BootOptions(mem="4G", fill=3584)]
    with pytest.raises(SystemExit):
        main(["lab", "boot", "--arch", "x86_64", "--fill", "3G"])
