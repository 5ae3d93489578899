"""Fleet triage: signatures, buckets checked against a plain replay loop and the kernel's traces, engines."""

from __future__ import annotations

import fnmatch
import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from unwind import Options, Session
from unwind.cli.main import main
from unwind.core.frame import Flag
from unwind.cli.triage import SkipTable, bucket, compare, function_name, signature

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
DUMPS = sorted(str(p) for p in CORPORA.glob("*/*/stop-*.bin.xz"))
#: a few dumps per arch: enough to exercise every engine without slowing the suite
SOME = [p for arch in ("x86_64", "arm64", "riscv") for p in [d for d in DUMPS if f"/{arch}/" in d][:3]]
SKIP_JSON = Path(__file__).resolve().parents[2] / "unwind" / "cli" / "triage_skip.json"


def test_function_name_drops_offsets_keeps_module() -> None:
    assert function_name("__schedule+0x398/0xf10") == "__schedule"
    assert function_name("read_zero+0x4/0x10 [mem]") == "read_zero [mem]"
    assert function_name("0xffff800080f4c1b4") == "0xffff800080f4c1b4"


def test_signature_skips_leading_plumbing_only() -> None:
    skip = SkipTable({"common": ("schedule", "__schedule", "mutex_lock*"), "arm64": ("__switch_to",)})
    names = ["__switch_to", "__schedule", "schedule", "mutex_lock_killable", "pipe_read", "schedule", "vfs_read"]
    assert signature("arm64", names, skip, 3) == ("pipe_read", "schedule", "vfs_read")
    # another arch's context switch is not skipped
    assert signature("riscv", names, skip, 2) == ("__switch_to", "__schedule")
    # a stack of nothing but plumbing keeps its frames rather than an empty signature
    assert signature("arm64", ["__switch_to", "schedule"], skip, 6) == ("__switch_to", "schedule")


def _independent_buckets(paths: list[str], depth: int) -> tuple[Counter[tuple], Counter[tuple]]:
    """Tasks and dumps per bucket by a plain loop over Session.replay, the skip table read here with fnmatch."""
    table = json.loads(SKIP_JSON.read_text())
    tasks: Counter[tuple] = Counter()
    dumps: Counter[tuple] = Counter()
    for p in paths:
        s = Session.load(p)
        pats = table["common"] + table[s.backend.name]
        seen = set()
        for task in s.select(every=True):
            r = s.replay(task, Options())
            names = [re.sub(r"\+0x[0-9a-f]+/0x[0-9a-f]+", "", f.symbol) for f in r.frames
                     if not f.flags & Flag.UNRELIABLE]
            k = 0
            while k < len(names) and any(fnmatch.fnmatchcase(names[k], pat) for pat in pats):
                k += 1
            sig = tuple((names[k:] or names)[:depth])
            key = ("running" if task.running else "blocked", "R" if task.running else task.state, sig)
            tasks[key] += 1
            seen.add(key)
        dumps.update(seen)
    return tasks, dumps


def test_buckets_equal_a_plain_replay_loop_on_every_corpus_dump() -> None:
    t = bucket(DUMPS, workers=1, depth=5)
    tasks, dumps = _independent_buckets(DUMPS, 5)
    assert Counter({b.key: b.tasks for b in t.buckets()}) == tasks
    assert Counter({b.key: b.dumps for b in t.buckets()}) == dumps
    assert sum(tasks.values()) == t.to_json()["tasks"] > 6000


def _oracle_names(text: str) -> list[str]:
    """Function names of the kernel's own sysrq-t trace lines (``?`` lines are not part of the trace)."""
    out = []
    for line in text.splitlines():
        # x86/arm64 " func+0x1/0x2 [mod]"; riscv "[<ffffffff80a7854c>] func+0x1/0x2"
        m = re.match(r"^\s*(?:\[<[0-9a-f]+>\] )?([^\s?]\S*)\+0x[0-9a-f]+/0x[0-9a-f]+( \[\S+\])?$", line)
        if m:
            out.append(m.group(1) + (m.group(2) or ""))
    return out


def test_blocked_task_signatures_equal_the_kernels_own_trace() -> None:
    """The signature of each blocked task with a sysrq-t oracle, taken from the kernel's printed text."""
    skip = SkipTable.load()
    checked = 0
    for p in SOME:
        s = Session.load(p)
        for o in s.dump.oracles():
            if o.get("source") != "sysrq-t":
                continue
            task = next(t for t in s.dump.tasks() if t.pid == o["pid"])
            r = s.replay(task, Options())
            replayed = [function_name(f.symbol) for f in r.frames if not f.flags & Flag.UNRELIABLE]
            kernel = _oracle_names(o["text"])
            assert signature(s.backend.name, replayed, skip) == signature(s.backend.name, kernel, skip), (p, o["pid"])
            checked += 1
    assert checked > 300


