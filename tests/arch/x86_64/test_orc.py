"""ORC tables: every format generation, the kernel's lookup and its batch form."""

from __future__ import annotations

import numpy as np
import pytest
from construct import Container

from unwind.arch.x86_64 import orc
from unwind.arch.x86_64.orc import (NOT_FOUND, NULL_ENTRY, NULL_ORC_ENTRY, ORC_REG_AX, ORC_REG_BP,
                                    ORC_REG_BP_INDIRECT, ORC_REG_DI, ORC_REG_DX, ORC_REG_PREV_SP, ORC_REG_R10,
                                    ORC_REG_R13, ORC_REG_SP, ORC_REG_SP_INDIRECT, OrcEntry, OrcFormatError, OrcTable)
from unwind.arch.x86_64.structs import orc_entry
from unwind.arch.x86_64.synth import (END_OF_STACK, FP_FRAME, INIT_TEXT, TEXT, TEXT_SIZE, UNDEFINED, OrcBuilder,
                                      call, regs)

# One logical table every generation can express (v1 has no signal bit and no AX; v1/v2 mark
# UNDEFINED/END by sp_reg undefined).
COMMON = [
    call(8), call(16, bp_reg=ORC_REG_PREV_SP, bp_offset=-16), FP_FRAME, call(0, ORC_REG_SP_INDIRECT),
    call(-8, ORC_REG_BP_INDIRECT), call(0, ORC_REG_R10), call(0, ORC_REG_R13), call(0, ORC_REG_DI),
    call(8, ORC_REG_DX), regs(0), regs(8, partial=True), UNDEFINED, END_OF_STACK,
    call(24, bp_reg=ORC_REG_BP, bp_offset=-8),
]


def rows_of(entries: list[OrcEntry]) -> list[tuple[int, OrcEntry]]:
    return [(TEXT + 0x40 * i, e) for i, e in enumerate(entries)]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_each_generation_round_trips_one_logical_table(version):
    entries = COMMON + ([call(0, ORC_REG_AX)] if version >= 3 else [])
    rows = rows_of(entries)
    ip_raw = orc.encode_ips([ip for ip, _ in rows], 0xFFFFFFFF82000000)
    raw = orc.encode_entries(entries, version)
    table = OrcTable.from_sections(0xFFFFFFFF82000000, ip_raw, raw, version, stext=TEXT, etext=TEXT + TEXT_SIZE)
    assert [table.ip(i) for i in range(len(table))] == [ip for ip, _ in rows]
    assert [table.entry(i) for i in range(len(table))] == entries


def test_generations_differ_on_the_wire():
    e = regs(8, partial=True)
    wires = {v: orc.encode_entries([e], v) for v in (1, 2, 3, 4)}
    assert len(set(wires.values())) == 4
    # v3 and v4 share bit positions, not register numbers
    assert orc_entry(3).parse(wires[3]).flags.sp_reg == 5 and orc_entry(4).parse(wires[4]).flags.sp_reg == 3
    assert orc_entry(1).parse(wires[1]).flags.type == 2 and orc_entry(3).parse(wires[3]).flags.type == 4


def test_v1_signal_is_implied_and_v2_end_marks_end_of_stack():
    raw_v1 = orc_entry(1).build(Container(sp_offset=8, bp_offset=0, flags=Container(
        unused=0, end=False, type=1, bp_reg=0, sp_reg=5)))
    cols = orc.decode_entries(raw_v1, 1)
    assert cols["type"][0] == orc.ORC_TYPE_REGS and cols["signal"][0] and cols["sp_reg"][0] == ORC_REG_SP
    raw_v2 = orc_entry(2).build(Container(sp_offset=0, bp_offset=0, flags=Container(
        end=True, signal=False, type=0, bp_reg=0, sp_reg=0)))
    assert orc.decode_entries(raw_v2, 2)["type"][0] == orc.ORC_TYPE_END_OF_STACK


def test_old_register_numbers_map_to_v4():
    for old, new in [(1, ORC_REG_PREV_SP), (2, ORC_REG_DX), (3, ORC_REG_DI), (4, ORC_REG_BP), (5, ORC_REG_SP),
                     (6, ORC_REG_R10), (7, ORC_REG_R13), (8, ORC_REG_BP_INDIRECT), (9, ORC_REG_SP_INDIRECT),
                     (10, ORC_REG_AX), (12, 12)]:
        raw = orc_entry(3).build(Container(sp_offset=0, bp_offset=0, flags=Container(
            signal=False, type=2, bp_reg=0, sp_reg=old)))
        assert orc.decode_entries(raw, 3)["sp_reg"][0] == new
        assert orc.decode_entries(raw, 4)["sp_reg"][0] == old  # v4 is the internal numbering


