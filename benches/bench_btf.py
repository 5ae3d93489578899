"""One struct layout from a real kernel's ``.BTF``: the lazy reader beside decoding every type.

``lazy`` is what a replay pays: ``Btf(blob)`` (one pass over the record
headers) and the ``pt_regs``/``task_struct`` questions a walk asks.
``eager`` is the reader before it went lazy: the whole type section parsed
at once by a compiled construct ``GreedyRange`` of the same records, then the
same questions: the baseline, measured in the same run. The blob is
a Debian vmlinux's ``.BTF`` from the kernel cache (``unwind kernels fetch``),
else the running kernel's ``/sys/kernel/btf/vmlinux``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from benchkit import QUICK, Missing, measure, need

from construct import Array, Computed, GreedyRange, Pass, Struct, Switch, this

from unwind.kernel.btf import EXTRA_EACH, EXTRA_ONCE, Btf, Header, TypeHeader

KERNELS = Path.home() / ".cache" / "unwind" / "kernels"


@lru_cache(maxsize=None)
def real_blob() -> tuple[str, bytes] | Missing:
    """``(where, .BTF bytes)`` of a real kernel."""
    if QUICK:
        return Missing("a real .BTF is not for the smoke run")
    from unwind.formats.image import Image

    for vmlinux in sorted(KERNELS.glob("*/vmlinux")):
        sec = Image(vmlinux).section(".BTF")
        if sec is not None:
            return vmlinux.parent.name, sec[1]
    sysfs = Path("/sys/kernel/btf/vmlinux")
    if sysfs.exists():
        return "sysfs", sysfs.read_bytes()
    return Missing(f"no vmlinux with .BTF under {KERNELS} and no /sys/kernel/btf/vmlinux")


def lazy(blob: bytes) -> int:
    """What a walk asks: sizeof(pt_regs) and two task_struct members, from a fresh reader."""
    btf = Btf(blob)
    return btf.sizeof("pt_regs") + btf.offsetof("task_struct", "stack") + btf.offsetof("task_struct", "thread")


@lru_cache(maxsize=None)
def _all_records() -> Any:
    """Every record of a type section in one compiled parser (the eager reader's way)."""
    record = Struct(*TypeHeader.subcons, "kind" / Computed((this.info >> 24) & 0x1F),
                    "vlen" / Computed(this.info & 0xFFFF),
                    "extra" / Switch(this.kind, {**EXTRA_ONCE, **{k: Array(this.vlen, c) for k, c in EXTRA_EACH.items()}},
                                     default=Pass))
    return GreedyRange(record).compile()


def eager(blob: bytes) -> int:
    """The whole type section decoded at once, then the same questions."""
    hdr = Header.parse(blob)
    start = hdr.hdr_len + hdr.type_off
    types = _all_records().parse(blob[start:start + hdr.type_len])
    return len(types) + lazy(blob)


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_btf_first_layout(benchmark: Any, mode: str) -> None:
    """CPU time to the first struct layout of a real kernel."""
    where, blob = need(real_blob())
    benchmark.group = "btf: first layout"
    benchmark.extra_info.update(kind="btf", mode=mode, kernel=where, bytes=len(blob))
    measure(benchmark, lazy if mode == "lazy" else eager, blob)
