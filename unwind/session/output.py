"""Printing replays: the kernel's text, ``--explain`` provenance, and ``--json``.

The JSON form (one object per replayed task, one per line) is documented in
``docs/json.md``; addresses are hex strings so that 64-bit values survive any
JSON reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unwind.core.frame import Frame
from unwind.core.target import SavedRegs
from .replay import Replay, Session
from unwind.core.trace import TraceLine
from unwind.core.walk import Stop, StopReason

if TYPE_CHECKING:
    from .lines import FrameLines

#: the version of the JSON schema (``docs/json.md``), which every object names (``"schema"``)
JSON_SCHEMA = 3


def _hex(v: int | None) -> str | None:
    return None if v is None else hex(v)


def _regs_json(regs: dict[str, int] | None) -> dict[str, str] | None:
    return None if regs is None else {k: hex(v) for k, v in regs.items()}


def frame_json(frame: Frame, explain: bool, line: TraceLine | None = None, index: int | None = None) -> dict[str, Any]:
    """One frame as JSON; ``line`` is the trace line that prints it (at ``index`` in ``trace``)."""
    printed = line.data if line is not None else {}
    out = frame.to_json(explain)
    out.update(symbol=printed.get("symbol", frame.symbol), printed_pc=_hex(printed.get("pc")),
               recovered_symbol=frame.symbol, line=index)
    return out


def stop_json(stop: Stop) -> dict[str, Any]:
    """The stop as JSON."""
    return {"reason": stop.reason.name.lower(), "text": stop.reason.text, "detail": stop.detail,
            "clean": stop.clean, "truncated": stop.truncated}


def saved_regs_json(saved: SavedRegs | None) -> dict[str, Any] | None:
    """A blocked task's saved context as JSON (``None`` for a running task)."""
    if saved is None:
        return None
    return {"source": saved.source, "regs": _regs_json(saved.regs), "missing": list(saved.missing)}


def saved_regs_text(r: Replay, saved: SavedRegs | None) -> list[str]:
    """``--regs``: the saved context, three registers a line, and what of it the dump lacks."""
    if saved is None:
        return [f"saved context: none, the task runs on cpu{r.task.cpu} (its registers are the CPU's)"]
    out = [f"saved context ({saved.source}):"]
    items = [f"{name:>8}: {value:016x}" for name, value in saved.regs.items()]
    out.extend(" ".join(items[i:i + 3]) for i in range(0, len(items), 3))
    if saved.missing:
        out.append(f"  not in the dump: {' '.join(saved.missing)}")
    return out


def replay_json(session: Session, r: Replay, explain: bool = False,
                lines: list[TraceLine] | None = None, sources: "FrameLines | None" = None,
                regs: bool = False) -> dict[str, Any]:
    """One replay as the documented JSON object: everything the text shows, as data; with ``sources``
    (``--lines``) each frame's source lines too; with ``regs`` (``--regs``) the task's ``saved_regs``."""
    t = r.task
    lines = trace_lines(session, r) if lines is None else lines
    index = {id(f): i for i, f in enumerate(r.frames)}
    printed: dict[int, tuple[int, TraceLine]] = {}
    for i, line in enumerate(lines):
        if line.frame is not None and id(line.frame) not in printed:
            printed[id(line.frame)] = (i, line)
    frames = []
    for f in r.frames:
        at, line = printed.get(id(f), (None, None))
        frames.append(frame_json(f, explain, line, at))
        if sources is not None:
            frames[-1]["lines"] = sources.to_json(f)
    image = session.image
    out: dict[str, Any] = {
        "schema": JSON_SCHEMA,
        "arch": session.backend.name,
        "kernel": session.dump.release,
        "dump": {"path": str(session.dump.path), "build_id": session.dump.build_id},
        "image": None if image is None else {"path": str(image.path), "build_id": image.build_id},
        "task": {"pid": t.pid, "comm": t.comm, "state": t.state, "cpu": t.cpu, "running": t.running,
                 "task_struct": t.extra.get("task"), "regs": _regs_json(t.regs),
                 "context": _regs_json(t.context)},
        "frames": frames,
        "trace": [line.to_json(index) for line in lines],
        "stop": stop_json(r.stop),
    }
    if r.reliable is not None:
        out["reliable"] = {"ok": r.reliable.ok, "reason": r.reliable.reason}
    if r.basis:
        out["basis"] = dict(r.basis)
    if regs:
        out["saved_regs"] = saved_regs_json(session.backend.saved_regs(r.target))
    if sources is not None:
        out["lines_image"] = None if sources.image is None or sources.index is None else {
            "path": str(sources.image.path), "build_dir": sources.index.comp_dir}
    return out


def trace_lines(session: Session, r: Replay) -> list[TraceLine]:
    """The lines the kernel prints for this replay (the backend's ``format_trace``)."""
    if r.stop.reason is StopReason.TASK_EXITED:  # `if (!try_get_task_stack(p)) return;`: nothing at all
        return []
    return session.backend.format_trace(r.frames, r.stop, r.target)


def stop_text(stop: Stop) -> str:
    """``-- stop: ...`` with its verdict."""
    mark = "clean" if stop.clean else "ERROR"
    if stop.truncated:
        mark += ", truncated"
    return f"-- stop: {stop} ({mark})"


def replay_text(session: Session, r: Replay, explain: bool = False,
                lines: list[TraceLine] | None = None, sources: "FrameLines | None" = None,
                regs: bool = False) -> list[str]:
    """The kernel-style trace, a header naming the task, and the stop reason at the end; with ``sources``
    (``--lines``) each frame's source lines under the first line that prints it; with ``regs``
    (``--regs``) the task's saved context under the header."""
    out = [f"{r.task.describe()}:"]
    if regs:
        out.extend(saved_regs_text(r, session.backend.saved_regs(r.target)))
    shown: set[int] = set()
    for line in trace_lines(session, r) if lines is None else lines:
        out.append(line.text)
        if sources is not None and line.frame is not None and id(line.frame) not in shown:
            shown.add(id(line.frame))
            out.extend(sources.text(line.frame))
        if explain and line.frame is not None:
            out.extend(explain_lines(line.frame))
    if explain:
        out.extend(f"-- {key}: {value}" for key, value in r.basis.items())
    out.append(stop_text(r.stop))
    if r.reliable is not None:
        out.append(f"-- reliable: {'yes' if r.reliable.ok else 'no: ' + r.reliable.reason}")
    return out


def explain_lines(frame: Frame) -> list[str]:
    """Provenance of one frame, indented under its trace line."""
    pad = "      "
    out = [f"{pad}pc {frame.pc:#x} from {frame.source.value}"
           + (f", on the {frame.stack} stack" if frame.stack else "")
           + (f", sp {frame.sp:#x}" if frame.sp is not None else "")
           + (f", fp {frame.fp:#x}" if frame.fp is not None else "")
           + (f" [{','.join(frame.flags.names())}]" if frame.flags else "")]
    prov = frame.provenance
    if prov is None:
        return out
    out.append(f"{pad}rule: {prov.rule}")
    for rd in prov.reads:
        out.append(f"{pad}read {rd.addr:#x}+{rd.size} = {rd.value:#x}  ({rd.what})")
    for n in prov.notes:
        out.append(f"{pad}{n}")
    return out
