"""THREAD_SIZE from symbols every generation has (6.1's ``__end_init_task``) or BTF's ``thread_union``."""

import pytest

from tests.vmtasks.btfgen import BtfBuilder
from unwind.kernel.btf import Btf
from unwind.kernel.model import KernelError, thread_size

INIT_STACK = 0xFFFFFFFF82A00000


def _btf(with_union: bool) -> Btf:
    b = BtfBuilder()
    if with_union:
        stack = b.array(b.long, 0x8000 // 8)
        b._add("thread_union", "union", 1, 0x8000, [dict(name_off=b._str("stack"), type=stack, offset=0)])
    return Btf(b.blob())


@pytest.mark.parametrize("end", ["__end_init_stack", "__end_init_task"])
def test_init_stack_extent_in_either_generation(end) -> None:
    # 6.2+ names the end __end_init_stack, 6.1 __end_init_task; 6.1's BTF has no thread_union
    syms = {"init_stack": INIT_STACK, end: INIT_STACK + 0x4000}
    assert thread_size(_btf(False), syms.get) == 0x4000


def test_thread_union_when_the_symbols_say_nothing() -> None:
    assert thread_size(_btf(True), {}.get) == 0x8000
    # an extent that is no power of two is not a THREAD_SIZE
    bad = {"init_stack": INIT_STACK, "__end_init_task": INIT_STACK + 0x4008}
    assert thread_size(_btf(True), bad.get) == 0x8000


def test_neither_is_one_clear_error() -> None:
    with pytest.raises(KernelError, match="cannot tell THREAD_SIZE"):
        thread_size(_btf(False), {"init_stack": INIT_STACK}.get)
