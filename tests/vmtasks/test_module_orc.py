"""x86-64: a walk through module code takes the module's own ORC table from memory (orc_module_find())."""

from __future__ import annotations

from unwind import Options, StopReason
from unwind.arch.x86_64.orc import encode_entries, encode_ips
from unwind.arch.x86_64.synth import END_OF_STACK, UNDEFINED, OrcBuilder, call, session
from unwind.core.frame import Source
from unwind.dev.synth import SynthDump
from unwind.core.walk import collect

TASK_LO, STACK = 0xFFFFC90000010000, 0x4000
MOD_TEXT, MOD_ORC = 0xFFFFFFFFC0001000, 0xFFFFFFFFC0100000
FUNC = MOD_TEXT + 0x200  # fuse_get_req, 0x100 bytes


def _kernel() -> OrcBuilder:
    b = OrcBuilder()
    b.func("__schedule", 0x200, (0, call(16)))
    b.func("kthread", 0x100, (0, call(8)))
    b.func("ret_from_fork", 0x40, (0, call(8)))
    b.func("ret_from_fork_asm", 0x20, (0, END_OF_STACK))
    return b


def _dump(b: OrcBuilder, with_modules: bool) -> SynthDump:
    sd = SynthDump("x86_64", "6.12.0-synthetic")
    st = sd.stack("task", TASK_LO, STACK, pid=7)
    tsp = TASK_LO + 0x3000
    st.put(tsp, 15, 14, 13, 12, 11, 0xB0B0, b.addr["__schedule"] + 0x50)  # inactive_task_frame
    sp = tsp + 56
    # __schedule: call(16) -> fuse_get_req+0x30 (its module ORC: sp+32) -> kthread -> ret_from_fork -> asm
    for size, ret in [(16, FUNC + 0x30), (32, b.addr["kthread"] + 0x30), (8, b.addr["ret_from_fork"] + 0x10),
                      (8, b.addr["ret_from_fork_asm"] + 0x8)]:
        st.put(sp + size - 8, ret)
        sp += size
    sd.blocked_task(7, "fuse-waiter", {"sp": tsp})
    if with_modules:
        rows = [(MOD_TEXT, UNDEFINED), (FUNC, call(32)), (FUNC + 0x100, UNDEFINED)]
        ips = encode_ips([ip for ip, _ in rows], MOD_ORC)
        sd.memory(MOD_ORC, ips)
        sd.memory(MOD_ORC + 0x100, encode_entries([e for _, e in rows], 3))
        sd.extra_meta["modules"] = [{
            "name": "fuse", "addr": "0xffff888001234000", "state": 0,
            "regions": [{"kind": "text", "base": hex(MOD_TEXT), "size": 0x1000}],
            "symbols": [[hex(MOD_TEXT + 0x10), "fuse_init"], [hex(FUNC), "fuse_get_req"],
                        [hex(FUNC + 0x100), "fuse_put_request"]],
            "orc": {"orc_unwind_ip": hex(MOD_ORC), "orc_unwind": hex(MOD_ORC + 0x100), "num_orcs": len(rows),
                    "entry_size": 6}}]
    return sd


def test_module_frames_are_orc_walks_and_print_their_module() -> None:
    b = _kernel()
    s = session(_dump(b, True), b.image(3))
    t = s.select(pid=7)[0]
    frames, stop = collect(s.backend.unwinder(s.target(t, Options())))
    assert [f.pc for f in frames] == [b.addr["__schedule"] + 0x50, FUNC + 0x30, b.addr["kthread"] + 0x30,
                                      b.addr["ret_from_fork"] + 0x10, b.addr["ret_from_fork_asm"] + 0x8]
    assert stop.reason is StopReason.END_OF_STACK
    assert all(f.source is Source.ORC_CALL for f in frames[1:]) and all(f.reliable for f in frames)
    r = s.replay(t)
    assert r.frames[1].symbol == "fuse_get_req+0x30/0x100 [fuse]"


def test_without_the_module_table_the_walk_guesses() -> None:
    b = _kernel()
    s = session(_dump(b, False), b.image(3))
    t = s.select(pid=7)[0]
    frames, stop = collect(s.backend.unwinder(s.target(t, Options())))
    # no ORC for the module pc: orc_fp_entry's guess from a bp that is no frame, so the walk ends there
    assert [f.pc for f in frames] == [b.addr["__schedule"] + 0x50, FUNC + 0x30] and not stop.clean
