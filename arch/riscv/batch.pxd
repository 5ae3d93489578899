cimport cython
from unwind.core.stackinfo cimport StackInfo

@cython.locals(ctx=dict, stack=StackInfo)
cpdef lane_of(object task)
