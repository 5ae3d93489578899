cimport cython

@cython.final
cdef class WordCursor:
    cdef public object mem
    cdef public object start
    cdef const unsigned long long[:] words
    cdef public object last

    cpdef _load(self, object addr, object size)
    @cython.locals(off=object, i=cython.Py_ssize_t)
    cpdef object word(self, object addr)
    @cython.locals(off=object, i=cython.Py_ssize_t)
    cpdef tuple pair(self, object addr)
