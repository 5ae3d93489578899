"""A stand-in for gdb's Python module: the parts :mod:`unwind.cli.gdbtarget` uses, over a memory and
per-CPU registers given by the test, and gdb's unwinding loop (each frame's caller from the saved
registers of the frame's ``UnwindInfo``)."""

from __future__ import annotations

import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable


class error(RuntimeError):
    """gdb.error."""


class MemoryError(error):  # noqa: A001 - gdb's own name
    """gdb.MemoryError."""


class GdbError(RuntimeError):
    """gdb.GdbError."""


@dataclass
class Type:
    """A register's type: 8 bytes."""

    name: str = "uint64"
    sizeof: int = 8


class Value:
    """gdb.Value of a register or a number."""

    def __init__(self, value: int | bytes, type_: Type | None = None) -> None:
        if isinstance(value, bytes):  # gdb.Value(buffer, type): the type's bytes
            assert type_ is not None and len(value) == type_.sizeof
            value = int.from_bytes(value, "little")
        self.value = int(value)
        self.type = type_ or Type("long")

    def cast(self, type_: Type) -> "Value":
        return Value(self.value & (1 << 64) - 1, type_)

    def __int__(self) -> int:
        return self.value


@dataclass
class Thread:
    num: int
    ptid: tuple[int, int, int]
    gdb: "FakeGdb"

    def switch(self) -> None:
        self.gdb.thread = self


@dataclass
class UnwindInfo:
    frame_id: Any
    saved: dict[str, int] = field(default_factory=dict)

    def add_saved_register(self, name: str, value: Value) -> None:
        assert isinstance(value, Value) and value.type.name == "uint64", "a register's value cast to its type"
        self.saved[name] = int(value)


class PendingFrame:
    """gdb.PendingFrame: the registers of frame ``level``."""

    def __init__(self, level: int, regs: dict[str, int]) -> None:
        self._level = level
        self.regs = regs

    def level(self) -> int:
        return self._level

    def read_register(self, name: str) -> Value:
        if name not in self.regs:
            raise error(f"Bad register {name}")
        return Value(self.regs[name], Type())

    def create_unwind_info(self, frame_id: Any) -> UnwindInfo:
        assert isinstance(frame_id.sp, Value) and isinstance(frame_id.pc, Value)
        return UnwindInfo(frame_id)


class Frame:
    """gdb.Frame of frame 0: the thread's registers."""

    def __init__(self, regs: dict[str, int]) -> None:
        self.regs = regs

    def read_register(self, name: str) -> Value:
        if name not in self.regs:
            raise error(f"Bad register {name}")
        return Value(self.regs[name], Type())


@dataclass
class SelectedFrame:
    """gdb.Frame of the frame ``frame N`` selected: its type (``gdb.NORMAL_FRAME``, ``gdb.INLINE_FRAME``)."""

    kind: int
    pc: int

    def type(self) -> int:
        return self.kind


