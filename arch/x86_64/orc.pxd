cdef class OrcEntry:
    cdef readonly Py_ssize_t sp_offset, bp_offset, sp_reg, bp_reg, type
    cdef readonly bint signal
