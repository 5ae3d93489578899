"""A damaged ELF vmcore costs no more memory than the intact file: it is refused from its headers, never read
whole by the dump reader it falls back to.

Each file is a committed vmcore made large by construction: its bytes, then a sparse tail of
:data:`TAIL` bytes that no header points to (the vmcore readers never read it; a reader that reads the
file whole holds all of it). One ELF header field is then damaged as the mutated-vmcore campaign damaged
them. The peak RSS of ``unwind ps`` on each file is measured in a child process
(``getrusage(RUSAGE_CHILDREN)`` of a fresh wrapper): a memory bound, not a timing.
"""

from __future__ import annotations

import lzma
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from unwind.formats import elfcore

ROOT = Path(__file__).resolve().parents[2]
VMCORES = sorted(ROOT.glob("corpora/*/*/vmcore/*.elf.xz"))
#: the sparse tail that makes each file large (no disk blocks: it is a hole), below the largest dump the dump
#: reader takes (``MAX_DUMP_BYTES``), which it would read whole
TAIL = 200 << 20
#: what the damaged file may cost above the intact one's peak (allocator noise, a traceback's import)
SLACK = 24 << 20

#: ELF header fields damaged as the campaign did: (name, offset in Elf64_Ehdr, size, value); each makes the
#: vmcore reader refuse the file, so that it falls back to the dump reader
DAMAGE = (
    ("e_phentsize", 54, 2, 0x39),
    ("e_phoff past the end", 32, 8, 1 << 40),
    ("e_machine", 18, 2, 0x1234),
    ("e_type", 16, 2, elfcore.ET_EXEC),
)

_PEAK = """import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.stderr.write(r.stderr)
"""


def _peak(*args: str) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr) of ``python -m unwind ARGS`` in a child of a fresh process."""
    r = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "unwind", *args],
                       capture_output=True, text=True, timeout=600)
    rc, peak = map(int, r.stdout.split())
    return rc, peak, r.stderr


def _image(vmcore: Path) -> Path:
    return next(vmcore.parent.parent.glob("vmlinux-*"))


@cache
def _large(vmcore: Path, tmp: Path) -> Path:
    """``vmcore`` with a sparse tail of :data:`TAIL` bytes."""
    path = tmp / f"{vmcore.parts[-4]}-{vmcore.parts[-3]}-{vmcore.stem}.large"
    with open(path, "wb") as f:
        f.write(lzma.decompress(vmcore.read_bytes()))
        f.truncate(f.tell() + TAIL)
    return path


@cache
def _intact_peak(vmcore: Path, tmp: Path) -> int:
    rc, peak, err = _peak("ps", "--vmlinux", str(_image(vmcore)), str(_large(vmcore, tmp)))
    assert rc == 0 and "Traceback" not in err, err
    return peak


@pytest.mark.parametrize("damage", DAMAGE, ids=[d[0] for d in DAMAGE])
@pytest.mark.parametrize("vmcore", VMCORES, ids=lambda p: f"{p.parts[-4]}-{p.parts[-3]}-{p.name.split('.')[0]}")
def test_a_damaged_elf_vmcore_is_refused_without_being_read_whole(vmcore: Path, damage: tuple, tmp_path_factory
                                                                  ) -> None:
    tmp = tmp_path_factory.getbasetemp()
    large = _large(vmcore, tmp)
    intact = _intact_peak(vmcore, tmp)
    if intact >= TAIL:
        pytest.skip(f"the intact file's peak ({intact >> 20} MiB) is above the tail: the bound would not tell")
    _, at, size, value = damage
    bad = tmp_path_factory.mktemp("damaged") / large.name
    with open(large, "rb") as src, open(bad, "wb") as f:
        head = bytearray(src.read(1 << 20))
        head[at:at + size] = value.to_bytes(size, "little")
        f.write(head)
        while chunk := src.read(8 << 20):
            if chunk.count(0) == len(chunk):
                f.seek(len(chunk), 1)  # keep the tail a hole
            else:
                f.write(chunk)
        f.truncate(large.stat().st_size)
    rc, peak, err = _peak("ps", "--vmlinux", str(_image(vmcore)), str(bad))
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert peak <= intact + SLACK, (f"{peak >> 20} MiB for the damaged file, {intact >> 20} MiB for the intact "
                                    f"one ({large.stat().st_size >> 20} MiB): {err.strip()}")
