"""The salvage table: every committed vmcore cut to 99.9 %, 90 % and 50 % in every format, and what each cut gives
of the uncut file's tasks (walked whole, walked in part, lost), checked as tests/vmcore/test_salvage.py checks it.

``python -m tests.vmcore.salvage_table`` prints it as markdown (docs/vmcore.md holds its output).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from . import test_salvage as t


def rows(tmp: Path) -> list[tuple[str, str, float, t.Salvage]]:
    """(vmcore, format, share kept, salvage) for every cut of every committed vmcore."""
    out = []
    for vmcore in t.VMCORES + t.MAKEDUMPFILE:
        for fmt in t._formats(vmcore):
            for keep in t.CUTS:
                out.append((t._vmcore_id(vmcore), fmt, keep, t._salvage(vmcore, fmt, keep, tmp, tmp)))
                print(*out[-1], file=sys.stderr, flush=True)
    return out


def main() -> None:
    """Print the table, and each format's share of tasks salvaged whole at 99.9 %."""
    with tempfile.TemporaryDirectory() as d:
        table = rows(Path(d))
    print("| vmcore | format | kept | tasks | whole | partial | lost |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, fmt, keep, s in table:
        print(f"| {name} | {fmt} | {100 * keep:g} % | {sum(s)} | {s.whole} | {s.partial} | {s.lost} |")
    print()
    for fmt in t.FORMATS:
        got = [s for _, f, keep, s in table if f == fmt and keep == 0.999]
        whole, total = sum(s.whole for s in got), sum(sum(s) for s in got)
        print(f"- {fmt}: {whole} of {total} tasks whole at 99.9 % ({100 * whole / total:.1f} %)")


if __name__ == "__main__":
    main()
