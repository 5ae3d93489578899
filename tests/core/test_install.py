"""Both install modes ship the arch backends as unwind.arch.*, and the console script works."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import unwind, unwind.arch.arm64, unwind.arch.x86_64, unwind.arch.riscv; "
         "from unwind import registry; print(sorted(registry.backends()))")


@pytest.mark.parametrize("editable", [False, True], ids=["pip-install", "pip-install-e"])
def test_install_imports_arch_backends(tmp_path, editable):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "corpora", "*.egg-info", "build",
                                                             "__pycache__", ".pytest_cache", ".benchmarks"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    cmd = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
           "--no-build-isolation", *(["-e"] if editable else []), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    if r.returncode and "no such option: --python" in r.stderr:
        pytest.skip("pip too old for --python")
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['arm64', 'riscv', 'x86_64']"
    where = subprocess.run([str(py), "-c", "import unwind.arch.arm64 as m; print(m.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert (str(src) in where) == editable
    script = env_dir / "bin" / "unwind"
    assert subprocess.run([str(script), "--help"], capture_output=True).returncode == 0