def _comparable(doc: dict) -> dict:
    doc = dict(doc)
    doc.pop("seconds")
    doc.pop("options")
    return doc


def test_local_engines_give_identical_buckets() -> None:
    one = bucket(SOME, workers=1, chunk=2).to_json()
    two = bucket(SOME, workers=2, chunk=1).to_json()
    assert _comparable(one) == _comparable(two)


def test_dask_localcluster_gives_identical_buckets() -> None:
    distributed = pytest.importorskip("distributed")
    local = bucket(SOME, workers=1).to_json()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        dask = bucket(SOME, scheduler=client, chunk=1).to_json()
    assert dask["options"]["engine"] == "dask"
    assert _comparable(dask) == _comparable(local)


def test_a_dump_that_fails_is_reported_and_the_run_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_IMAGE_PATH", str(Path(SOME[0]).parent))
    good = tmp_path / "good.bin.xz"
    shutil.copy(SOME[0], good)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(Path(SOME[0]).read_bytes()[:100])
    out = tmp_path / "t.json"
    assert main(["triage", str(good), str(bad), "--workers", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dumps"]["total"] == 2 and doc["dumps"]["ok"] == 1
    [failed] = doc["dumps"]["failed"]
    assert failed["path"] == str(bad) and failed["error"].startswith("corrupt compressed dump")
    assert "failed: " in capsys.readouterr().out
    assert main(["triage", str(bad), "--workers", "1"]) == 2


def test_folders_are_searched_by_magic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_IMAGE_PATH", str(Path(SOME[0]).parent))
    (tmp_path / "sub").mkdir()
    shutil.copy(SOME[0], tmp_path / "sub" / "a.core.xz")
    (tmp_path / "notes.txt").write_text("not a dump")
    shutil.copy(next(CORPORA.glob("x86_64/*/vmlinux-*.slim.xz")), tmp_path / "image.xz")
    # gzip data whose first deflate block has the reserved type: zlib's error, not gzip's (was a traceback)
    broken = bytearray(gzip.compress(b"\x7fELF" + bytes(100), mtime=0))
    broken[10] = 0xFF
    (tmp_path / "broken.gz").write_bytes(broken)
    doc = bucket([tmp_path], workers=1).to_json()
    assert doc["dumps"]["total"] == 1 and doc["dumps"]["ok"] == 1


def _doc(rows: list[tuple[str, str, list[str], int]]) -> dict:
    from unwind.cli.triage import bucket_id
    return {"schema": 1, "dumps": {"total": 10},
            "buckets": [{"id": bucket_id((k, st, tuple(sig))), "kind": k, "state": st, "signature": sig, "tasks": n}
                        for k, st, sig, n in rows]}


def test_baseline_new_grew_shrank_vanished_by_construction() -> None:
    old = _doc([("blocked", "D", ["a"], 50), ("blocked", "S", ["b"], 50), ("running", "R", ["c"], 4)])
    new = _doc([("blocked", "D", ["a"], 80), ("blocked", "S", ["b"], 10), ("blocked", "D", ["n"], 10),
                ("running", "R", ["x"], 1)])
    cmp = compare(new, old)
    assert [r["signature"] for r in cmp["new"]] == [["x"], ["n"]]
    assert [r["signature"] for r in cmp["grew"]] == [["a"]]          # 50 % of blocked tasks -> 80 %
    assert [r["signature"] for r in cmp["shrank"]] == [["b"]]
    assert [r["signature"] for r in cmp["vanished"]] == [["c"]]
    assert cmp["grew"][0]["tasks"] == 80 and cmp["grew"][0]["baseline_tasks"] == 50


def test_cli_baseline_and_report(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    assert main(["triage", *SOME[:3], "--workers", "1", "--json", str(base)]) == 0
    out = tmp_path / "t.json"
    assert main(["triage", *SOME, "--workers", "1", "--baseline", str(base), "--json", str(out),
                 "--report", str(tmp_path / "rep")]) == 0
    doc = json.loads(out.read_text())
    x86 = {b["id"] for b in json.loads(base.read_text())["buckets"]}
    assert {r["id"] for r in doc["baseline"]["new"]} == {b["id"] for b in doc["buckets"]} - x86
    assert not doc["baseline"]["vanished"]
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| id | tasks |" in text and doc["buckets"][0]["id"] in text


def test_bad_arguments_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["triage", str(tmp_path), "--workers", "1"]) == 2
    assert main(["triage", SOME[0], "--depth", "0"]) == 2
    (tmp_path / "b.json").write_text("[1]")
    assert main(["triage", SOME[0], "--workers", "1", "--baseline", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("unwind: error: ") for e in err)
