cdef class Frame:
    cdef public object pc, sp, fp, source, stack, flags, provenance, symbol, extra, pt_regs, line, inlined
