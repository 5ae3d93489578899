"""``benches/batch_threshold.py`` runs on the committed corpora: each group size's batch and loop walk the same
frames (the child asserts it), and the table prints their ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_threshold_script_times_a_batch_and_a_loop_of_each_group_size(tmp_path: Path) -> None:
    out = tmp_path / "threshold.json"
    done = subprocess.run([sys.executable, str(ROOT / "benches" / "batch_threshold.py"), "--arch", "riscv", "--rounds",
                           "1", "--sizes", "1", "3", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run = json.loads(out.read_text())["riscv"]
    for k in ("1", "3"):
        assert run[k]["frames"] > 0 and run[k]["batch"] > 0 and run[k]["loop"] > 0
        assert run[k]["groups"] == run["dumps"] // int(k)
        ratio = run[k]["batch"] / run[k]["loop"]
        assert f"| {k} ({run[k]['tasks']}) | {ratio:.2f} |" in done.stdout
