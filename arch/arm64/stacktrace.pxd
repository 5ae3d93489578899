cimport cython
from unwind.core.stackinfo cimport StackInfo, StackSet
from unwind.core.frame cimport Frame
from unwind.core.memory cimport WordCursor
from unwind.core.target cimport Target, Task
from unwind.arch.arm64.ptrauth cimport ptrauth_strip_kernel_insn_pac, ptrauth_clear_pac

cdef class KunwindState:
    cdef public object fp, pc
    cdef public StackSet stacks
    cdef public object graph_idx, kr_cur
    cdef public object source, flags, regs, mem
    cdef public bint meta_records, kunwind, first_pc_recovered, fgraph_idx
    cdef public object layout, final_fp
    cdef public object pac_mask
    cdef public object return_to_handler, kretprobe_trampoline, fgraph, kretprobes, prov
    cdef public bint record
    cdef public object fgraph_lacks, kretprobes_lacks
    cdef public WordCursor cursor

cpdef bint user_mode(object pstate)

@cython.locals(info=StackInfo)
cpdef task_stack(object stacks)

cpdef task_pt_regs_stackframe(object task_stack_info, object layout)

cpdef tuple walk_constants(Target target)

cpdef kunwind_init(KunwindState state)

cpdef kunwind_init_from_regs(KunwindState state, object regs)

cpdef kunwind_init_from_caller(KunwindState state, object context)

cpdef kunwind_init_from_task(KunwindState state, object context)

cpdef kunwind_recover_return_address(KunwindState state)

@cython.locals(cur=StackInfo)
cpdef unwind_find_stack(KunwindState state, object sp, object size, str what)

@cython.locals(stacks=StackSet)
cpdef unwind_consume_stack(KunwindState state, StackInfo info, object sp, object size)

cpdef unwind_next_frame_record(KunwindState state)

cpdef kunwind_next(KunwindState state)

@cython.locals(info=StackInfo)
cpdef kunwind_next_frame_record(KunwindState state)

from unwind.core.walk cimport Unwinder

cdef class Arm64Unwinder(Unwinder):
    cdef public Target target
    cdef public object consts, generation
    cdef public KunwindState state
    cdef public object completer, _pending, _deferred, _stack_obj, _stack_label

    @cython.locals(task=Task)
    cpdef _begin(self)
    @cython.locals(state=KunwindState, task=Task)
    cpdef Frame _first_frame(self)
    cpdef start(self)
    cpdef next(self)

cpdef tuple _read_record(KunwindState state, object fp)