def test_unrepresentable_entries_are_refused():
    with pytest.raises(ValueError):
        orc.encode_entries([call(8, signal=True)], 1)
    with pytest.raises(ValueError):
        orc.encode_entries([OrcEntry(8, 0, ORC_REG_SP, 0, orc.ORC_TYPE_UNDEFINED, False)], 2)


@pytest.mark.parametrize("header,release,forced,want", [
    (bytes.fromhex("fe5d32bf581bd63b2ca9a5c65ba5a625eab3fe24"), None, None, 3),
    (bytes.fromhex("db84aed4103b31dd51e017f8f79783ca985c2c51"), "6.12", None, 2),
    (bytes.fromhex("137c36ad7627c4dd55932176bb0ecdbd5041fc82"), None, None, 4),
    (None, "6.1.0-57-amd64", None, 1), (None, "6.3.10", None, 2), (None, "6.12.117+deb13-amd64", None, 3),
    (None, "7.2.13+deb14-amd64", None, 4), (b"\x01" * 20, None, "v3", 3), (None, None, "2", 2),
])
def test_generation_choice(header, release, forced, want):
    assert orc.choose_version(header, release, forced)[0] == want


def test_unknown_hash_is_a_one_line_diagnostic_naming_it():
    with pytest.raises(OrcFormatError) as e:
        orc.choose_version(bytes(range(20)), "6.12.0", None)
    assert bytes(range(20)).hex() in str(e.value) and "\n" not in str(e.value) and "--orc-version" in str(e.value)
    with pytest.raises(OrcFormatError):
        orc.choose_version(None, None, None)
    with pytest.raises(OrcFormatError):
        orc.parse_version("5")


def kernel_orc_find(table: OrcTable, ip: int) -> int:
    """A literal port of orc_find()/__orc_find() over the raw arrays, for comparison."""
    if ip == 0:
        return NULL_ENTRY
    ips = table.ips.tolist()

    def __orc_find(lo: int, n: int) -> int:
        first, last, found = lo, lo + n - 1, lo
        while first <= last:
            mid = first + (last - first) // 2
            if ips[mid] <= ip:
                found, first = mid, mid + 1
            else:
                last = mid - 1
        return found
    if table.stext <= ip < table.etext:
        idx = (ip - table.stext) // 256
        start, stop = int(table.lookup[idx]), int(table.lookup[idx + 1]) + 1
        return __orc_find(start, stop - start)
    if table.inittext and table.inittext[0] <= ip < table.inittext[1]:
        return __orc_find(0, len(ips))
    return NOT_FOUND


def dense_table(seed: int = 1) -> OrcTable:
    rng = np.random.default_rng(seed)
    ips = np.sort(rng.choice(np.arange(TEXT + 16, TEXT + TEXT_SIZE, 3, dtype=np.uint64), 20000, replace=False))
    ents = [call(8), call(16), FP_FRAME, UNDEFINED]
    rows = [(int(ip), ents[i % 4]) for i, ip in enumerate(ips.tolist())]
    rows += [(rows[100][0], UNDEFINED), (INIT_TEXT + 0x10, call(24))]  # a terminator at a real entry's ip
    return OrcTable.from_entries(rows, stext=TEXT, etext=TEXT + TEXT_SIZE, inittext=(INIT_TEXT, INIT_TEXT + 0x1000))


def test_lookup_matches_the_kernel_port_scalar_and_batch():
    table = dense_table()
    rng = np.random.default_rng(7)
    q = rng.integers(TEXT - 0x100, TEXT + TEXT_SIZE + 0x100, 5000, dtype=np.uint64)
    q = np.concatenate([q, np.array([0, TEXT, TEXT + 5, INIT_TEXT + 0x20, INIT_TEXT, 0xFFFFFFFFC0001000], np.uint64)])
    want = [kernel_orc_find(table, int(ip)) for ip in q.tolist()]
    assert [table.find_index(int(ip)) for ip in q.tolist()] == want
    assert table.orc_find_batch(q).tolist() == want  # bisected: the table has answered fewer ips than its size
    in_text = q[(q >= TEXT) & (q < TEXT + TEXT_SIZE)]
    want_text = [kernel_orc_find(table, int(ip)) for ip in in_text.tolist()]
    assert table.orc_find_batch(in_text).tolist() == want_text
    many = rng.integers(TEXT, TEXT + TEXT_SIZE, len(table), dtype=np.uint64)  # now it builds its rank
    assert table.orc_find_batch(many).tolist() == [kernel_orc_find(table, int(ip)) for ip in many.tolist()]
    assert table._ranked
    assert table.orc_find_batch(q).tolist() == want and table.orc_find_batch(in_text).tolist() == want_text


