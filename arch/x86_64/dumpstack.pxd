cimport cython
from unwind.core.stackinfo cimport StackInfo as CoreStackInfo

cdef class StackInfo:
    cdef public Py_ssize_t type
    cdef public object begin, end, next_sp, kind, cpu

cdef class StackFinder:
    cdef public list stacks
    cdef public object mem, why
    cdef public list _infos
    @cython.locals(i=cython.Py_ssize_t, s=CoreStackInfo, typ=cython.Py_ssize_t, info=StackInfo)
    cpdef StackInfo get_stack_info(self, object addr, list visit_mask)
