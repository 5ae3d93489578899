"""The compiled build: the walk's hot modules compiled from their own source, used when built.

The modules in :data:`MODULES` are plain Python, the reference. Each has a ``.pxd`` beside it that
declares types only (which classes are extension types and the types of their fields, which functions
are C functions): Cython compiles the ``.py`` as it is, in pure-Python mode, with those declarations.
Nothing is written twice: the compiled module and the interpreted one are the same lines.

``unwind accel build`` compiles them (Cython and a C compiler; neither is needed otherwise) into a
folder named after this Python and a digest of every listed ``.py`` and ``.pxd``::

    $UNWIND_CACHE/accel/cpython-311-<digest>/unwind/core/walk.cpython-311-x86_64-linux-gnu.so ...

and ``import unwind`` then loads those modules from there (:class:`CompiledFinder`). A changed source
changes the digest, so a build is never used for source it was not made from. ``UNWIND_PURE=1`` runs
the interpreted modules even where a build exists (the test suite sets it unless given ``0``); ``UNWIND_ACCEL=DIR`` names the folder of builds
(default ``$UNWIND_CACHE/accel``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Sequence

#: the compiled modules: name -> (root, path below it without suffix); the ``unwind`` root is this
#: package's folder, the ``arch`` root the ``unwind.arch`` package's (a checkout's ``arch/``)
MODULES: dict[str, tuple[str, str]] = {
    "unwind.core.memory": ("unwind", "core/memory"),
    "unwind.core.frame": ("unwind", "core/frame"),
    "unwind.core.stackinfo": ("unwind", "core/stackinfo"),
    "unwind.core.walk": ("unwind", "core/walk"),
    "unwind.core.callsite": ("unwind", "core/callsite"),
    "unwind.core.target": ("unwind", "core/target"),
    "unwind.session.result": ("unwind", "session/result"),
    "unwind.session.batch": ("unwind", "session/batch"),
    "unwind.arch.arm64.ptrauth": ("arch", "arm64/ptrauth"),
    "unwind.arch.arm64.stacktrace": ("arch", "arm64/stacktrace"),
    "unwind.arch.arm64.batch": ("arch", "arm64/batch"),
    "unwind.arch.riscv.stacktrace": ("arch", "riscv/stacktrace"),
    "unwind.arch.riscv.batch": ("arch", "riscv/batch"),
    "unwind.arch.x86_64.dumpstack": ("arch", "x86_64/dumpstack"),
    "unwind.arch.x86_64.orc": ("arch", "x86_64/orc"),
    "unwind.arch.x86_64.unwind_orc": ("arch", "x86_64/unwind_orc"),
    "unwind.arch.x86_64.batch": ("arch", "x86_64/batch"),
}

#: Cython's settings: the hints are Python's (not C types); the types are the ``.pxd``'s alone
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": False}

PURE_ENV = "UNWIND_PURE"
ACCEL_ENV = "UNWIND_ACCEL"


class AccelError(Exception):
    """The compiled build cannot be made here; the message is one line for the user."""


def accel_root() -> Path:
    """Where builds are kept: ``$UNWIND_ACCEL``, else ``$UNWIND_CACHE/accel`` (``~/.cache/unwind/accel``)."""
    env = os.environ.get(ACCEL_ENV)
    if env:
        return Path(env)
    cache = os.environ.get("UNWIND_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "unwind") / "accel"


def _roots() -> dict[str, Path]:
    """The folders the module paths are relative to."""
    unwind_dir = Path(__file__).resolve().parent
    arch = sys.modules.get("unwind.arch")
    if arch is not None:
        arch_dir = Path(list(arch.__path__)[0])
    else:
        spec = importlib.util.find_spec("unwind.arch")
        if spec is None or not spec.submodule_search_locations:
            raise AccelError("the unwind.arch package is not found")
        arch_dir = Path(list(spec.submodule_search_locations)[0])
    return {"unwind": unwind_dir, "arch": arch_dir}


def sources() -> dict[str, Path]:
    """Every file a build is made from, by its path in the package (``unwind/arch/arm64/stacktrace.pxd``)."""
    roots = _roots()
    out: dict[str, Path] = {}
    for name, (root, rel) in MODULES.items():
        package_path = name.replace(".", "/")
        for suffix in (".py", ".pxd"):
            path = roots[root] / (rel + suffix)
            if suffix == ".py" or path.is_file():
                out[package_path + suffix] = path
    return out


def build_dir() -> Path:
    """The folder of the build of the current sources (and :data:`DIRECTIVES`) for this Python, whether or
    not it exists."""
    import hashlib

    h = hashlib.sha256(repr(sorted(DIRECTIVES.items())).encode())
    for key, path in sorted(sources().items()):
        h.update(key.encode() + b"\0" + path.read_bytes() + b"\0")
    return accel_root() / f"{sys.implementation.cache_tag}-{h.hexdigest()[:16]}"


def _module_file(folder: Path, name: str) -> Path | None:
    """The extension module of ``name`` in a build folder."""
    base = folder / name.replace(".", "/")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + suffix)
        if path.is_file():
            return path
    return None


class CompiledFinder:
    """A meta-path finder that serves :data:`MODULES` from the build of the current sources, if one is made.

    The build folder is looked up when the first listed module is imported (after ``unwind`` itself),
    and only if the folder of builds exists; a module the build lacks is imported from its source."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder: Path | None = None
        self.looked = False

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        """The spec of the compiled module ``name``, or ``None`` (the next finder imports the source)."""
        if name not in MODULES:
            return None
        if not self.looked:
            self.looked = True
            try:
                folder = build_dir()
            except (AccelError, OSError):
                folder = None
            self.folder = folder if folder is not None and folder.is_dir() else None
        if self.folder is None:
            return None
        file = _module_file(self.folder, name)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(name, file)


