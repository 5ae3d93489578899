cimport cython
from unwind.core.target cimport Task

cdef class LaneReader:
    cpdef bint lane(self, Task task, unsigned long long[::1] words, Py_ssize_t at) except -1

@cython.locals(n=Py_ssize_t, width=Py_ssize_t)
cpdef read_lanes(LaneReader reader, object tasks, unsigned long long[::1] words, bytearray taken, Py_ssize_t first)