class FakeGdb(types.ModuleType):
    """The ``gdb`` module over ``read(addr, size)`` (``None``: not readable) and gdb's registers of each
    CPU (by gdb's names), with the core file and the loaded files gdb would report."""

    def __init__(self, read: Callable[[int, int], bytes | None], cpus: dict[int, dict[str, int]],
                 objfiles: list[str], core: str | None) -> None:
        super().__init__("gdb")
        self._read = read
        self.cpus = cpus
        self.threads = [Thread(cpu + 1, (1, cpu + 1, 0), self) for cpu in sorted(cpus)]
        self.thread: Thread | None = self.threads[0] if self.threads else None
        self._objfiles = [types.SimpleNamespace(filename=f) for f in objfiles]
        self.core = core
        self.params: dict[str, Any] = {}
        self.written: list[str] = []
        self.stderr: list[str] = []
        self.STDERR = 2
        self.commands: dict[str, Any] = {}
        self.unwinders: list[Any] = []
        self.invalidated = 0
        #: gdb's frame types (their values in gdb's Python API)
        self.NORMAL_FRAME, self.INLINE_FRAME = 0, 5
        #: ``frame N``: gdb's pc register, and how many inline frames deep frame 0 is
        self.pc_name, self.inline = "pc", 0
        self._selected: SelectedFrame | None = None
        self.error, self.MemoryError, self.GdbError, self.Value = error, MemoryError, GdbError, Value
        self.COMMAND_STACK = self.COMMAND_FILES = self.PARAM_OPTIONAL_FILENAME = 0
        self.handlers: dict[str, list[Callable[..., None]]] = {e: [] for e in ("cont", "new_objfile", "exited")}
        self.events = types.SimpleNamespace(**{e: types.SimpleNamespace(connect=self.handlers[e].append)
                                               for e in self.handlers})
        gdb = self

        class Parameter:
            def __init__(self, name: str, *_: Any) -> None:
                gdb.params[name] = None

        class Command:
            def __init__(self, name: str, *_: Any) -> None:
                gdb.commands[name] = self

        class Unwinder:
            def __init__(self, name: str) -> None:
                self.name, self.enabled = name, True

        self.Parameter, self.Command = Parameter, Command
        self.unwinder = types.SimpleNamespace(
            Unwinder=Unwinder, register_unwinder=lambda locus, u, replace=False: gdb.unwinders.append(u))

    # -- the module's functions gdbtarget calls --
    def selected_inferior(self) -> Any:
        gdb = self

        def read_memory(addr: int, size: int) -> memoryview:
            data = gdb._read(addr, size)
            if data is None:
                raise MemoryError(f"Cannot access memory at address {addr:#x}")
            return memoryview(data)

        return types.SimpleNamespace(read_memory=read_memory, threads=lambda: list(reversed(self.threads)),
                                     num=1, pid=1)

    def selected_thread(self) -> Thread | None:
        return self.thread

    def newest_frame(self) -> Frame:
        assert self.thread is not None
        return Frame(self.cpus[self.thread.num - 1])

    def current_progspace(self) -> Any:
        return types.SimpleNamespace(core_filename=self.core)

    def execute(self, command: str, to_string: bool = False) -> str:
        m = re.fullmatch(r"frame (\d+)", command)
        if m is None:
            raise error(f"not in the stand-in: {command}")
        stack = self.stack()
        level = int(m.group(1))
        if level >= len(stack):
            raise error(f"No frame at level {level}.")
        self._selected = stack[level]
        return ""

    def selected_frame(self) -> SelectedFrame:
        if self._selected is None:
            raise error("No frame selected.")
        return self._selected

    def parse_and_eval(self, expression: str) -> Value:
        if expression != "$pc":
            raise error(f"not in the stand-in: {expression}")
        return Value(self.selected_frame().pc)

    def parameter(self, name: str) -> Any:
        return self.params.get(name)

    def objfiles(self) -> list[Any]:
        return self._objfiles

    def invalidate_cached_frames(self) -> None:
        self.invalidated += 1

    def write(self, text: str, stream: int = 0) -> None:
        (self.stderr if stream == self.STDERR else self.written).append(text)

    # -- what gdb itself does --
    def reset(self) -> None:
        """The target ran (``gdb.events.cont``)."""
        for handler in self.handlers["cont"]:
            handler(None)

    def backtrace(self, cpu: int, pc: str, limit: int = 512, inline: int = 0) -> list[int]:
        """gdb's unwinding of thread ``cpu + 1``: the pc of each frame (:meth:`frames`)."""
        return [regs[pc] for regs in self.frames(cpu, pc, limit, inline)]

    def frames(self, cpu: int, pc: str, limit: int = 512, inline: int = 0) -> list[dict[str, int]]:
        """gdb's unwinding of thread ``cpu + 1``: frame 0's registers, then the registers each caller was
        handed (the saved registers of its callee's ``UnwindInfo``); ends where no unwinder claims a frame,
        or, as gdb's ``get_prev_frame_maybe_check_cycle`` does, where a caller's frame id is one a frame
        already has (``UNWIND_SAME_ID``: that caller is not shown). A claimed frame that saves no pc is
        gdb's error "PC not saved" (``frame_unwind_pc``), raised as :class:`error`, as it aborts ``thread
        apply all bt``. ``inline``: frame 0 is that many inline frames deep (gdb's inline unwinder claims
        them; their levels come first)."""
        self.thread = self.threads[[t.num for t in self.threads].index(cpu + 1)]
        regs = dict(self.cpus[cpu])
        out = [regs]
        seen: set[tuple[int, int]] = set()
        for level in range(limit):
            info = next((i for u in self.unwinders if (i := u(PendingFrame(level + inline, regs))) is not None),
                        None)
            if info is None:
                break
            frame_id = (int(info.frame_id.sp), int(info.frame_id.pc))
            if frame_id in seen:
                out.pop()  # the caller just made is the frame it repeats
                break
            seen.add(frame_id)
            if pc not in info.saved:
                raise error("PC not saved")
            regs = {**regs, **info.saved}
            out.append(dict(info.saved))
        return out

    def stack(self) -> list[SelectedFrame]:
        """The frames ``frame N`` selects on the selected thread: :attr:`inline` inline frames with frame 0's
        pc (gdb's inline unwinder), then each frame :meth:`frames` unwinds."""
        assert self.thread is not None
        pcs = self.backtrace(self.thread.num - 1, self.pc_name)
        return ([SelectedFrame(self.INLINE_FRAME, pcs[0])] * self.inline
                + [SelectedFrame(self.NORMAL_FRAME, pc) for pc in pcs])

    def run(self, command: str, argument: str = "") -> str:
        """A command as gdb runs it: its output, or the ``GdbError`` it raised."""
        self.written.clear()
        self.commands[command].invoke(argument, False)
        return "".join(self.written)
