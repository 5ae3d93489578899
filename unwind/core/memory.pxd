cimport cython

# no words yet: a typed view, so a new cursor takes it without checking a buffer again
cdef const unsigned long long[:] _NO_WORDS

cdef class Memory:
    cdef public object holes
    cdef public object segments
    cdef public list _starts
    cdef public list _ends
    cdef public object _sizes
    cdef public Py_ssize_t _hit
    cdef public object _lo
    cdef public object _hi
    cdef public list _words
    cdef public object chunk
    cdef public object table
    cdef object __weakref__

    @cython.locals(i=cython.Py_ssize_t)
    cpdef Py_ssize_t _find(self, object addr, object size) except -1
    # view: the segment's words as a typed view, kept as the object a cursor takes them from without a buffer check
    @cython.locals(i=cython.Py_ssize_t, view=const_ulonglong[:])
    cpdef words(self, object addr, object size)
    @cython.locals(i=cython.Py_ssize_t)
    cpdef read_u64(self, object addr)

@cython.final
cdef class WordCursor:
    cdef public Memory mem
    cdef public unsigned long long start
    cdef const unsigned long long[:] words
    cdef public Py_ssize_t last

    cpdef _load(self, object addr, object size)
    # off: (addr - start) mod 2**64 as a signed C integer: in [0, last] exactly when addr is in the kept words
    @cython.locals(a=cython.ulonglong, off=cython.longlong)
    cpdef object word(self, object addr)
    @cython.locals(a=cython.ulonglong, off=cython.longlong, i=cython.Py_ssize_t)
    cpdef tuple pair(self, object addr)
