"""The committed real-kernel corpora are complete: enough stops, every blocked task's stack, oracles."""

from pathlib import Path

import pytest

from unwind.formats.dump import Dump

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
FOLDERS = sorted(p for p in CORPORA.glob("*/*") if p.is_dir() and any(p.glob("stop-*.bin.xz")))
#: the full trixie 6.12 corpora (every stop kind, gdb oracles); the other folders are small samples of
#: other generations (bookworm 6.1, sid 7.2): a few stops with sysrq-t only (corpora/README.md)
FULL = {"x86_64/6.12.117+deb13-amd64", "arm64/6.12.117+deb13-arm64", "riscv/6.12.117+deb13-riscv64"}
#: (arch, kernel major.minor) samples that must exist: Debian has no riscv64 6.1 (bookworm has no port)
GENERATIONS = {("x86_64", "6.1"), ("arm64", "6.1"), ("x86_64", "7.2"), ("arm64", "7.2"), ("riscv", "7.2")}


def _name(folder: Path) -> str:
    return f"{folder.parent.name}/{folder.name}"


def test_every_arch_and_generation_has_a_corpus() -> None:
    assert {_name(p) for p in FOLDERS} >= FULL
    have = {(p.parent.name, ".".join(p.name.split(".")[:2])) for p in FOLDERS}
    assert have >= GENERATIONS


def _check_dump(folder: Path, path: Path) -> tuple[str, set[str]]:
    """The invariants of every committed stop; returns its kind and oracle sources."""
    d = Dump.open(path)
    assert d.release == folder.name
    assert (folder / f"vmlinux-{d.build_id}.slim.xz").exists()
    assert d.vmcoreinfo.get("OSRELEASE") == folder.name
    blocked = [t for t in d.tasks() if not t.running and t.context]
    assert len(blocked) >= 40
    for t in blocked:
        sp = t.context["sp"]
        top = max(s.high for s in t.stacks if s.kind == "task")
        d.memory.read(sp, top - sp)  # the whole [sp, top) was captured
    return d.meta["capture"]["kind"].split(":")[0], {o["source"] for o in d.oracles()}


@pytest.mark.parametrize("folder", [f for f in FOLDERS if _name(f) in FULL], ids=_name)
def test_corpus_folder(folder: Path) -> None:
    dumps = sorted(folder.glob("stop-*.bin.xz"))
    assert len(dumps) >= 20
    kinds = set()
    for path in dumps:
        kind, srcs = _check_dump(folder, path)
        kinds.add(kind)
        # every stop has the kernel's own sysrq-t, except the peer stops, which carry drgn's traces
        assert ("sysrq-t" in srcs or "drgn" in srcs) and "gdb" in srcs
    assert kinds >= {"random", "irq", "syscall-entry", "hijack", "sysrq-l"}


@pytest.mark.parametrize("folder", [f for f in FOLDERS if _name(f) not in FULL], ids=_name)
def test_generation_sample_folder(folder: Path) -> None:
    dumps = sorted(folder.glob("stop-*.bin.xz"))
    assert len(dumps) >= 3
    kinds = set()
    for path in dumps:
        kind, srcs = _check_dump(folder, path)
        kinds.add(kind)
        assert "sysrq-t" in srcs
    assert "random" in kinds


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
    from unwind.session.replay import load_session
    from unwind.core.target import Options
    from unwind.cli.corpus import compare_oracle

    session = load_session(str(path))
    (oracle,) = [o for o in session.dump.oracles() if o["source"] == "ftrace-stacktrace"]
    assert oracle["stop"] == "stacktrace_trigger+0" and oracle["frames"]
    res = compare_oracle(session, oracle)
    assert res is not None and res.category == "exact", res
    (task,) = [t for t in session.dump.tasks() if t.running_cpu == oracle["cpu"]]
    r = session.replay(task, Options(), symbolize=True)
    cut = [f.symbol.split("+")[0] for f in r.frames[:res.cut]]
    assert cut == FTRACE_CUT[session.dump.arch]
    assert r.frames[0].symbol.endswith("+0x0/" + r.frames[0].symbol.split("/")[-1])
