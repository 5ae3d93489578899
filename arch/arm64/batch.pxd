cimport cython
from unwind.core.stackinfo cimport StackInfo
from unwind.core.target cimport Task
from unwind.session.batch cimport LaneReader

cdef class PlainLanes(LaneReader):
    @cython.locals(ctx=dict, stacks=list, stack=StackInfo)
    cpdef bint lane(self, Task task, unsigned long long[::1] words, Py_ssize_t at) except -1
