"""``benches/batch_replay.py`` runs on the committed corpora and reports each batch's page faults beside its time,
for a process's first batch, a first batch in a process that walked a batch before, and a later one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_batch_script_reports_the_page_faults_of_a_first_a_warm_process_and_a_later_batch(tmp_path: Path) -> None:
    out = tmp_path / "batch.json"
    done = subprocess.run([sys.executable, str(ROOT / "benches" / "batch_replay.py"), "--arch", "riscv", "--rounds",
                           "1", "--passes", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(out.read_text())["ours"]["riscv"]
    faults = run["fresh_minflt"], run["next_minflt"]
    assert all(isinstance(f, int) and f >= 0 for f in faults)
    assert run["batched_frames"] > 0 and run["fresh"] > 0 and run["next"] > 0
    (warmed,) = json.loads(out.read_text())["warm_process"]["riscv"]
    assert warmed["batched_frames"] == run["batched_frames"] and warmed["fresh"] > 0
    assert f"riscv {faults[0]} / {warmed['fresh_minflt']} / {faults[1]}" in done.stdout.splitlines()[-1]
