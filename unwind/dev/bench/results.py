"""A pytest-benchmark JSON as the report reads it (:func:`load_results`), and the number and table
formatting every part of the report shares."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

ARCH_ORDER = ("arm64", "x86_64", "riscv")
REPLAY_MODES = ("walk", "walk+symbols", "walk+provenance", "replay")
#: the per-bench statistics ``--stat`` may pick (pytest-benchmark's names)
STATS = ("median", "min", "mean")


class BenchError(Exception):
    """The suite could not run, or the JSON is not a pytest-benchmark result."""


@dataclass
class Bench:
    """One benchmark result: its name, seconds per call (the chosen statistic) and what it stored."""

    name: str
    fullname: str
    seconds: float
    rounds: int
    extra: dict[str, Any]

    @property
    def kind(self) -> str:
        """The ``extra_info["kind"]`` the bench declared (``"other"`` when none)."""
        return str(self.extra.get("kind", "other"))

    def per(self, key: str) -> float | None:
        """Seconds per unit of ``extra[key]`` (per frame, per lookup), or ``None``."""
        n = self.extra.get(key)
        return self.seconds / n if isinstance(n, (int, float)) and n > 0 else None

    def rate(self, key: str) -> float | None:
        """Units of ``extra[key]`` per second."""
        per = self.per(key)
        return 1.0 / per if per else None


@dataclass
class Results:
    """A pytest-benchmark JSON, read."""

    benches: list[Bench]
    machine: dict[str, Any]
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    quick: bool = False
    commit: str = ""
    datetime: str = ""
    load: dict[str, float] = field(default_factory=dict)
    stat: str = "median"
    timer: str = "perf_counter"

    def of(self, kind: str, **match: Any) -> list[Bench]:
        """The benches of ``kind`` whose extra info matches every ``key=value``."""
        return [b for b in self.benches if b.kind == kind and all(b.extra.get(k) == v for k, v in match.items())]

    def one(self, kind: str, **match: Any) -> Bench | None:
        """The first bench of ``kind`` matching, or ``None``."""
        found = self.of(kind, **match)
        return found[0] if found else None

    def skips(self, needle: str) -> list[str]:
        """Distinct skip reasons of benches whose node id contains ``needle``."""
        out: list[str] = []
        for s in self.skipped:
            if needle in s["bench"] and s["reason"] not in out:
                out.append(s["reason"])
        return out


def load_results(path: str | Path, stat: str = "median") -> Results:
    """Read a pytest-benchmark JSON (as ``--benchmark-json`` writes it), taking ``stat`` of each bench's rounds."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise BenchError(f"{path}: not a pytest-benchmark JSON (no 'benchmarks')")
    if stat not in STATS:
        raise BenchError(f"unknown statistic {stat!r} (one of {', '.join(STATS)})")
    benches = [Bench(b["name"], b.get("fullname", b["name"]), float(b["stats"][stat]),
                     int(b["stats"].get("rounds", 0)), dict(b.get("extra_info") or {}))
               for b in data["benchmarks"]]
    ours = data.get("unwind") or {}
    return Results(benches, dict(data.get("machine_info") or {}), list(ours.get("skipped", [])),
                   list(ours.get("failed", [])), bool(ours.get("quick", False)), str(ours.get("commit", "")),
                   str(data.get("datetime", "")), dict(ours.get("load") or {}), stat,
                   str(((data["benchmarks"] or [{}])[0].get("options") or {}).get("timer", "perf_counter")))


# --- formatting -------------------------------------------------------------------------------

def fmt_num(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, without exponent for everyday magnitudes."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    mag = math.floor(math.log10(abs(x)))
    return f"{x:,.{max(digits - 1 - mag, 0)}f}"


def fmt_us(seconds: float) -> str:
    """``seconds`` in microseconds, to three significant figures."""
    return f"{fmt_num(seconds * 1e6)} µs"


def fmt_rate(per_second: float) -> str:
    """A rate per second, in M/s, k/s or /s."""
    if per_second >= 1e6:
        return f"{fmt_num(per_second / 1e6)} M/s"
    if per_second >= 1e3:
        return f"{fmt_num(per_second / 1e3)} k/s"
    return f"{fmt_num(per_second)} /s"


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def machine_text(r: Results) -> str:
    """CPU model, cores, Python and numpy versions of the machine that ran the suite."""
    u = r.machine.get("unwind") or {}
    cpu = u.get("cpu_model") or (r.machine.get("cpu") or {}).get("brand_raw") or r.machine.get("processor") or "?"
    cores = u.get("cores") or (r.machine.get("cpu") or {}).get("count") or "?"
    py = u.get("python") or r.machine.get("python_version") or "?"
    return f"{cpu}, {cores} cores, Python {py}, numpy {u.get('numpy', '?')}"
