cdef class Replay:
    cdef public object target, frames, stop, reliable, _basis
