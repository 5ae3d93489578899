"""Speed against drgn on equal inputs: the figures, targets and report lines of the JSON that
``benches/speed_peer.py``, ``batch_replay.py``, ``startup.py`` and ``profile_replay.py`` write."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .figures import Goal, verdict
from .results import ARCH_ORDER, fmt_num, fmt_rate, md_table

#: the speed scripts ``unwind bench --speed`` runs beside the suite, and the JSON each writes into the report folder
SPEED_SCRIPTS = (("speed_peer.py", "speed_peer.json"), ("batch_replay.py", "batch_replay.json"),
                 ("startup.py", "startup.json"), ("profile_replay.py", "profile.json"))
#: single-task replay, warm, through the public API, call-site check on (µs per frame, CPU)
TARGET_WARM_US = 2.0
#: what a fresh Session may add per frame (µs)
TARGET_FRESH_EXTRA_US = 0.5
#: batch replay including set-up (frames per second)
TARGET_BATCH_FRAMES = {"arm64": 3e6, "riscv": 3e6, "x86_64": 1.5e6}
#: a warm ``unwind replay DUMP`` (wall, ms)
TARGET_STARTUP_MS = 200.0


#: the figures of a peer child (benchkit.DRGN_CHILD, OURS_PEER_CHILD) summed over an arch's vmcores
_PEER_SUMMED = ("tasks", "frames", "warm", "warm_wall", "k_tasks", "k_frames", "k_warm", "k_warm_wall", "user_frames")
#: the sides of speed_peer.py on a peer vmcore
_PEER_SIDES = ("ours", "drgn equal", "drgn dwarf")


def _median(values: Iterable[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def _per(runs: list[dict[str, Any]], key: str, count: str = "frames", scale: float = 1e6) -> float | None:
    """Median over rounds of ``key`` / ``count`` (µs per frame by default); ``None`` when a round counted nothing."""
    if not runs or any(not r.get(count) or key not in r for r in runs):
        return None
    return _median(r[key] / r[count] * scale for r in runs)


def _pair(cpu: float | None, wall: float | None) -> str:
    if cpu is None:
        return "not measured"
    return f"{fmt_num(cpu)} µs CPU" + (f" / {fmt_num(wall)} µs wall" if wall is not None else "")


def _times(x: float | None, y: float | None) -> str:
    """``x / y`` as ``N×``, or a dash."""
    return f"{fmt_num(x / y)}×" if x and y else "–"


@dataclass
class PeerArch:
    """speed_peer.py on one arch's peer vmcores: each side's rounds, summed over the vmcores."""

    arch: str
    sides: dict[str, list[dict[str, Any]]]
    #: per vmcore: the kernel pcs of ours against each drgn mode, and a few traces
    checks: dict[str, dict[str, Any]]
    left_out: dict[str, Any]

    def frame(self, side: str, wall: bool = False) -> float | None:
        """µs per kernel frame over the kernel-only tasks (no side walked a user frame of them)."""
        return _per(self.sides.get(side, []), "k_warm_wall" if wall else "k_warm", "k_frames")

    def task(self, side: str) -> float | None:
        """CPU µs per task over every task (drgn's walk on into user frames included)."""
        return _per(self.sides.get(side, []), "warm", "tasks")

    def first(self, side: str, key: str) -> Any:
        """``key`` of ``side``'s first round (counts are the same every round)."""
        runs = self.sides.get(side) or [{}]
        return runs[0].get(key, 0)


def peer_archs(peer: dict[str, Any] | None) -> dict[str, PeerArch]:
    """The peer figures of speed_peer.py's JSON, per arch."""
    out: dict[str, PeerArch] = {}
    for arch, by_core in ((peer or {}).get("peer") or {}).items():
        sides = {}
        for side in _PEER_SIDES:
            per_core = [runs.get(side, []) for runs in by_core.values()]
            n = min(map(len, per_core)) if per_core else 0
            sides[side] = [{k: sum(r[i].get(k, 0) for r in per_core) for k in _PEER_SUMMED} for i in range(n)]
        out[arch] = PeerArch(arch, sides, {c: v for c, v in (peer or {}).get("validation", {}).items() if c in by_core},
                             {c: v for c, v in (peer or {}).get("left_out", {}).items() if c in by_core})
    return out


def _single_goals(arch: str, corpus: list[dict[str, Any]], p: PeerArch | None) -> list[Goal]:
    """The single-task targets of ``arch``: warm and fresh Session, per frame."""
    fresh, warm = _per(corpus, "fresh"), _per(corpus, "warm")
    name = f"single-task warm, {arch}"
    goal = f"≤ {fmt_num(TARGET_WARM_US)} µs/frame (CPU), Session.replay, call-site check on"
    if warm is None:
        return [Goal(name, goal, "not measured", "–", "not measured: speed_peer.json has no corpus run")]
    if p is not None and p.frame("drgn equal"):
        ours, drgn = p.frame("ours"), p.frame("drgn equal")
        vs = (f"{_times(ours, drgn)} drgn's time per frame (same {p.first('ours', 'k_tasks')} tasks: ours "
              f"{fmt_num(ours or 0)}, drgn {fmt_num(drgn or 0)} µs)")
    else:
        vs = "no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured"
    goals = [Goal(name, goal, f"{_pair(warm, _per(corpus, 'warm_wall'))} ({corpus[0]['tasks']:,} tasks, "
                  f"{corpus[0]['frames']:,} frames)", f"{fmt_num(warm / TARGET_WARM_US)}× the budget",
                  verdict(warm <= TARGET_WARM_US, warm / TARGET_WARM_US), vs)]
    if fresh is not None:
        extra = fresh - warm
        goals.append(Goal(f"single-task fresh Session, {arch}", f"≤ warm + {fmt_num(TARGET_FRESH_EXTRA_US)} µs/frame",
                          f"{_pair(fresh, _per(corpus, 'fresh_wall'))}: warm + {fmt_num(extra)} µs",
                          f"{fmt_num(extra / TARGET_FRESH_EXTRA_US)}× the allowance",
                          verdict(extra <= TARGET_FRESH_EXTRA_US, extra / TARGET_FRESH_EXTRA_US),
                          "– (a drgn Program keeps nothing per task to start afresh: see the warm row)"))
    return goals


def _batch_goal(arch: str, batch: dict[str, Any] | None) -> Goal:
    """The batch target of ``arch``: frames per CPU second including set-up."""
    target = TARGET_BATCH_FRAMES[arch]
    name, goal = f"batch replay, {arch}", f"≥ {fmt_num(target / 1e6)} M frames/s (CPU) including set-up"
    b = (batch or {}).get("ours", {}).get(arch, [])
    if not b:
        return Goal(name, goal, "not measured", "–", "not measured: no batch_replay.json run")
    rate = _median(r["batched_frames"] / r["fresh"] for r in b if r.get("fresh"))
    warm_rate = _median(r["batched_frames"] / r["warm"] for r in b if r.get("warm"))
    share = b[0]["batched_tasks"] / b[0]["tasks"] if b[0]["tasks"] else 0
    peer = (batch or {}).get("peer", {})
    mine, drgn = peer.get(f"{arch} ours", []), peer.get(f"{arch} drgn", [])
    vs = "no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured"
    if mine and drgn:
        ours_rate = _per(mine, "batched_frames", "warm", 1.0)
        drgn_rate = _per(drgn, "k_frames", "k_warm", 1.0)
        vs = (f"{_times(ours_rate, drgn_rate)} drgn's frames/s (the vmcores' tasks, warm: "
              f"{fmt_rate(ours_rate or 0)} against {fmt_rate(drgn_rate or 0)})")
    return Goal(name, goal, f"{fmt_rate(rate).replace('/s', ' frames/s')} fresh (sessions just opened), "
                f"{fmt_rate(warm_rate).replace('/s', ' frames/s')} warm; {share:.0%} of {b[0]['tasks']:,} tasks "
                "in lockstep", f"{fmt_num(rate / target)}× the target", verdict(rate >= target, target / rate), vs)


def _startup_goals(start: dict[str, Any] | None) -> list[Goal]:
    """The start-up target per arch: a warm ``unwind replay DUMP``, wall."""
    goals = []
    drgn_load = {c["arch"]: c for c in (start or {}).get("commands", [])
                 if str(c.get("name", "")).startswith("drgn load") and "wall_ms" in c}
    for c in (start or {}).get("commands", []):
        if c.get("name") != "unwind replay DUMP" or "wall_ms" not in c:
            continue
        arch, wall, cpu = c["arch"], c["wall_ms"], c["cpu_ms"]
        peer_c = drgn_load.get(arch)
        vs = (f"{fmt_num(wall / peer_c['wall_ms'])}× drgn's wall ({fmt_num(peer_c['wall_ms'])} ms wall / "
              f"{fmt_num(peer_c['cpu_ms'])} ms CPU to import drgn and load the same stop + image)") if peer_c else \
            ("no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured")
        met = wall <= TARGET_STARTUP_MS and (peer_c is None or wall <= peer_c["wall_ms"])
        goals.append(Goal(f"warm `unwind replay DUMP`, {arch}", f"≤ {fmt_num(TARGET_STARTUP_MS)} ms wall and ≤ drgn's load",
                          f"{fmt_num(wall)} ms wall / {fmt_num(cpu)} ms CPU", f"{fmt_num(wall / TARGET_STARTUP_MS)}× the budget",
                          verdict(met, max(wall / TARGET_STARTUP_MS, wall / peer_c["wall_ms"] if peer_c else 0)), vs))
    return goals


def speed_goals(folder: Path) -> list[Goal]:
    """Every speed target with its measured value, from the scripts' JSON in ``folder``."""
    peer, batch, start = (_load_json(folder / n) for n in ("speed_peer.json", "batch_replay.json", "startup.json"))
    if peer is None and batch is None and start is None:
        return []
    runs = (peer or {}).get("runs", {})
    archs = peer_archs(peer)
    goals: list[Goal] = []
    for arch in ARCH_ORDER:
        goals += _single_goals(arch, runs.get(f"{arch} corpus", []), archs.get(arch))
    goals += [_batch_goal(arch, batch) for arch in ARCH_ORDER]
    return goals + _startup_goals(start)


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _peer_lines(archs: dict[str, PeerArch], rounds: Any, corpus: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The per-frame and per-task comparison with drgn, its validation and a few traces."""
    L = ["", "### Against drgn, same tasks of the same vmcores", ""]
    L.append(f"`benches/speed_peer.py`, rounds: {rounds}. drgn 0.3.0 `stack_trace` **on equal inputs**: its only "
             "kernel file is the same slim image ours reads (ELF symbols, ORC on x86-64, no CFI, no DWARF), so "
             "it unwinds by ORC on x86-64 and by frame pointers on arm64 and looks nothing up per frame; the few "
             "task layouts `stack_trace` reads are copied in from the debug vmlinux by a type finder "
             "(`benches/benchkit.py` `DRGN_CHILD`). **drgn with DWARF**: the full debug vmlinux, as a user runs "
             "it: DWARF CFI, and every frame's inline scopes looked up in `.debug_info`, which is where its "
             "time goes (with the CFI removed but `.debug_info` kept it costs the same). Ours: "
             "`Session.replay(task, Options(), symbolize=False)` with the committed slim image. Every side in "
             "fresh child processes interleaved round by round, warm (one untimed walk first), fastest of the "
             "passes per child, median over rounds.")
    L.append("")
    L.append("Frames are counted alike on both sides: real frames (not drgn's inline ones) before the first pc "
             "outside the kernel half of the address space. drgn walks on into the user frames of a task that "
             "entered from user space (on x86-64 through whatever the user stack holds, up to its 1,024-frame "
             "limit), and that time is inside its `stack_trace`: so the per-frame figures are over the "
             "**kernel-only tasks** (no side walked a user frame of them), the per-task figures over **every "
             "task**, user frames included. The tasks are those drgn walks in both modes within 64 kernel "
             "frames (drgn's DWARF unwinder loops on some arm64 stacks).")
    L.append("")
    rows = []
    for arch in (a for a in ARCH_ORDER if a in archs):
        p = archs[arch]
        rows.append((arch, f"{p.first('ours', 'k_tasks')} of {p.first('ours', 'tasks')}",
                     f"{p.first('ours', 'k_frames')} / {p.first('drgn equal', 'k_frames')}",
                     _pair(p.frame("ours"), p.frame("ours", True)),
                     _pair(p.frame("drgn equal"), p.frame("drgn equal", True)),
                     _pair(p.frame("drgn dwarf"), p.frame("drgn dwarf", True)),
                     _times(p.frame("drgn equal"), p.frame("ours")), _times(p.frame("drgn dwarf"), p.frame("ours")),
                     _pair(_per(corpus.get(f"{arch} corpus", []), "warm"), _per(corpus.get(f"{arch} corpus", []),
                                                                                  "warm_wall"))))
    L.append("Per kernel frame, kernel-only tasks (the last column: ours warm on the committed dumps, as in the "
             "targets, for how much reading a vmcore adds to ours):")
    L.append("")
    L += md_table(("arch", "tasks", "frames ours / drgn", "ours", "drgn, equal inputs (ORC / FP)",
                 "drgn, DWARF (full vmlinux)", "drgn equal ÷ ours", "drgn DWARF ÷ ours", "ours on the dumps"), rows)
    rows = []
    for arch in (a for a in ARCH_ORDER if a in archs):
        p = archs[arch]
        rows.append((arch, str(p.first("ours", "tasks")),
                     f"{p.first('ours', 'frames')} / {p.first('drgn equal', 'frames')} + "
                     f"{p.first('drgn equal', 'user_frames'):,} user",
                     *(f"{fmt_num(v)} µs" if v else "–" for v in (p.task("ours"), p.task("drgn equal"), p.task("drgn dwarf"))),
                     _times(p.task("drgn equal"), p.task("ours")), _times(p.task("drgn dwarf"), p.task("ours"))))
    L += ["", "Per task (CPU), every task:", ""]
    L += md_table(("arch", "tasks", "kernel frames ours / drgn (+ drgn's user frames)", "ours", "drgn, equal inputs",
                 "drgn, DWARF", "drgn equal ÷ ours", "drgn DWARF ÷ ours"), rows)
    L += ["", "Validation: the kernel pcs of each task, ours against drgn's (first round):", ""]
    for arch in (a for a in ARCH_ORDER if a in archs):
        for core, c in archs[arch].checks.items():
            L.append(f"- `{core}`: the same pcs as drgn on equal inputs on {c['drgn equal']['same']} of "
                     f"{c['drgn equal']['compared']} tasks, as drgn with DWARF on {c['drgn dwarf']['same']} of "
                     f"{c['drgn dwarf']['compared']}; left out: {_left_out(archs[arch].left_out.get(core))}")
    for arch in (a for a in ARCH_ORDER if a in archs):
        for core, c in archs[arch].checks.items():
            shown = c.get("samples", [])[:1] + c["drgn equal"].get("differ", [])[:1]
            for s in shown:
                L += ["", f"`{core}` task {s['task']} (pid, cpu when running): ours | drgn on equal inputs", "", "```"]
                for i in range(max(len(s["ours"]), len(s["drgn"]))):
                    L.append(f"{s['ours'][i] if i < len(s['ours']) else '':<50} "
                             f"{s['drgn'][i] if i < len(s['drgn']) else ''}".rstrip())
                L.append("```")
    return L


def _left_out(why: Any) -> str:
    if isinstance(why, dict):
        parts = [f"{n} ({k})" for k, n in why.items() if n]
        return ", ".join(parts) or "none"
    return str(why or "none")


def speed_lines(folder: Path) -> list[str]:
    """The speed headline: targets and the drgn comparison, from the scripts' JSON in ``folder``."""
    goals = speed_goals(folder)
    if not goals:
        return []
    peer, start, prof = (_load_json(folder / n) for n in ("speed_peer.json", "startup.json", "profile.json"))
    L = ["## Speed against drgn on equal inputs", ""]
    L.append("Measured by `benches/speed_peer.py`, `benches/batch_replay.py` and `benches/startup.py` (their "
             "JSON beside this report), each in fresh child processes interleaved round by round, so load "
             "from other processes falls on every side alike; medians over rounds. CPU time is the "
             "figure to read on this shared machine; wall time is given beside it. The drgn column is "
             "measured on the same tasks of the same vmcores, in the same run (below).")
    L.append("")
    L += md_table(("target", "goal", "measured", "ratio to the goal", "against drgn (equal inputs)", "verdict"),
                ((g.name, g.goal, g.measured, g.ratio, g.drgn, g.verdict) for g in goals))
    archs = peer_archs(peer)
    if archs:
        L += _peer_lines(archs, (peer or {}).get("rounds"), (peer or {}).get("runs", {}))
    if start:
        L += ["", "### Start-up", ""]
        L.append(f"`benches/startup.py`, rounds: {start.get('rounds')}; every command a fresh process with warm "
                 "caches; median ms, wall / CPU (user + system of the child). 1-minute load "
                 f"{fmt_num(start['load'][0], 2)} → {fmt_num(start['load'][1], 2)} on {start.get('cores')} cores.")
        L.append("")
        L += md_table(("arch", "command", "wall ms", "CPU ms"),
                    ((c["arch"], c["name"], fmt_num(c["wall_ms"]) if "wall_ms" in c else "failed",
                      fmt_num(c["cpu_ms"]) if "cpu_ms" in c else str(c.get("failed")))
                     for c in start.get("commands", [])))
    if prof:
        L += profile_lines(prof)
    L.append("")
    return L


def profile_lines(prof: dict[str, Any]) -> list[str]:
    """Where a warm single-task replay spends its time, per arch (benches/profile_replay.py's JSON)."""
    L = ["", "### Where the time goes: a warm single-task replay, profiled", ""]
    L.append(f"`benches/profile_replay.py`: cProfile of one warm pass of `Session.replay(task, Options(), "
             f"symbolize=False)` over every corpus task of the arch (after {prof.get('warm_passes', 1)} untimed "
             "pass), the functions with the largest cumulative time, as shares of the pass (cProfile's own "
             "overhead inflates calls that are many and short).")
    for arch in (a for a in ARCH_ORDER if a in prof.get("arches", {})):
        p = prof["arches"][arch]
        L += ["", f"{arch}: {p['tasks']:,} tasks, {p['frames']:,} frames, {fmt_num(p['total'] * 1e3)} ms profiled "
              f"({fmt_num(p['total'] / p['frames'] * 1e6)} µs/frame under the profiler)", ""]
        L += md_table(("function", "calls", "calls/frame", "cumulative", "own"),
                    ((f"`{r['function']}`", f"{r['calls']:,}", fmt_num(r['calls'] / p['frames'], 2),
                      f"{r['cumulative'] / p['total']:.0%}", f"{r['own'] / p['total']:.0%}") for r in p["top"]))
        if p.get("top_own"):
            L += ["", "Most time of their own: " + "; ".join(f"`{r['function']}` {r['own'] / p['total']:.0%}"
                                                         for r in p["top_own"]) + "."]
    return L
