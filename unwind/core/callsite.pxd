cimport cython
from unwind.core.frame cimport Frame

# every Flag combination, indexed by its value
cdef tuple _FLAGS

cdef class CallSite:
    cdef public object status
    cdef public Py_ssize_t flag
    cdef public object _addr, _code, _backend, _insn, _later

cdef class CallSiteChecker:
    cdef public object backend, image
    cdef public dict _cache
    cdef object __weakref__  # the batch keeps its verdicts per checker where there is no image

    cpdef CallSite check(self, object ret)

    @cython.locals(frame=Frame, site=CallSite, flags=cython.Py_ssize_t)
    cpdef annotate_frames(self, list frames)
