"""Speed against drgn: the figures, targets and report lines of the JSON that
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
                 ("startup.py", "startup.json"), ("profile_replay.py", "profile.json"),
                 ("triage_throughput.py", "triage.json"))
#: single-task replay, warm, through the public API, call-site check on (µs per frame, CPU)
TARGET_WARM_US = 2.0
#: what a fresh Session may add per frame (µs)
TARGET_FRESH_EXTRA_US = 0.5
#: batch replay including set-up (frames per second)
TARGET_BATCH_FRAMES = {"arm64": 3e6, "riscv": 3e6, "x86_64": 1.5e6}
#: a warm ``unwind replay DUMP`` (wall, ms)
TARGET_STARTUP_MS = 200.0


#: the figures of a peer child (benchkit.DRGN_CHILD, OURS_PEER_CHILD) summed over an arch's vmcores
_PEER_SUMMED = ("tasks", "frames", "warm", "warm_wall", "k_tasks", "k_frames", "k_warm", "k_warm_wall", "k_fresh",
                "k_fresh_wall", "user_frames")
#: the sides of speed_peer.py on a peer vmcore (``drgn orc`` on x86-64 only)
_PEER_SIDES = ("ours", "ours compiled", "drgn regs", "drgn types", "drgn orc", "drgn dwarf")
#: the builds of ours (unwind.accel): the side of each on a peer vmcore, and the suffix of its corpus runs
_BUILDS = (("pure", "ours", ""), ("compiled", "ours compiled", " compiled"))
#: the drgn configurations of the peer table: side, name, what it does per frame
DRGN_CONFIGS = (
    ("drgn regs", "drgn from `pt_regs` (its bare unwinder)",
     "`prog.stack_trace(pt_regs)`: a `struct pt_regs` value of the registers drgn starts the task with, "
     "the type made with `struct_type` (no type lookups), the slim image its only kernel file (ELF symbols, "
     "ORC, no CFI, no DWARF). Per frame: finds the pc's module, then one ORC lookup (x86-64) or the frame "
     "record at fp (arm64); nothing looked up in DWARF"),
    ("drgn types", "drgn from the task, types from DWARF in C",
     "`prog.stack_trace(task)` with the debug vmlinux, its CFI sections hidden: the task's layouts are read "
     "from `.debug_info` by drgn's C (no Python type finder), and it unwinds as from `pt_regs` (ORC on "
     "x86-64, frame pointers on arm64). Per frame: that unwind step, plus the inline scopes of the pc looked "
     "up in `.debug_info` (drgn does it for every frame of a module with DWARF)"),
    ("drgn orc", "drgn as users run it, ORC preferred",
     "`prog.stack_trace(task)` with the debug vmlinux and `DRGN_PREFER_ORC_UNWINDER=1`. Per frame: one ORC "
     "lookup and the pc's inline scopes in `.debug_info`. x86-64 only: arm64 has no ORC"),
    ("drgn dwarf", "drgn as users run it, DWARF CFI",
     "`prog.stack_trace(task)` with the debug vmlinux, drgn's default. Per frame: the pc's CFI row from "
     "`.debug_frame`, evaluated, and its inline scopes in `.debug_info`"),
)


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


def _single_goals(arch: str, corpus: list[dict[str, Any]], p: PeerArch | None, build: str = "pure",
                  side: str = "ours") -> list[Goal]:
    """The single-task targets of ``arch`` on ``build``: warm and fresh Session, per frame."""
    fresh, warm = _per(corpus, "fresh"), _per(corpus, "warm")
    of = "" if build == "pure" else f" ({build} build)"
    name = f"single-task warm, {arch}{of}"
    goal = f"≤ {fmt_num(TARGET_WARM_US)} µs/frame (CPU), Session.replay, call-site check on"
    if warm is None:
        return [Goal(name, goal, "not measured", "–", "not measured: speed_peer.json has no corpus run")]
    if p is not None and p.frame("drgn regs") and p.frame(side):
        ours, drgn = p.frame(side), p.frame("drgn regs")
        vs = (f"{_times(ours, drgn)} drgn's time per frame from `pt_regs` (same {p.first(side, 'k_tasks')} "
              f"tasks: ours {fmt_num(ours or 0)}, drgn {fmt_num(drgn or 0)} µs)")
    else:
        vs = "no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured"
    goals = [Goal(name, goal, f"{_pair(warm, _per(corpus, 'warm_wall'))} ({corpus[0]['tasks']:,} tasks, "
                  f"{corpus[0]['frames']:,} frames)", f"{fmt_num(warm / TARGET_WARM_US)}× the budget",
                  verdict(warm <= TARGET_WARM_US, warm / TARGET_WARM_US), vs)]
    if fresh is not None:
        extra = fresh - warm
        goals.append(Goal(f"single-task fresh Session, {arch}{of}", f"≤ warm + {fmt_num(TARGET_FRESH_EXTRA_US)} µs/frame",
                          f"{_pair(fresh, _per(corpus, 'fresh_wall'))}: warm + {fmt_num(extra)} µs",
                          f"{fmt_num(extra / TARGET_FRESH_EXTRA_US)}× the allowance",
                          verdict(extra <= TARGET_FRESH_EXTRA_US, extra / TARGET_FRESH_EXTRA_US),
                          "– (a drgn Program keeps nothing per task to start afresh: see the warm row)"))
    return goals


def _frames_rate(per_second: float) -> str:
    """A rate of frames per second, as :func:`fmt_rate` prints it."""
    return fmt_rate(per_second).replace("/s", " frames/s")


def _batch_goal(arch: str, batch: dict[str, Any] | None) -> Goal:
    """The batch target of ``arch``: frames per CPU second including set-up."""
    target = TARGET_BATCH_FRAMES[arch]
    name, goal = f"batch replay, {arch}", f"≥ {fmt_num(target / 1e6)} M frames/s (CPU) including set-up"
    b = (batch or {}).get("ours", {}).get(arch, [])
    if not b:
        return Goal(name, goal, "not measured", "–", "not measured: no batch_replay.json run")
    fresh = _median(r["batched_frames"] / r["fresh"] for r in b if r.get("fresh"))
    warmed = [r["batched_frames"] / r["fresh"] for r in (batch or {}).get("warm_process", {}).get(arch, [])
              if r.get("fresh")]
    # judged: a first batch of its kernels in a process that has batched before (numpy's first calls, the heap's
    # first pages: start-up, paid once per process); a run without it is judged on the process's first batch
    rate = _median(warmed) if warmed else fresh
    warm_rate = _median(r["batched_frames"] / r["warm"] for r in b if r.get("warm"))
    next_rates = [r["batched_frames"] / r["next"] for r in b if r.get("next")]
    later = f"{_frames_rate(_median(next_rates))} next (a later batch, sessions just opened), " if next_rates else ""
    first = f"{_frames_rate(fresh)} fresh (the process's first batch, sessions just opened), "
    if warmed:
        first = (f"{_frames_rate(rate)} fresh in a warm process (judged: the first batch of its kernels, sessions "
                 f"just opened, in a process that walked a batch before), " + first)
    share = b[0]["batched_tasks"] / b[0]["tasks"] if b[0]["tasks"] else 0
    peer = (batch or {}).get("peer", {})
    mine, drgn = peer.get(f"{arch} ours", []), peer.get(f"{arch} drgn", [])
    vs = "no drgn peer (drgn has no riscv unwinder)" if arch == "riscv" else "not measured"
    if mine and drgn and drgn[0].get("mode", "regs") != "regs":
        vs = f"not measured against drgn from `pt_regs` (its drgn runs are of mode {drgn[0]['mode']!r})"
    elif mine and drgn:
        ours_rate = _per(mine, "batched_frames", "warm", 1.0)
        drgn_rate = _per(drgn, "k_frames", "k_warm", 1.0)
        vs = (f"{_times(ours_rate, drgn_rate)} drgn's frames/s (from `pt_regs`, the vmcores' tasks, warm: "
              f"{fmt_rate(ours_rate or 0)} against {fmt_rate(drgn_rate or 0)})")
    return Goal(name, goal, f"{first}{later}"
                f"{_frames_rate(warm_rate)} warm; {share:.0%} of {b[0]['tasks']:,} tasks in lockstep",
                f"{fmt_num(rate / target)}× the target", verdict(rate >= target, target / rate), vs)


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
        for build, side, suffix in _BUILDS:
            if build == "pure" or runs.get(f"{arch} corpus{suffix}"):
                goals += _single_goals(arch, runs.get(f"{arch} corpus{suffix}", []), archs.get(arch), build, side)
    goals += [_batch_goal(arch, batch) for arch in ARCH_ORDER]
    return goals + _startup_goals(start)


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _peer_lines(archs: dict[str, PeerArch], rounds: Any, peer: dict[str, Any]) -> list[str]:
    """The one peer table: each drgn configuration and ours, per kernel frame, same tasks, same run; what
    each drgn configuration does per frame; the pcs agreement and a few traces."""
    run = "".join(f", {k} {peer[k]}" for k in ("datetime", "commit") if peer.get(k))
    if peer.get("load"):
        run += f", 1-minute load {fmt_num(peer['load'][0], 2)} → {fmt_num(peer['load'][1], 2)}"
    shown = [a for a in ARCH_ORDER if a in archs]
    L = ["", "### Against drgn: one peer table, same tasks of the same vmcores, same run", ""]
    L.append(f"`benches/speed_peer.py`, rounds: {rounds}{run}. On each committed vmcore (`corpora/<arch>/<release>/"
             "vmcore/`) every configuration below walks the same tasks, each in a fresh child process, the "
             "children interleaved round by round (drgn's configurations, then ours, vmcore by vmcore), so "
             "load from other processes falls on all of them alike. Warm: one untimed walk of every task first "
             "(drgn parses its ORC and finds each pc's module on first use), then the fastest of the passes "
             "per child; the median over rounds. CPU µs per kernel frame (wall beside it), and each "
             "configuration's time ÷ ours warm (above 1: slower than ours). drgn is 0.3.0 from PyPI.")
    L.append("")
    L.append("Frames are counted alike on every side: real frames (not drgn's inline ones) before the first pc "
             "outside the kernel half of the address space. drgn walks on into the user frames of a task that "
             "entered from user space, inside the same `stack_trace`, time that cannot be split off: so the "
             "figures are over the **kernel-only tasks** (no side walked a user frame of them). The tasks are "
             "those drgn walks in every configuration within 64 kernel frames (drgn's DWARF unwinder loops on "
             "some arm64 stacks).")
    L.append("")
    rows: list[list[str]] = []

    def row(name: str, cell: Any) -> None:
        cells = [name]
        for arch in shown:
            got = cell(archs[arch])
            cells += list(got) if got else ["–", "–"]
        rows.append(cells)

    def measured(side: str, fresh: bool = False) -> Any:
        def cell(p: PeerArch) -> tuple[str, str] | None:
            runs = p.sides.get(side, [])
            key = "k_fresh" if fresh else "k_warm"
            cpu, wall = _per(runs, key, "k_frames"), _per(runs, key + "_wall", "k_frames")
            if cpu is None:
                return None
            return _pair(cpu, wall), _times(cpu, p.frame("ours"))
        return cell
    row("ours, warm (pure-Python build)", measured("ours"))
    row("ours, fresh Session (pure-Python build)", measured("ours", fresh=True))
    row("ours, warm (compiled build)", lambda p: measured("ours compiled")(p) or ("not measured", "–"))
    row("ours, fresh Session (compiled build)", lambda p: measured("ours compiled", fresh=True)(p) or ("not measured", "–"))
    for side, name, _ in DRGN_CONFIGS:
        row(name, lambda p, side=side: measured(side)(p) or (("no ORC on arm64", "–") if side == "drgn orc" else None))
    L += md_table(("configuration", *(h for a in shown for h in (f"{a}: per kernel frame", f"{a}: ÷ ours warm"))),
                  rows)
    L.append("")
    for arch in shown:
        p = archs[arch]
        L.append(f"- {arch}: {p.first('ours', 'k_tasks')} kernel-only tasks of {p.first('ours', 'tasks')}; kernel "
                 f"frames: ours {p.first('ours', 'k_frames')}, " + ", ".join(
                     f"{side[5:]} {p.first(side, 'k_frames')}" for side, _, _ in DRGN_CONFIGS if p.sides.get(side)))
    L += ["", "What each configuration does:", ""]
    L.append("- **ours**: `Session.replay(task, Options(), symbolize=False)` with the committed slim image: per "
             "frame the arch's unwind step (an ORC lookup on x86-64, the frame record on arm64), its reads from "
             "the vmcore, the call-site check and a `Frame`; the stop reason. **Fresh**: the first pass in a "
             "Session just loaded, which pays the Session's and its image's one-time work (their caches "
             "filled, the call sites decided) over one vmcore's few frames; the goals table's fresh figure "
             "spreads it over the committed corpora's. Both builds (`unwind.accel`): the pure-Python modules, "
             "and the same modules compiled with Cython from their own source (`unwind accel build`).")
    for _, name, what in DRGN_CONFIGS:
        L.append(f"- **{name}**: {what}.")
    L += ["", "Validation: the kernel pcs of each task, ours against each drgn configuration (first round):", ""]
    for arch in shown:
        for core, c in archs[arch].checks.items():
            same = ", ".join(f"{side[5:]} {c[side]['same']} of {c[side]['compared']}"
                             for side, _, _ in DRGN_CONFIGS if side in c)
            L.append(f"- `{core}`: the same pcs as ours: {same}; left out: {_left_out(archs[arch].left_out.get(core))}")
    for arch in shown:
        for core, c in archs[arch].checks.items():
            for s in c.get("samples", [])[:1] + c.get("drgn regs", {}).get("differ", [])[:1]:
                L += ["", f"`{core}` task {s['task']} (pid, cpu when running): ours | drgn from `pt_regs`", "", "```"]
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
    L = ["## Speed against drgn", ""]
    L.append("Measured by `benches/speed_peer.py`, `benches/batch_replay.py` and `benches/startup.py` (their "
             "JSON beside this report), each in fresh child processes interleaved round by round, so load "
             "from other processes falls on every side alike; medians over rounds. CPU time is the "
             "figure to read on this shared machine; wall time is given beside it. The drgn column is "
             "measured on the same tasks of the same vmcores, in the same run (below).")
    L.append("")
    L += md_table(("target", "goal", "measured", "ratio to the goal", "against drgn's bare unwinder (`pt_regs`)",
                  "verdict"),
                ((g.name, g.goal, g.measured, g.ratio, g.drgn, g.verdict) for g in goals))
    archs = peer_archs(peer)
    if archs:
        L += _peer_lines(archs, (peer or {}).get("rounds"), peer or {})
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
    triage = _load_json(folder / "triage.json")
    if triage and triage.get("runs"):
        L += triage_lines(triage)
    if prof:
        L += profile_lines(prof)
    L.append("")
    return L


def triage_lines(triage: dict[str, Any]) -> list[str]:
    """``unwind triage`` on one core over the committed corpora (benches/triage_throughput.py's JSON)."""
    runs = triage["runs"]
    cpu, wall = _median(r["cpu"] for r in runs), _median(r["wall"] for r in runs)
    r0 = runs[0]
    L = ["", "### Triage throughput, one core", ""]
    at = f", commit {triage['commit']}" if triage.get("commit") else ""
    L.append(f"`benches/triage_throughput.py`, rounds: {triage.get('rounds')}{at}: `{triage['command']}`, the whole "
             "command each round (imports, every dump opened, every task replayed and bucketed), a fresh "
             "process; CPU is its user + system time; median over rounds.")
    L.append("")
    L += md_table(("dumps", "tasks", "CPU", "wall", "dumps/s per core (CPU)", "tasks/s per core (CPU)"),
                  [(f"{r0['dumps']:,}" + (f" ({r0['failed']} failed)" if r0.get("failed") else ""), f"{r0['tasks']:,}",
                    f"{fmt_num(cpu)} s", f"{fmt_num(wall)} s", fmt_num(r0["dumps"] / cpu), f"{r0['tasks'] / cpu:,.0f}")])
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
