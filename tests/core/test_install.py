"""Both install modes ship the arch backends as unwind.arch.*, and the console script works.

The nested venv sees only what the environment running the tests has (the venv the README's
command installed into): not the base interpreter's site-packages. Build tools and runtime
dependencies come from that environment through a path entry, so the test needs no index and
nothing installed by hand; ``setuptools`` and ``wheel`` are in the ``test`` extra for this.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DUMP = ROOT / "corpora" / "x86_64" / "6.12.117+deb13-amd64" / "stop-004-random.bin.xz"
#: the README's library example, on an absolute path
README_EXAMPLE = """
from unwind import Options, Session
s = Session.load({dump!r})
for task in s.select():
    r = s.replay(task, Options(record=True))
    print(task.describe(), r.stop)
    for f in r.frames:
        print(f.symbol, f.source.value, f.stack or '-', f.flags.letters())
"""
PROBE = ("import unwind, unwind.arch.arm64, unwind.arch.x86_64, unwind.arch.riscv; "
         "from unwind.core import registry; print(sorted(registry.backends()))")


def _nested_venv(env_dir: Path) -> Path:
    """A venv without the base interpreter's packages that can import this environment's."""
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # A plain path line: appended to sys.path after the nested site-packages, and the .pth files
    # in it (this checkout's own editable install) are not run.
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(purelib) / "outer-env.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    return py


@pytest.mark.parametrize("editable", [False, True], ids=["pip-install", "pip-install-e"])
def test_install_imports_arch_backends(tmp_path, editable):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "corpora", "*.egg-info", "build",
                                                             "__pycache__", ".pytest_cache", ".benchmarks"))
    env_dir = tmp_path / "venv"
    py = _nested_venv(env_dir)
    cmd = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           *(["-e"] if editable else []), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['arm64', 'riscv', 'x86_64']"
    where = subprocess.run([str(py), "-c", "import unwind.arch.arm64 as m; print(m.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert where.startswith(str(src)) == editable
    assert where.startswith(str(env_dir)) != editable
    script = env_dir / "bin" / "unwind"
    assert subprocess.run([str(script), "--help"], capture_output=True).returncode == 0
    # from the checkout's root its unwind/ is imported, not the installed one: it finds arch/ beside it
    here = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, cwd=src)
    assert here.returncode == 0, here.stderr
    assert here.stdout.strip() == "['arm64', 'riscv', 'x86_64']"
    for argv in ([str(py), "-c", README_EXAMPLE.format(dump=str(DUMP))], [str(py), "-m", "unwind", "replay", str(DUMP)]):
        for cwd in (src, tmp_path):
            run = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
            assert run.returncode == 0 and "on cpu0" in run.stdout, (argv, cwd, run.stderr)


def test_no_backend_says_where_it_looked(tmp_path):
    """A copy of unwind/ with no arch/ anywhere: the error names the module it looked for, and where."""
    shutil.copytree(ROOT / "unwind", tmp_path / "unwind", ignore=shutil.ignore_patterns("__pycache__"))
    py = _nested_venv(tmp_path / "venv")
    run = subprocess.run([str(py), "-m", "unwind", "replay", str(DUMP)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 2
    assert "unknown machine 62 (no backend for ELF machine 62: no arch backend was found: module unwind.arch" in run.stderr
    assert str(tmp_path / "unwind") in run.stderr and str(tmp_path / "arch") in run.stderr
