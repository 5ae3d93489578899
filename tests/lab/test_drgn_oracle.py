"""drgn oracles: stored in committed dumps, checked by the corpus tests; the command fails cleanly."""

from __future__ import annotations

from pathlib import Path

from unwind.cli.main import main
from unwind.formats.dump import Dump

CORPORA = Path(__file__).resolve().parents[2] / "corpora"


def test_missing_inputs_are_one_line_errors(tmp_path, capsys):
    rc = main(["lab", "drgn-oracle", "--vmcore", str(tmp_path / "v"), "--vmlinux", str(tmp_path / "l"),
               str(tmp_path / "d.bin.xz")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("unwind: error:")


def test_peer_stops_carry_drgn_traces_of_every_task():
    stops = sorted(CORPORA.glob("*/*/stop-*-drgn.bin.xz"))
    assert {p.parts[-3] for p in stops} == {"x86_64", "arm64"}
    for p in stops:
        d = Dump.open(p)
        drgn = [o for o in d.oracles() if o["source"] == "drgn"]
        blocked = [t for t in d.tasks() if not t.running]
        kernel_cpus = [c for c in d.cpus if c.mode == "kernel"]
        assert len(drgn) == len(blocked) + len(kernel_cpus)
        assert all(o["frames"] and "DRGN_PREFER_ORC_UNWINDER=1" in o["text"] for o in drgn)
