cimport cython

cdef class StackInfo:
    cdef public object low, high, kind, cpu

    cpdef bint on_stack(self, object sp, object size)
    cpdef str label(self)

cdef class StackSet:
    cdef public StackInfo stack
    cdef public list stacks
    cdef public tuple _known

    @cython.locals(info=StackInfo)
    cpdef StackInfo find(self, object sp, object size)
    cpdef consume(self, StackInfo info, object sp, object size)
    @cython.locals(info=StackInfo)
    cpdef StackInfo kind_of(self, object addr)
