"""The committed real-kernel corpora are complete: enough stops, every blocked task's stack, oracles."""

from pathlib import Path

import pytest

from unwind.dump import Dump

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
FOLDERS = sorted(p for p in CORPORA.glob("*/*") if p.is_dir() and any(p.glob("stop-*.bin.xz")))


def test_every_arch_has_a_corpus() -> None:
    assert {p.parent.name for p in FOLDERS} >= {"x86_64", "arm64", "riscv"}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_folder(folder: Path) -> None:
    dumps = sorted(folder.glob("stop-*.bin.xz"))
    assert len(dumps) >= 20
    kinds = set()
    for path in dumps:
        d = Dump.open(path)
        assert d.release == folder.name
        assert (folder / f"vmlinux-{d.build_id}.slim.xz").exists()
        assert d.vmcoreinfo.get("OSRELEASE") == folder.name
        kinds.add(d.meta["capture"]["kind"].split(":")[0])
        blocked = [t for t in d.tasks() if t.cpu is None and t.context]
        assert len(blocked) >= 40
        for t in blocked:
            sp = t.context["sp"]
            top = max(s.high for s in t.stacks if s.kind == "task")
            d.memory.read(sp, top - sp)  # the whole [sp, top) was captured
        srcs = {o["source"] for o in d.oracles()}
        # every stop has the kernel's own sysrq-t, except the peer stops, which carry drgn's traces
        assert ("sysrq-t" in srcs or "drgn" in srcs) and "gdb" in srcs
    assert kinds >= {"random", "irq", "syscall-entry", "hijack", "sysrq-l"}


#: replay frames above the first pc of an ftrace stacktrace trigger's trace, per arch, with the dump taken
#: at stacktrace_trigger+0 (corpora/README.md): riscv drops the ra-held event_triggers_post_call,
#: arm64 the x30-held one and keeps trace_event_buffer_commit, which its walk skipped; x86's ORC walk
#: keeps event_triggers_post_call (trace_event_buffer_commit tail-calls it) and its walk skipped it
FTRACE_CUT = {"riscv": ["stacktrace_trigger"],
              "x86_64": ["stacktrace_trigger", "event_triggers_post_call"],
              "arm64": ["stacktrace_trigger", "trace_event_buffer_commit"]}
FTRACE_STOPS = sorted(p for f in FOLDERS for p in f.glob("stop-*-ftrace-*.bin.xz"))


@pytest.mark.parametrize("path", FTRACE_STOPS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_ftrace_stacktrace_equals_faithful_replay(path: Path) -> None:
    from unwind.replay import load_session
    from unwind.target import Options
    from unwind.tools import compare_oracle

    session = load_session(str(path))
    (oracle,) = [o for o in session.dump.oracles() if o["source"] == "ftrace-stacktrace"]
    assert oracle["stop"] == "stacktrace_trigger+0" and oracle["frames"]
    res = compare_oracle(session, oracle)
    assert res is not None and res.category == "exact", res
    (task,) = [t for t in session.dump.tasks() if t.cpu == oracle["cpu"]]
    r = session.replay(task, Options(), symbolize=True)
    cut = [f.symbol.split("+")[0] for f in r.frames[:res.cut]]
    assert cut == FTRACE_CUT[session.dump.arch]
    assert r.frames[0].symbol.endswith("+0x0/" + r.frames[0].symbol.split("/")[-1])
