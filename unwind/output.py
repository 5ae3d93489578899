"""Printing replays: the kernel's text, ``--explain`` provenance, and ``--json``.

The JSON form (one object per replayed task, one per line) is documented in
``docs/json.md``; addresses are hex strings so that 64-bit values survive any
JSON reader.
"""

from __future__ import annotations

from typing import Any

from .frame import Frame
from .replay import Replay, Session


def _hex(v: int | None) -> str | None:
    return None if v is None else hex(v)


def frame_json(frame: Frame, explain: bool) -> dict[str, Any]:
    """One frame as JSON."""
    out: dict[str, Any] = {
        "pc": hex(frame.pc), "sp": _hex(frame.sp), "fp": _hex(frame.fp), "symbol": frame.symbol,
        "source": frame.source.value, "stack": frame.stack,
        "flags": [f for f in frame.flags.letters().split(",") if f], "reliable": frame.reliable,
    }
    if explain and frame.provenance is not None:
        out["provenance"] = frame.provenance.to_json()
    return out


def replay_json(session: Session, r: Replay, explain: bool = False) -> dict[str, Any]:
    """One replay as the documented JSON object."""
    t = r.task
    out: dict[str, Any] = {
        "arch": session.backend.name,
        "kernel": session.dump.release,
        "task": {"pid": t.pid, "comm": t.comm, "state": t.state, "cpu": t.cpu, "running": t.running},
        "frames": [frame_json(f, explain) for f in r.frames],
        "stop": {"reason": r.stop.reason.name.lower(), "text": r.stop.reason.text, "detail": r.stop.detail,
                 "clean": r.stop.clean},
    }
    if r.reliable is not None:
        out["reliable"] = {"ok": r.reliable.ok, "reason": r.reliable.reason}
    if r.basis:
        out["basis"] = dict(r.basis)
    return out


def replay_text(session: Session, r: Replay, explain: bool = False) -> list[str]:
    """The kernel-style trace, a header naming the task, and the stop reason at the end."""
    lines = [f"{r.task.describe()}:"]
    for line, frame in session.backend.format_trace(r.frames, r.stop, r.target):
        lines.append(line)
        if explain and frame is not None:
            lines.extend(explain_lines(frame))
    if explain:
        lines.extend(f"-- {key}: {value}" for key, value in r.basis.items())
    mark = "clean" if r.stop.clean else "ERROR"
    lines.append(f"-- stop: {r.stop} ({mark})")
    if r.reliable is not None:
        lines.append(f"-- reliable: {'yes' if r.reliable.ok else 'no: ' + r.reliable.reason}")
    return lines


def explain_lines(frame: Frame) -> list[str]:
    """Provenance of one frame, indented under its trace line."""
    pad = "      "
    out = [f"{pad}pc {frame.pc:#x} from {frame.source.value}"
           + (f", on the {frame.stack} stack" if frame.stack else "")
           + (f", sp {frame.sp:#x}" if frame.sp is not None else "")
           + (f", fp {frame.fp:#x}" if frame.fp is not None else "")
           + (f" [{frame.flags.letters()}]" if frame.flags else "")]
    prov = frame.provenance
    if prov is None:
        return out
    out.append(f"{pad}rule: {prov.rule}")
    for rd in prov.reads:
        out.append(f"{pad}read {rd.addr:#x}+{rd.size} = {rd.value:#x}  ({rd.what})")
    for n in prov.notes:
        out.append(f"{pad}{n}")
    return out
