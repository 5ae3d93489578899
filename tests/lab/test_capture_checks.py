"""Capture refuses a vmlinux that is not the running kernel, and plans stops as asked."""

from types import SimpleNamespace

import pytest

from unwind.lab.capture import CaptureError, Plan, Session


def _session(image_id: str, vmcoreinfo: str) -> Session:
    s = Session.__new__(Session)
    s.img = SimpleNamespace(build_id=image_id, notes_addr=0, notes_data=b"")
    s.vmcoreinfo = vmcoreinfo
    s.log = lambda msg: None
    return s


def test_build_id_mismatch_is_refused() -> None:
    s = _session("aa" * 20, "OSRELEASE=6.12.0\nBUILD-ID=" + "bb" * 20 + "\n")
    with pytest.raises(CaptureError, match="does not match the running kernel"):
        s.check_build_id()


def test_build_id_match_and_kaslr() -> None:
    _session("aa" * 20, "BUILD-ID=" + "aa" * 20 + "\nKERNELOFFSET=0\n").check_build_id()
    with pytest.raises(CaptureError, match="KASLR"):
        _session("aa" * 20, "BUILD-ID=" + "aa" * 20 + "\nKERNELOFFSET=2a000000\n").check_build_id()


def test_plan_interleaves_breakpoints() -> None:
    p = Plan(7, [("irq", "a"), ("syscall-entry", "b")])
    assert p.kinds() == [("random", None), ("random", None), ("irq", "a"), ("random", None),
                         ("random", None), ("syscall-entry", "b"), ("random", None)]
    assert Plan(3, []).kinds() == [("random", None)] * 3
    assert Plan(2, [("breakpoint", "f")], random_share=0).kinds() == [("breakpoint", "f")] * 2
