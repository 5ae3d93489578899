"""Real vmcores with pages of ``task_struct``\\ s left out, as makedumpfile leaves out pages its filter drops.

Each committed ELF slice is rewritten as a kdump-compressed file (``synth.kdump_of``) whose bitmaps say RAM
for the chosen pages and "not dumped" for their contents: what an older makedumpfile on a newer kernel does
to a live ``task_struct``. The answer is known by construction from the intact file and the pages left out:

- every task of the intact file is still reached (the process list is read both ways round, each thread ring,
  the pid IDR), listed with its pid and comm when those are in the dump, else on a line of its own naming the
  member, its address and why it is missing;
- a task whose saved context (or stack pointer, or return-address stacks) is in a left-out page is not walked:
  its walk stops on the member, never on a frame of its own; every other task walks as in the intact file;
- drgn's ``for_each_task()`` of the intact file (the committed ``*.drgn-tasks.json.xz``) lists no task that is
  not reached.
"""

from __future__ import annotations

import json
import lzma
from functools import cache
from pathlib import Path

import pytest

from unwind.core.walk import StopReason
from unwind.formats.vmcore import open_vmcore
from unwind.formats.vmdump import FGRAPH_MEMBERS
from unwind.kernel.model import Kernel
from unwind.session.replay import Session

from .synth import kdump_of

ROOT = Path(__file__).resolve().parents[2]
VMCORES = sorted(ROOT.glob("corpora/*/*/vmcore/*.elf.xz"))
PAGE = 4096


def _image(vmcore: Path) -> Path:
    return next(vmcore.parent.parent.glob("vmlinux-*"))


@cache
def _intact(vmcore: Path, tmp: Path) -> tuple[Path, Session]:
    path = tmp / f"{vmcore.parts[-4]}-{vmcore.parts[-3]}-{vmcore.stem}.intact"
    path.write_bytes(lzma.decompress(vmcore.read_bytes()))
    return path, Session.load(path, vmlinux=_image(vmcore))


def _pfn(s: Session, vaddr: int) -> int:
    return s.dump.memory.translator.translate(vaddr) // PAGE


def _member_pfns(s: Session, addr: int, member: str) -> set[int]:
    """The pages ``task_struct.member`` of the task at ``addr`` lies in."""
    m = s.dump.kernel.btf.member("task_struct", member)
    return {_pfn(s, addr + m.offset), _pfn(s, addr + m.offset + (m.size or 8) - 1)}


def _members(s: Session) -> tuple[str, ...]:
    k = s.dump.kernel
    return tuple(m for m in Kernel.TASK_MEMBERS + k.context_members if k.has("task_struct", m))


