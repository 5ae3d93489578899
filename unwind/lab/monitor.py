"""QEMU HMP monitor and serial console clients over unix sockets."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b[()][A-Za-z0-9]")
PROMPT = "(qemu) "


class Monitor:
    """A HMP connection: ``cmd("stop")`` returns the reply text (ANSI escapes removed)."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self._read_until_prompt()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def _read_until_prompt(self) -> str:
        buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("monitor closed")
            buf += chunk
            text = _ANSI.sub("", buf.decode(errors="replace"))
            if text.endswith(PROMPT):
                return text[: -len(PROMPT)]

    def cmd(self, line: str) -> str:
        """Run one HMP command and return its output without the echo."""
        self.sock.sendall(line.encode() + b"\n")
        text = self._read_until_prompt()
        lines = text.replace("\r", "").split("\n")
        # the first line is the (re-drawn) echo of the command
        return "\n".join(lines[1:]).strip()

    def send_quit(self) -> None:
        """Send ``quit``; QEMU closes the socket instead of answering."""
        self.sock.sendall(b"quit\n")
        try:
            while self.sock.recv(4096):
                pass
        except OSError:
            pass


class Console:
    """The guest's serial console: type into ``con.sock`` and record what it prints.

    A ``cat`` process copies the socket into ``record``: a connected client
    that does not read would stall the guest's UART, and QEMU 7.2's
    ``logfile=`` copy repeats bytes now and then, so it is not used for oracles.
    """

    def __init__(self, sock_path: str, record: str | Path, timeout: float = 5.0) -> None:
        self.log = Path(record)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(sock_path)
        self.sock.settimeout(None)  # cat needs a blocking descriptor
        self._out = open(self.log, "ab")
        self._drain = subprocess.Popen(["cat"], stdin=self.sock.fileno(), stdout=self._out)

    def close(self) -> None:
        """Stop recording and close the socket."""
        self._drain.terminate()
        self._drain.wait(timeout=5)
        self._out.close()
        self.sock.close()

    def __enter__(self) -> "Console":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mark(self) -> int:
        """Current size of the console log (an offset to read from later)."""
        return self.log.stat().st_size if self.log.exists() else 0

    def type(self, line: str) -> None:
        """Type one line into the console shell."""
        self.sock.sendall(line.encode() + b"\n")

    def read_from(self, offset: int) -> str:
        """Console text logged since ``offset``."""
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").replace("\r", "")

    def wait_for(self, offset: int, pattern: str, timeout: float, quiet: float = 0.0) -> str:
        """Text since ``offset`` once ``pattern`` (regex) appears and the log stayed quiet for
        ``quiet`` seconds; TimeoutError otherwise."""
        t0 = time.time()
        rx = re.compile(pattern, re.M)
        while time.time() - t0 < timeout:
            text = self.read_from(offset)
            if rx.search(text):
                size = self.mark()
                while quiet:
                    time.sleep(quiet)
                    if self.mark() == size:
                        break
                    size = self.mark()
                return self.read_from(offset)
            time.sleep(0.1)
        raise TimeoutError(f"console: no {pattern!r} after {timeout:.0f}s")
