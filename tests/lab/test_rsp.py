"""The RSP client against a small fake GDB stub on loopback."""

import socket
import threading

import pytest

from unwind.lab.rsp import RspClient, RspError, RspMemoryError

XML = ('<?xml version="1.0"?><target><architecture>toy</architecture>'
       '<xi:include href="core.xml"/></target>')
CORE = ('<feature><!-- <reg name="ghost" bitsize="64"/> -->'
        '<reg name="r0" bitsize="64"/><reg name="sp" bitsize="64"/><reg name="pc" bitsize="64"/>'
        '<reg name="flags" bitsize="32"/><reg name="SYS" bitsize="64" regnum="40"/></feature>')
MEM_BASE = 0x1000
MEMORY = bytes(range(256)) * 64  # 16 KiB at MEM_BASE


def _csum(b: bytes) -> bytes:
    return b"%02x" % (sum(b) & 0xFF)


class FakeStub:
    """Answers the packets the client sends; ``die_after`` closes after that many packets."""

    def __init__(self, die_after: int | None = None) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.port = self.srv.getsockname()[1]
        self.die_after = die_after
        self.packets: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _reply(self, conn: socket.socket, body: bytes) -> None:
        conn.sendall(b"$" + body + b"#" + _csum(body))

    def _answer(self, p: bytes) -> bytes | None:
        regs = {"01": [0x11, 0x7000, 0xFFFF0000, 0x5], "02": [0x22, 0x8000, 0xFFFF1000, 0x6]}
        if p.startswith(b"qSupported"):
            return b"PacketSize=200;qXfer:features:read+;QStartNoAckMode+;vContSupported+"
        if p == b"QStartNoAckMode":
            self.noack = True
            return b"OK"
        if p.startswith(b"qXfer:features:read:"):
            annex, rng = p.split(b":")[3:5]
            doc = (XML if annex == b"target.xml" else CORE).encode()
            off, n = (int(x, 16) for x in rng.split(b","))
            chunk = doc[off:off + n]
            return (b"l" if off + n >= len(doc) else b"m") + chunk
        if p == b"?":
            return b"T05thread:01;"
        if p == b"qfThreadInfo":
            return b"m01,02"
        if p == b"qsThreadInfo":
            return b"l"
        if p.startswith(b"Hg"):
            self.thread_id = p[2:].decode()
            return b"OK"
        if p == b"g":
            r = regs[self.thread_id]
            return b"".join(v.to_bytes(8 if i < 3 else 4, "little").hex().encode() for i, v in enumerate(r))
        if p == b"p28":
            return (0xABCD).to_bytes(8, "little").hex().encode()
        if p.startswith(b"m"):
            a, n = (int(x, 16) for x in p[1:].split(b","))
            if not MEM_BASE <= a < a + n <= MEM_BASE + len(MEMORY):
                return b"E14"
            return MEMORY[a - MEM_BASE:a - MEM_BASE + n].hex().encode()
        if p.startswith(b"vCont;c"):
            return None
        if p.startswith(b"Z1") or p.startswith(b"z1"):
            return b"OK"
        return b""

    def _serve(self) -> None:
        conn, _ = self.srv.accept()
        self.noack = False
        self.thread_id = "01"
        buf = b""
        with conn:
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
                while True:
                    if buf[:1] in (b"+", b"-"):
                        buf = buf[1:]
                        continue
                    if buf[:1] == b"\x03":
                        buf = buf[1:]
                        self._reply(conn, b"T02thread:01;")
                        continue
                    end = buf.find(b"#")
                    if not buf.startswith(b"$") or end < 0 or len(buf) < end + 3:
                        break
                    p, buf = buf[1:end], buf[end + 3:]
                    self.packets.append(p)
                    if self.die_after is not None and len(self.packets) > self.die_after:
                        return  # the guest died: close the connection
                    if not self.noack:
                        conn.sendall(b"+")
                    r = self._answer(p)
                    if r is not None:
                        self._reply(conn, r)


def test_registers_memory_and_run_control() -> None:
    stub = FakeStub()
    with RspClient("127.0.0.1", stub.port, timeout=5) as c:
        assert c.noack and c.arch_name == "toy"
        assert [r.name for r in c.regs] == ["r0", "sp", "pc", "flags", "SYS"]  # comment ignored
        assert c.threads() == ["01", "02"]
        c.select_thread("02")
        regs = c.read_registers(["SYS"])
        assert regs == {"r0": 0x22, "sp": 0x8000, "pc": 0xFFFF1000, "flags": 6, "SYS": 0xABCD}
        # 16 KiB in packet-sized chunks (PacketSize=0x200 -> 252 bytes per m)
        assert c.read_memory(MEM_BASE, len(MEMORY)) == MEMORY
        assert sum(p.startswith(b"m") for p in stub.packets) == -(-len(MEMORY) // 252)
        with pytest.raises(RspMemoryError):
            c.read_memory(0x10, 8)
        c.breakpoint(0x1234, 1)
        c.cont()
        assert c.wait_stop(0.2) is None          # still running
        assert c.halt(2).startswith(b"T02")
        assert RspClient.stop_thread(b"T05thread:02;") == "02"


def test_unreachable_stub_is_one_line() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(RspError) as e:
        RspClient("127.0.0.1", port, timeout=2)
    assert "cannot connect" in str(e.value) and "\n" not in str(e.value)


def test_stub_dying_mid_capture_keeps_what_was_read() -> None:
    stub = FakeStub(die_after=14)
    got: list[bytes] = []
    with RspClient("127.0.0.1", stub.port, timeout=5) as c:
        with pytest.raises(RspError, match="closed the connection|connection lost"):
            for i in range(64):
                got.append(c.read_memory(MEM_BASE + 64 * i, 64))
    assert got and all(g == MEMORY[64 * i:64 * i + 64] for i, g in enumerate(got))


def test_silent_stub_times_out() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    with pytest.raises(RspError, match="timed out"):
        RspClient("127.0.0.1", srv.getsockname()[1], timeout=0.5)
    srv.close()
