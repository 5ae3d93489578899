cpdef object ptrauth_clear_pac(object ptr, object mask)
cpdef object ptrauth_strip_kernel_insn_pac(object ptr, object mask)
