"""Small vmcore files for ``unwind fuzz --vmcore-seeds``: every format the readers open.

``python -m tests.fuzz.vmcore_seeds DIR`` writes them; the fuzz tests write them to a
temporary folder. They come from the vmcore tests' builders (``tests/vmcore/synth.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from unwind.formats.vmcore import codecs

from ..vmcore.synth import KdumpSpec, Load, elf_vmcore, flatten, kdump_file, notes_blob, page_bytes, vmcoreinfo

RAM = set(range(24))


def seeds() -> dict[str, bytes]:
    """name -> bytes: ELF (split notes too), kdump with each codec the readers decode, flattened."""
    dumped = {p: page_bytes(p) if p % 5 else bytes(4096) for p in RAM if p != 3}
    notes = notes_blob([(1, 0), (2, 0)], 27, vmcoreinfo())
    out = {"elf": elf_vmcore([Load(0x1000, b"".join(page_bytes(p) for p in range(1, 5))),
                              Load(0x10000, page_bytes(9) * 2)], notes),
           "elf-split-notes": elf_vmcore([Load(0x1000, page_bytes(1))], notes, note_split=2)}
    for name in ("ZLIB", "LZO", "SNAPPY", "ZSTD"):
        codec = getattr(codecs, f"DUMP_DH_COMPRESSED_{name}", None)
        if codec is not None:
            out[f"kdump-{name.lower()}"] = kdump_file(KdumpSpec(max_mapnr=24, ram=RAM, dumped=dumped, codec=codec,
                                                                notes=notes))
    out["flat-kdump"] = flatten(out["kdump-zlib"], record=2048, seed=1)
    out["flat-elf"] = flatten(out["elf"], record=1024, seed=2)
    return out


def write(folder: Path) -> list[Path]:
    """Write :func:`seeds` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in seeds().items():
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    return paths


if __name__ == "__main__":
    for p in write(Path(sys.argv[1])):
        print(p, p.stat().st_size)