def test_a_few_ips_are_found_one_by_one_as_the_kernel_port_finds_them():
    table = dense_table()
    rng = np.random.default_rng(11)
    edges = [0, TEXT, TEXT + 5, TEXT - 1, TEXT + TEXT_SIZE - 1, TEXT + TEXT_SIZE, INIT_TEXT, INIT_TEXT + 0x20,
             0xFFFFFFFFC0001000]
    for n in (1, 2, orc.SCALAR_IPS):
        q = np.concatenate([np.array(edges, np.uint64),
                            rng.integers(TEXT - 0x100, TEXT + TEXT_SIZE + 0x100, 200, dtype=np.uint64)])[:n]
        assert table.orc_find_batch(q).tolist() == [kernel_orc_find(table, int(ip)) for ip in q.tolist()]
    assert not table._ranked and table._bisected == 0  # none of them was bisected in lockstep


def test_entry_columns_are_the_distinct_entries_however_the_table_was_made():
    """Decoded, read back from its cache arrays, or with entries changed (the fuzzer's tables): each column holds
    the field of each distinct entry, in the order the rows index them, with the batch's types."""
    table = dense_table()
    table = table.with_entries({5: OrcEntry(-8, 24, ORC_REG_BP, ORC_REG_BP, orc.ORC_TYPE_CALL, True)})  # a new entry
    decoded = dense_table()
    for t in (decoded, OrcTable.from_arrays(*decoded.to_arrays()), table):
        cols = t.entry_columns
        for name, dtype in orc._COLUMN_TYPES.items():
            assert cols[name].dtype == np.dtype(dtype), name
            assert cols[name].tolist() == [getattr(e, name) for e in t._shared], name


def test_terminator_loses_to_the_real_entry_at_the_same_ip():
    t = OrcTable.from_entries([(TEXT + 0x10, call(16)), (TEXT + 0x10, UNDEFINED), (TEXT, call(8))],
                              stext=TEXT, etext=TEXT + TEXT_SIZE)
    assert t.orc_find(TEXT + 0x10) == call(16) and t.orc_find(TEXT + 0x30) == call(16)
    assert t.orc_find_batch([TEXT + 0x10]).tolist() == [t.find_index(TEXT + 0x10)]


def test_null_ip_and_missing_entries():
    t = dense_table()
    assert t.orc_find(0) is NULL_ORC_ENTRY
    assert t.orc_find(0xFFFFFFFFC0001000) is None  # module text: no table here
    # text before the first entry: __orc_find() falls back to the block's first entry
    first = OrcTable.from_entries([(TEXT + 0x500, call(24))], stext=TEXT, etext=TEXT + TEXT_SIZE)
    assert first.orc_find(TEXT + 0x10) == call(24)
    assert first.orc_find_batch([TEXT + 0x10]).tolist() == [0]


def test_image_loading_and_cache():
    b = OrcBuilder()
    b.func("f", 0x20, (0, call(8)))
    img = b.image(3)
    t1 = orc.load_orc(img, "6.12.0")
    assert orc.load_orc(img, "6.12.0") is t1 and t1.version == 3
    assert t1.orc_find(b.addr["f"] + 4) == call(8)
    assert orc.load_orc(b.image(1, header=None), "6.1.0").orc_find(b.addr["f"] + 4) == call(8)
    with pytest.raises(OrcFormatError):
        orc.load_orc(b.image(3, header=bytes(20)), "6.12.0")
    assert orc.load_orc(b.image(3, header=bytes(20)), "6.12.0", forced="3").version == 3


@pytest.mark.parametrize("runs", [1, 3, 12])
def test_batch_lookup_with_runs_of_equal_ips(runs):
    rng = np.random.default_rng(runs)
    ips = np.sort(rng.choice(np.arange(TEXT, TEXT + 0x4000, 5, dtype=np.uint64), 400, replace=False)).tolist()
    rows = [(ip, call(8 * (1 + i % 5))) for i, ip in enumerate(ips)]
    for k, ip in enumerate(rng.choice(ips, runs, replace=False).tolist()):
        rows += [(ip, UNDEFINED)] * (1 + k % 3)  # terminators sharing a real entry's ip
    table = OrcTable.from_entries(rows, stext=TEXT, etext=TEXT + TEXT_SIZE)
    q = rng.integers(TEXT, TEXT + 0x4100, 3000, dtype=np.uint64)
    want = [kernel_orc_find(table, int(ip)) for ip in q.tolist()]
    assert table.orc_find_batch(q[:100]).tolist() == want[:100]  # bisected (fewer ips than entries so far)
    assert table.orc_find_batch(q).tolist() == want  # ranked
