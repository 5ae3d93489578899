cimport cython
from unwind.core.stackinfo cimport StackInfo
from unwind.arch.x86_64.unwind_orc cimport task_on_another_cpu

@cython.locals(ctx=dict, stack=StackInfo)
cpdef lane_of(object task)
