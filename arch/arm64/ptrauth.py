"""Pointer authentication of return addresses, offline: ``asm/pointer_auth.h`` and ``asm/compiler.h``.

A return address the kernel signed carries a PAC in its high bits; the unwinder
strips it with the mask of the dumped kernel before using it.
"""

from __future__ import annotations

from collections.abc import Mapping

from unwind.formats.vmcore.vmcoreinfo import vmcoreinfo_number

_U64 = (1 << 64) - 1
#: the bit that tells a kernel pointer (set) from a user one (clear) to xpaclri
BIT55 = 1 << 55


def _vmcoreinfo_number(vmcoreinfo: Mapping[str, str], name: str) -> int | None:
    return vmcoreinfo_number(vmcoreinfo, f"NUMBER({name})")


def genmask_ull(high: int, low: int) -> int:
    """``GENMASK_ULL(high, low)``."""
    return ((1 << (high + 1)) - 1) & ~((1 << low) - 1) & _U64


# vmcoreinfo_append_str("NUMBER(KERNELPACMASK)...") in arch/arm64/kernel/vmcore_info.c
def kernel_pac_mask(vmcoreinfo: Mapping[str, str]) -> tuple[int, str]:
    """``ptrauth_kernel_pac_mask()`` of the dumped kernel, and where it came from.

    ``NUMBER(KERNELPACMASK)`` first (0 means the system has no address
    authentication: stripping is then the identity, as ``xpaclri`` is a NOP);
    else ``GENMASK_ULL(63, vabits_actual)`` with ``vabits_actual = 64 -
    NUMBER(TCR_EL1_T1SZ)``, else with ``NUMBER(VA_BITS)``; else no stripping.
    """
    mask = _vmcoreinfo_number(vmcoreinfo, "KERNELPACMASK")
    if mask is not None:
        return mask & _U64, f"NUMBER(KERNELPACMASK)={mask:#x}"
    t1sz = _vmcoreinfo_number(vmcoreinfo, "TCR_EL1_T1SZ")
    if t1sz is not None and 0 < t1sz < 64:
        return genmask_ull(63, 64 - t1sz), f"GENMASK(63, 64 - NUMBER(TCR_EL1_T1SZ)={t1sz})"
    va_bits = _vmcoreinfo_number(vmcoreinfo, "VA_BITS")
    if va_bits is not None and 0 < va_bits < 64:
        return genmask_ull(63, va_bits), f"GENMASK(63, NUMBER(VA_BITS)={va_bits})"
    return 0, "no PAC mask in VMCOREINFO: return addresses are used as read"


# ptrauth_clear_pac() (v6.1 asm/compiler.h), behind v6.1's ptrauth_strip_insn_pac()
#: GENMASK_ULL(54, 0): the bits below 55 (ptrauth_clear_pac()'s user mask is the PAC mask within them)
_GENMASK_54_0 = genmask_ull(54, 0)


def ptrauth_clear_pac(ptr: int, mask: int) -> int:
    """v6.1: bit 55 set ORs the kernel mask in; clear, it clears the user mask ``GENMASK(54, vabits)``."""
    return (ptr | mask) if ptr & BIT55 else (ptr & ~(mask & _GENMASK_54_0))


# ptrauth_strip_kernel_insn_pac() (asm/compiler.h: xpaclri), offline form
def ptrauth_strip_kernel_insn_pac(ptr: int, mask: int) -> int:
    """Strip a PAC with the bit-55 rule: bit 55 set gives a kernel pointer (high bits
    set), clear gives a user pointer (high bits cleared). An unsigned address is unchanged."""
    return (ptr | mask) if ptr & BIT55 else (ptr & ~mask)
