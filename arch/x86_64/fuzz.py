"""x86-64 mutations for ``unwind fuzz`` (:mod:`unwind.dev.fuzz`): the image's ORC tables.

Either entries a walk will look up (those of return addresses on the seed's stacks) are
corrupted in a copy of the decoded table that the next walks use, or the section parser
(:meth:`OrcTable.from_sections`) runs on a mutated window of the real sections.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from unwind.formats.image import Image, ImageError

from . import orc as O
from .structs import ORC_ENTRY_SIZE

#: entries of one parser window
_WINDOW = 64


def mutate_orc(rng: random.Random, image: Image, release: str | None,
               words: Sequence[int]) -> Callable[[], None] | None:
    """Corrupt ORC entries for ``words`` (stack values) in the table replay will use, or parse a
    mutated window of the sections; the returned function puts the real table back."""
    ip_sec, orc_sec = image.section(".orc_unwind_ip"), image.section(".orc_unwind")
    if ip_sec is None or orc_sec is None:
        return None
    table = O.load_orc(image, release, None, image.symbols.address)
    n = len(table)
    size = ORC_ENTRY_SIZE
    if rng.random() < 0.2:
        _parse_window(rng, table, ip_sec, orc_sec, n, size)
        return None
    changes: dict[int, O.OrcEntry] = {}
    for _ in range(rng.randint(1, 12)):
        idx = table.find_index(rng.choice(words) - 1) if words else -1
        if idx < 0:
            idx = rng.randrange(n)
        raw = bytearray(orc_sec[1][size * idx:size * idx + size])
        raw[rng.randrange(len(raw))] = rng.randrange(256)
        cols = O.decode_entries(bytes(raw), table.version)
        changes[idx] = O.OrcEntry(**{k: bool(v[0]) if k == "signal" else int(v[0]) for k, v in cols.items()})
    mutated = table.with_entries(changes)
    mine = O._BY_IMAGE.setdefault(image, {})
    saved = dict(mine)
    for key in list(mine) or [(release, None)]:
        mine[key] = mutated

    def restore() -> None:
        mine.clear()
        mine.update(saved)
    return restore


def _parse_window(rng: random.Random, table: O.OrcTable, ip_sec: tuple[int, bytes],
                  orc_sec: tuple[int, bytes], n: int, size: int) -> None:
    lo = rng.randrange(max(1, n - _WINDOW))
    ips = bytearray(ip_sec[1][4 * lo:4 * (lo + _WINDOW)])
    ents = bytearray(orc_sec[1][size * lo:size * (lo + _WINDOW)])
    for buf in (ips, ents):
        for _ in range(rng.randint(1, 6)):
            if buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
    if rng.random() < 0.2:
        ents = ents[:rng.randrange(len(ents) + 1)]
    try:
        O.OrcTable.from_sections(ip_sec[0] + 4 * lo, bytes(ips), bytes(ents), table.version,
                                 stext=table.stext, etext=table.etext)
    except ImageError:
        pass
