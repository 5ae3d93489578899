cimport cython

cdef class StackInfo:
    cdef public object low, high, kind, cpu

cdef class StackSet:
    cdef public StackInfo stack
    cdef public list stacks
    cdef public tuple _known

    @cython.locals(info=StackInfo)
    cpdef StackInfo kind_of(self, object addr)
