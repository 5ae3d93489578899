"""End to end on a real kernel: fetch, boot, capture 3 stops, diff (needs network, QEMU, ~3 min)."""

import subprocess
import sys

import pytest

ARCH = "x86_64"


def _unwind(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unwind", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_fetch_boot_capture_diff(tmp_path) -> None:
    r = _unwind("kernels", "fetch", "--arch", ARCH, "--suite", "trixie")
    assert r.returncode == 0, r.stderr
    vmlinux = r.stdout.strip() + "/vmlinux"
    r = _unwind("lab", "boot", "--arch", ARCH)
    assert r.returncode == 0, r.stderr
    try:
        out = tmp_path / "dumps"
        r = _unwind("capture", "--lab", ARCH, "--stops", "3", "-o", str(out))
        assert r.returncode == 0, r.stderr
        dumps = sorted(str(p) for p in out.glob("*.bin.xz"))
        assert len(dumps) == 3
        r = _unwind("diff", "--vmlinux", vmlinux, *dumps)
        assert "sysrq-t" in r.stdout, r.stdout + r.stderr
    finally:
        _unwind("lab", "stop", "--arch", ARCH)


def test_capture_bad_input_is_one_line(tmp_path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = _unwind("capture", "--gdb", "nonsense", "--vmlinux", "/nonexistent", "-o", str(tmp_path))
    assert r.returncode == 2 and "bad --gdb" in r.stderr and "Traceback" not in r.stderr
    r = _unwind("capture", "--gdb", f"127.0.0.1:{port}", "--vmlinux", "/nonexistent", "-o", str(tmp_path))
    assert r.returncode == 2 and "cannot open vmlinux" in r.stderr and "Traceback" not in r.stderr
    r = _unwind("capture", "--gdb", f"127.0.0.1:{port}", "--vmlinux", sys.executable, "-o", str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 2 and "Traceback" not in r.stderr
    r = _unwind("kernels", "fetch", "--arch", "sparc")
    assert r.returncode == 2 and "unknown arch" in r.stderr
