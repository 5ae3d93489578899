"""The layout tables against the BTF of the real Debian kernels the lab fetched (``unwind kernels fetch``).

Each fetched vmlinux's ``.BTF`` is the kernel's own answer; the table row the
walk would fall back to for that release must agree with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unwind.arch.arm64.structs import PT_REGS_MEMBERS as ARM64_MEMBERS, pt_regs_table
from unwind.arch.riscv.structs import PT_REGS_MEMBERS as RISCV_MEMBERS, PT_REGS_TABLE as RISCV_TABLE
from unwind.arch.x86_64.structs import (INACTIVE_TASK_FRAME_MEMBERS, INACTIVE_TASK_FRAME_TABLE,
                                        PT_REGS_MEMBERS as X86_MEMBERS, PT_REGS_TABLE as X86_TABLE)
from unwind.formats.image import Image
from unwind.kernel.layout import btf_layout
from unwind.core.target import kernel_version

KERNELS = Path.home() / ".cache" / "unwind" / "kernels"


def _kernels() -> list[Path]:
    return sorted(p for p in KERNELS.glob("*/vmlinux")) if KERNELS.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("vmlinux", _kernels() or [None], ids=lambda p: p.parent.name if p else "none")
def test_table_agrees_with_the_kernels_btf(vmlinux: Path | None) -> None:
    if vmlinux is None:
        pytest.skip(f"no fetched kernel under {KERNELS}")
    release = vmlinux.parent.name
    meta = vmlinux.parent / "kernel.json"
    if meta.exists():
        release = json.loads(meta.read_text()).get("release", release)
    btf = Image(vmlinux).btf
    assert btf is not None, f"{vmlinux} has no .BTF"
    version = kernel_version(release)
    if "arm64" in release or "aarch64" in release:
        meta_records = btf.type(btf.resolve(btf.member("pt_regs", "stackframe").type_id)).name == "frame_record_meta"
        pairs = [(btf_layout(btf, "pt_regs", ARM64_MEMBERS), pt_regs_table(version, meta_records))]
    elif "riscv" in release:
        pairs = [(btf_layout(btf, "pt_regs", RISCV_MEMBERS), RISCV_TABLE)]
    else:
        pairs = [(btf_layout(btf, "pt_regs", X86_MEMBERS), X86_TABLE),
                 (btf_layout(btf, "inactive_task_frame", INACTIVE_TASK_FRAME_MEMBERS), INACTIVE_TASK_FRAME_TABLE)]
    for got, table in pairs:
        assert (got.size, dict(got.offsets)) == (table.size, dict(table.offsets)), (release, got, table)