def install() -> None:
    """Put :class:`CompiledFinder` first on ``sys.meta_path`` when a folder of builds exists (and
    ``UNWIND_PURE`` is not set); called by ``import unwind``."""
    if os.environ.get(PURE_ENV, "") not in ("", "0") or any(isinstance(f, CompiledFinder) for f in sys.meta_path):
        return
    root = accel_root()
    if root.is_dir():
        sys.meta_path.insert(0, CompiledFinder(root))  # type: ignore[arg-type]


def status() -> dict[str, str]:
    """Each listed module and the file it runs from (importing it): a ``.so`` when compiled."""
    out = {}
    for name in MODULES:
        module = importlib.import_module(name)
        out[name] = str(getattr(module, "__file__", "?"))
    return out


def compiled() -> bool:
    """True when every listed module runs compiled."""
    return all(not f.endswith(".py") for f in status().values())


def build(jobs: int = 0) -> Path:
    """Compile :data:`MODULES` into :func:`build_dir` (a no-op when it exists) and return it.

    :class:`AccelError` when Cython or a C compiler is missing, or the compiler fails."""
    import shutil
    import tempfile

    folder = build_dir()
    if folder.is_dir():
        return folder
    try:
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
    except ImportError as e:
        raise AccelError(f"the compiled build needs Cython and setuptools (pip install cython): {e}") from None
    compiler = (os.environ.get("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        raise AccelError(f"the compiled build needs a C compiler: no {compiler!r} on PATH")
    files = sources()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unwind-accel-") as tmp:
        # the sources in their package layout (Cython finds each .pxd by its module's name)
        src = Path(tmp) / "src"
        for key, path in files.items():
            dest = src / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        for package in {Path(k).parent for k in files}:
            for part in (package, *package.parents):
                if str(part) != ".":
                    (src / part / "__init__.py").touch()
        extensions = [Extension(name, [str(src / (name.replace(".", "/") + ".py"))]) for name in MODULES]
        staging = Path(tmp) / "out"
        argv = ["build_ext", "--build-lib", str(staging), "--build-temp", str(Path(tmp) / "obj")]
        if jobs:
            argv += ["--parallel", str(jobs)]
        try:
            modules = cythonize(extensions, include_path=[str(src)], compiler_directives=DIRECTIVES, quiet=True,
                                nthreads=jobs)
            dist = Distribution({"ext_modules": modules, "script_name": "unwind-accel", "script_args": argv})
            dist.parse_command_line()
            dist.run_commands()
        except (Exception, SystemExit) as e:  # Cython's CompileError, distutils' errors, a failed compiler
            raise AccelError(f"the compiled build failed: {e}") from None
        for old in folder.parent.glob(f"{sys.implementation.cache_tag}-*"):
            shutil.rmtree(old, ignore_errors=True)  # builds of older sources
        shutil.copytree(staging, Path(tmp) / "done")
        placed = folder.with_name(f".{folder.name}.{os.getpid()}")
        shutil.move(str(Path(tmp) / "done"), placed)
        try:
            placed.rename(folder)  # whole, at once: a process importing meanwhile sees no half-made build
        except OSError:  # another build of the same sources got there first
            shutil.rmtree(placed, ignore_errors=True)
    return folder
