cimport cython
from unwind.core.frame cimport Frame

cdef class Unwinder:
    cpdef start(self)
    cpdef next(self)

@cython.locals(count=cython.Py_ssize_t)
cpdef kunwind_stack_walk(Unwinder unwinder, object consume, Py_ssize_t max_frames=*, list frames=*)