def _victims(s: Session) -> set[int]:
    """Pages to leave out: under the ``tasks`` entries of three processes a quarter, half and three quarters
    along the process list (only the middle one when the slice holds no pid IDR: the list read both ways
    round then reaches every other task), and one page holding a blocked task's saved context but not its
    pid or comm."""
    k = s.dump.kernel
    procs = list(k.processes())[1:]
    cuts = (1, 2, 3) if any(True for _ in k.pid_tasks()) else (2,)
    out = {_pfn(s, procs[len(procs) * i // 4] + k.offsetof("task_struct", "tasks")) for i in cuts}
    entries = set().union(*(_member_pfns(s, p, "tasks") for p in procs))
    for t in s.dump.kernel_tasks():
        if t.idle or t.running_on is not None:
            continue
        names = _member_pfns(s, t.addr, "pid") | _member_pfns(s, t.addr, "comm")
        context = set().union(*(_member_pfns(s, t.addr, m) for m in k.context_members))
        if context - names and not (context - names) & entries:  # no further cut in the process list
            out |= context - names
            break
    return out


@cache
def _filtered(vmcore: Path, tmp: Path) -> tuple[Path, frozenset[int]]:
    path, s = _intact(vmcore, tmp)
    gone = frozenset(_victims(s))
    with open_vmcore(path) as vm:
        out = tmp / f"{vmcore.parts[-4]}-{vmcore.parts[-3]}-{vmcore.stem}.filtered.kdump"
        out.write_bytes(kdump_of(vm, exclude=gone))
    return out, gone


@pytest.mark.parametrize("vmcore", VMCORES, ids=lambda p: f"{p.parts[-4]}-{p.parts[-3]}-{p.name.split('.')[0]}")
def test_every_task_is_reached_and_each_loss_is_named(vmcore: Path, tmp_path_factory) -> None:
    tmp = tmp_path_factory.getbasetemp()
    _, intact = _intact(vmcore, tmp)
    path, gone = _filtered(vmcore, tmp)
    s = Session.load(path, vmlinux=_image(vmcore))
    got = {t.task_struct: t for t in s.dump.tasks()}
    want = {t.addr: t for t in intact.dump.kernel_tasks()}
    walk_members = ("stack",) + s.dump.kernel.context_members + FGRAPH_MEMBERS
    assert set(got) == set(want)
    lost = listed = partial = 0
    for addr, w in want.items():
        t = got[addr]
        missing = [m for m in _members(intact) if _member_pfns(intact, addr, m) & gone]
        names = [m for m in missing if m in ("pid", "comm")]
        if names:  # not listable: one line with the member, its address and why
            lost += 1
            assert t.pid is None and t.lacks is not None, (w.pid, w.comm)
            assert t.lacks.what.startswith(f"task_struct.{names[0]} at ") and "excluded" in t.lacks.what
            r = s.replay(t)
            assert r.frames == [] and r.stop.reason is StopReason.MEMORY_FAULT
            continue
        listed += 1
        assert (t.pid, t.comm, t.running_cpu) == (w.pid, w.comm, w.running_on), (w.pid, w.comm)
        stop_on = [m for m in missing if m in walk_members]
        r, r0 = s.replay(t), intact.replay(next(u for u in intact.dump.tasks() if u.task_struct == t.task_struct))
        if stop_on and t.regs is None:
            partial += 1
            assert r.frames == [] and r.stop.reason is StopReason.MEMORY_FAULT, (w.pid, w.comm)
            assert r.stop.detail.startswith("task_struct.") and "excluded" in r.stop.detail
        else:
            pcs, pcs0 = [f.pc for f in r.frames], [f.pc for f in r0.frames]
            assert pcs == pcs0[:len(pcs)], (w.pid, w.comm)
            assert (r.stop.reason, r.stop.detail) == (r0.stop.reason, r0.stop.detail) or \
                (r.stop.reason is StopReason.MEMORY_FAULT and "excluded" in r.stop.detail), (w.pid, w.comm)
    assert lost + listed == len(want) and partial >= 1 and lost >= 1


@pytest.mark.parametrize("vmcore", [v for v in VMCORES if v.with_name(v.name.split(".")[0] + ".drgn-tasks.json.xz")
                                    .exists()], ids=lambda p: f"{p.parts[-4]}-{p.parts[-3]}-{p.name.split('.')[0]}")
def test_no_task_drgn_lists_is_lost(vmcore: Path, tmp_path_factory) -> None:
    """drgn's for_each_task() of the intact file (the pid IDR) against ps of the filtered one."""
    tmp = tmp_path_factory.getbasetemp()
    path, _ = _filtered(vmcore, tmp)
    drgn = json.loads(lzma.decompress(vmcore.with_name(vmcore.name.split(".")[0] + ".drgn-tasks.json.xz")
                                      .read_bytes()))
    s = Session.load(path, vmlinux=_image(vmcore))
    listed = {t.task_struct: t for t in s.dump.tasks()}
    for t in drgn["tasks"]:
        ours = listed.get(int(t["task"], 16))
        assert ours is not None, t
        assert ours.pid in (t["pid"], None) and ours.comm in (t["comm"], "?")
    assert len(listed) > len(drgn["tasks"])  # and each CPU's idle task, which is on no list drgn reads


#: what the routes to a task read, per generation (the 6.12 slices' images carry no BTF: the kernel's own,
#: read from the vmcores above, has them)
ROUTES = (("pid_namespace", "idr.idr_rt.xa_head"), ("xa_node", "slots"), ("pid", "tasks"),
          ("task_struct", "pid_links"), ("task_struct", "tasks"), ("signal_struct", "thread_head"),
          ("task_struct", "thread_node"))


@pytest.mark.parametrize("image", sorted(ROOT.glob("corpora/*/[67].*/vmlinux-*")), ids=lambda p: p.parent.name)
def test_every_generation_keeps_the_routes_to_its_tasks(image: Path) -> None:
    from unwind.formats.image import open_image

    btf = open_image(image).btf
    if btf is None:
        pytest.skip("a slim image without BTF")
    assert all(btf.has_member(s, m) for s, m in ROUTES)
    assert btf.enum_value("PIDTYPE_PID") == 0  # include/linux/pid_types.h: the first pid_type
    # 6.7 dropped thread_group; for_each_thread() (include/linux/sched/signal.h) reads signal->thread_head
    assert btf.has_member("task_struct", "thread_group") == image.parent.name.startswith("6.1.")
