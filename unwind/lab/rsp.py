"""A GDB remote serial protocol client, enough to capture kernels from QEMU's gdbstub.

It speaks the protocol directly (no gdb process): one TCP socket, no-ack mode
when the stub offers it, register layout learnt from ``target.xml``
(``qXfer:features:read``), ``g``/``p`` register reads per thread (``Hg``),
``m`` memory reads in packet-sized chunks, ``vCont;c``/``c`` and ``0x03`` to
run and stop, ``Z1``/``z1`` hardware breakpoints. Every wait has a timeout; a
dead or unreachable stub raises :class:`RspError` with a one-line message.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass


class RspError(Exception):
    """The stub is unreachable, died, timed out or answered an error."""


class RspMemoryError(RspError):
    """The stub could not read the requested memory (``Exx`` reply to ``m``)."""


@dataclass(frozen=True)
class Reg:
    """One register of the target description."""

    name: str
    num: int
    bits: int
    group: str


def _checksum(data: bytes) -> bytes:
    return b"%02x" % (sum(data) & 0xFF)


def _escape(data: bytes) -> bytes:
    out = bytearray()
    for b in data:
        if b in b"#$}*":
            out += bytes((0x7D, b ^ 0x20))
        else:
            out.append(b)
    return bytes(out)


def _unrle(data: bytes) -> bytes:
    """Undo run-length encoding (``x*n``) and ``}`` escapes of a packet payload."""
    if b"*" not in data and b"}" not in data:
        return data
    out = bytearray()
    i = 0
    while i < len(data):
        c = data[i]
        if c == 0x7D and i + 1 < len(data):
            out.append(data[i + 1] ^ 0x20)
            i += 2
        elif c == 0x2A and out and i + 1 < len(data):
            out += bytes([out[-1]]) * (data[i + 1] - 29)
            i += 2
        else:
            out.append(c)
            i += 1
    return bytes(out)


class RspClient:
    """A connection to one GDB stub (all-stop)."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise RspError(f"cannot connect to gdb stub at {host}:{port}: {e.strerror or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        self.noack = False
        self.packet_size = 4096
        self.features: dict[str, str] = {}
        self.regs: list[Reg] = []
        self.arch_name = ""
        self.running = False
        self._thread: str | None = None
        self._handshake()

    # -- framing -------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (the stub keeps the guest as it is)."""
        try:
            self.sock.close()
        except OSError:
            pass

    def release(self) -> None:
        """Let a halted guest run again, then close; a stub that is already gone is no error."""
        try:
            if not self.running:
                self.cont()
        except RspError:
            pass
        self.close()

    def __enter__(self) -> "RspClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv(self, timeout: float | None) -> bytes:
        self.sock.settimeout(timeout if timeout is not None else self.timeout)
        try:
            chunk = self.sock.recv(1 << 16)
        except socket.timeout:
            raise RspError("gdb stub timed out") from None
        except OSError as e:
            raise RspError(f"gdb stub connection lost: {e.strerror or e}") from None
        if not chunk:
            raise RspError("gdb stub closed the connection (guest gone?)")
        return chunk

    def _send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise RspError(f"gdb stub connection lost: {e.strerror or e}") from None

    def send(self, payload: bytes | str) -> None:
        """Send one packet (and wait for its ack unless in no-ack mode)."""
        if isinstance(payload, str):
            payload = payload.encode()
        body = _escape(payload)
        pkt = b"$" + body + b"#" + _checksum(body)
        for _ in range(3):
            self._send_raw(pkt)
            if self.noack:
                return
            ack = self._take_ack()
            if ack == b"+":
                return
        raise RspError("gdb stub keeps rejecting our packets")

    def _take_ack(self) -> bytes:
        while True:
            while not self._buf:
                self._buf += self._recv(None)
            c, self._buf = self._buf[:1], self._buf[1:]
            if c in (b"+", b"-"):
                return c

    def recv_packet(self, timeout: float | None = None) -> bytes:
        """Receive one packet's payload (run-length encoding undone)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            start = self._buf.find(b"$")
            if start >= 0:
                end = self._buf.find(b"#", start)
                if end >= 0 and len(self._buf) >= end + 3:
                    body = self._buf[start + 1:end]
                    self._buf = self._buf[end + 3:]
                    if not self.noack:
                        self._send_raw(b"+")
                    return _unrle(body)
            left = deadline - time.monotonic()
            if left <= 0:
                raise RspError("gdb stub timed out")
            self._buf += self._recv(left)

    def request(self, payload: bytes | str, timeout: float | None = None) -> bytes:
        """Send a packet and return the reply payload."""
        self.send(payload)
        return self.recv_packet(timeout)

    # -- session -------------------------------------------------------------
    def _handshake(self) -> None:
        self._send_raw(b"+")
        reply = self.request("qSupported:multiprocess-;swbreak+;hwbreak+;qRelocInsn-;xmlRegisters=i386")
        for item in reply.decode().split(";"):
            if "=" in item:
                k, v = item.split("=", 1)
                self.features[k] = v
            elif item:
                self.features[item[:-1]] = item[-1]
        if "PacketSize" in self.features:
            self.packet_size = int(self.features["PacketSize"], 16)
        if self.features.get("QStartNoAckMode") == "+":
            if self.request("QStartNoAckMode") == b"OK":
                self.noack = True
        if self.features.get("qXfer:features:read") == "+":
            self._load_target_description()
        # learn the stop state (QEMU stops the guest on connect)
        self.request("?")

    def _xfer(self, annex: str) -> str:
        out = b""
        chunk = max(256, self.packet_size - 16)
        while True:
            r = self.request(f"qXfer:features:read:{annex}:{len(out):x},{chunk:x}")
            if not r or r[:1] not in b"ml":
                raise RspError(f"qXfer:features:read:{annex} failed: {r[:20]!r}")
            out += r[1:]
            if r[:1] == b"l":
                return out.decode()

    def _load_target_description(self) -> None:
        regs: list[Reg] = []
        num = 0

        def walk(annex: str) -> None:
            # QEMU's XML uses an undeclared xi: prefix, so scan the tags in order.
            nonlocal num
            xml = re.sub(r"<!--.*?-->", "", self._xfer(annex), flags=re.S)
            for m in re.finditer(r"<(xi:include|reg|architecture)\b([^>]*)>([^<]*)", xml):
                tag, attrs = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
                if tag == "architecture":
                    self.arch_name = m.group(3).strip()
                elif tag == "xi:include":
                    walk(attrs.get("href", ""))
                else:
                    if "regnum" in attrs:
                        num = int(attrs["regnum"])
                    regs.append(Reg(attrs.get("name", ""), num, int(attrs.get("bitsize", "64")),
                                    attrs.get("group", "")))
                    num += 1

        walk("target.xml")
        self.regs = regs
        self._by_name = {r.name: r for r in regs}

    def threads(self) -> list[str]:
        """Thread ids (QEMU: one per vCPU, CPU n is the n+1-th)."""
        out: list[str] = []
        r = self.request("qfThreadInfo")
        while r.startswith(b"m"):
            out += [t for t in r[1:].decode().split(",") if t]
            r = self.request("qsThreadInfo")
        return out

    def select_thread(self, tid: str) -> None:
        """Make ``tid`` the thread for register (and memory) accesses."""
        if self._thread == tid:
            return
        r = self.request(f"Hg{tid}")
        if r != b"OK":
            raise RspError(f"Hg{tid} failed: {r.decode(errors='replace')}")
        self._thread = tid

    # -- registers -----------------------------------------------------------
    def reg(self, name: str) -> Reg | None:
        """The register called ``name`` in the target description, if any."""
        return getattr(self, "_by_name", {}).get(name)

    def read_registers(self, names: list[str] | None = None) -> dict[str, int]:
        """Registers of the selected thread: the ``g`` block plus ``p`` for ``names`` outside it."""
        raw = self.request("g")
        if raw.startswith(b"E") and len(raw) == 3:
            raise RspError(f"g failed: {raw.decode()}")
        data = bytes.fromhex(raw.decode())
        out: dict[str, int] = {}
        off = 0
        for r in self.regs:
            n = r.bits // 8
            if off + n > len(data):
                break
            out[r.name] = int.from_bytes(data[off:off + n], "little")
            off += n
        for name in names or []:
            if name in out:
                continue
            r = self.reg(name)
            if r is None:
                continue
            v = self.request(f"p{r.num:x}")
            if v.startswith(b"E") and len(v) == 3 or not v:
                continue
            out[name] = int.from_bytes(bytes.fromhex(v.decode()), "little")
        return out

    def write_register(self, name: str, value: int) -> None:
        """Write one register of the selected thread with ``P``."""
        r = self.reg(name)
        if r is None:
            raise RspError(f"no register {name}")
        val = value.to_bytes(r.bits // 8, "little").hex()
        if self.request(f"P{r.num:x}={val}") != b"OK":
            raise RspError(f"P {name} failed")

    # -- memory --------------------------------------------------------------
    def read_memory(self, addr: int, size: int) -> bytes:
        """``size`` bytes at ``addr`` (through the selected thread's MMU)."""
        chunk = (self.packet_size - 8) // 2
        out = bytearray()
        while len(out) < size:
            n = min(chunk, size - len(out))
            a = addr + len(out)
            r = self.request(f"m{a:x},{n:x}")
            if not r or (r[:1] == b"E" and len(r) == 3):
                raise RspMemoryError(f"cannot read {n} bytes at {a:#x}")
            out += bytes.fromhex(r.decode())
        return bytes(out)

    def read_u64(self, addr: int) -> int:
        """One little-endian 64-bit word."""
        return int.from_bytes(self.read_memory(addr, 8), "little")

    # -- execution -----------------------------------------------------------
    def cont(self) -> None:
        """Resume all vCPUs (returns at once; use :meth:`wait_stop`)."""
        self._thread = None
        self.send("vCont;c" if self.features.get("vContSupported") == "+" else "c")
        self.running = True

    def interrupt(self) -> None:
        """Ask a running target to stop (``0x03``)."""
        self._send_raw(b"\x03")

    def wait_stop(self, timeout: float) -> bytes | None:
        """The stop reply, or None if the target is still running after ``timeout`` seconds."""
        try:
            r = self.recv_packet(timeout)
        except RspError as e:
            if str(e) == "gdb stub timed out":
                return None
            raise
        self.running = False
        self._thread = None
        if r.startswith(b"W") or r.startswith(b"X"):
            raise RspError(f"target exited ({r.decode(errors='replace')})")
        return r

    def halt(self, timeout: float = 10.0) -> bytes:
        """Stop a running target and return its stop reply."""
        self.interrupt()
        r = self.wait_stop(timeout)
        if r is None:
            raise RspError("target did not stop after ^C")
        return r

    def breakpoint(self, addr: int, kind: int, insert: bool = True, hw: bool = True) -> None:
        """Insert (or remove) a hardware (``Z1``) or software (``Z0``) breakpoint."""
        z = ("Z" if insert else "z") + ("1" if hw else "0")
        r = self.request(f"{z},{addr:x},{kind:x}")
        if r != b"OK":
            raise RspError(f"{z} at {addr:#x} refused: {r.decode(errors='replace') or 'unsupported'}")

    @staticmethod
    def stop_thread(reply: bytes) -> str | None:
        """The ``thread:`` field of a ``T`` stop reply."""
        m = re.search(rb"thread:([0-9a-fA-F.p-]+);", reply)
        return m.group(1).decode() if m else None
