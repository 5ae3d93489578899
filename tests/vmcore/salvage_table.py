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


def table(got: list[tuple[str, str, float, t.Salvage]]) -> str:
    """One markdown row per vmcore and format: its tasks, and whole / partial / lost at each cut; then each
    format's share of tasks salvaged whole at 99.9 %."""
    cells: dict[tuple[str, str], dict[float, t.Salvage]] = {}
    for name, fmt, keep, s in got:
        cells.setdefault((name, fmt), {})[keep] = s
    cuts = " | ".join(f"{100 * keep:g} %" for keep in t.CUTS)
    out = [f"| vmcore | format | tasks | {cuts} |", "|---|---|---:|" + "---:|" * len(t.CUTS)]
    for (name, fmt), by_cut in cells.items():
        row = " | ".join(f"{s.whole} / {s.partial} / {s.lost}" for s in (by_cut[k] for k in t.CUTS))
        out.append(f"| {name} | {fmt} | {sum(next(iter(by_cut.values())))} | {row} |")
    out.append("")
    for fmt in t.FORMATS:
        at = [s for _, f, keep, s in got if f == fmt and keep == 0.999]
        whole, total = sum(s.whole for s in at), sum(sum(s) for s in at)
        out.append(f"- {fmt}: {whole} of {total} tasks whole at 99.9 % ({100 * whole / total:.1f} %)")
    return "\n".join(out)


def main() -> None:
    """Print the table."""
    with tempfile.TemporaryDirectory() as d:
        print(table(rows(Path(d))))


if __name__ == "__main__":
    main()
