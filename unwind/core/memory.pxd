cimport cython

cdef class Memory:
    cdef public object holes
    cdef public object segments
    cdef public object _starts
    cdef public object _sizes
    cdef public object _hit
    cdef public dict _words
    cdef object __weakref__

    cpdef _segment(self, object addr, object size)
    cpdef words(self, object addr, object size)
    cpdef read_u64(self, object addr)

@cython.final
cdef class WordCursor:
    cdef public Memory mem
    cdef public object start
    cdef const unsigned long long[:] words
    cdef public object last

    cpdef _load(self, object addr, object size)
    @cython.locals(off=object, i=cython.Py_ssize_t)
    cpdef object word(self, object addr)
    @cython.locals(off=object, i=cython.Py_ssize_t)
    cpdef tuple pair(self, object addr)
