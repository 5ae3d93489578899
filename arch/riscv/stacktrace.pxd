cimport cython
from unwind.core.stackinfo cimport StackInfo, StackSet
from unwind.core.frame cimport Frame
from unwind.core.memory cimport Memory, WordCursor
from unwind.core.walk cimport Unwinder
from unwind.core.target cimport Target, Task

cdef class KernelLayout:
    cdef public tuple text
    cdef public object thread_size, handle_exception, ret_from_exception_end, return_to_handler
    cdef public frozenset rethook_trampolines
    cdef public tuple call_on_irq_stack
    cdef public object ret_from_exception, pt_regs, generation
    cdef public dict basis
    cdef public tuple text0, exc_frame
    cdef public object pt_regs_space
    cdef public tuple head_text
    cdef public bint fgraph_of_task
    cdef public object pt_epc, pt_s0, pt_status, pt_ra
    cdef public object align_less1, align_mask
    cdef public bint align_kept

@cython.locals(s=StackInfo)
cpdef object thread_size(Target target)

@cython.locals(st=StackInfo)
cpdef object task_pt_regs(tuple stacks, object pt_regs_space)

cpdef bint fp_is_valid(object fp, object sp, object thread_size)

cpdef bint kernel_text_address(object addr, tuple text)

cdef class RiscvUnwinder(Unwinder):
    cdef public Target t
    cdef public KernelLayout k
    cdef public Memory mem
    cdef public object ts, prover
    cdef public bint record, complete
    cdef public StackSet stacks
    cdef public object fg_cursor
    cdef public object pc, fp, sp
    cdef public bint sp_from_record
    cdef public object regs_epc, regs_ra, graph_idx, pending_regs, live, pending_frame, inflight, trap_entry
    cdef public object beyond, firmware_ra, kr_cur
    cdef public tuple _kind_cache
    cdef public object block_low, block_top
    cdef public WordCursor cursor

    @cython.locals(task=Task)
    cpdef start(self)
    cpdef next(self)

    @cython.locals(info=StackInfo)
    cpdef _kind(self, object addr)

    cpdef object _read(self, object addr, str what)

    cpdef _next_frame_record(self)

    cpdef object _align_sp(self, object sp)

    cpdef tuple _read_record(self, object rec)

    cpdef _init_from_task(self, object ctx)

    cpdef _invalid_fp_stop(self)

    cpdef _first_frame_stop(self, object fp, object sp, object pc)

    cpdef _leaf_rule(self, object rec, object ra_slot)

    cpdef _exception_frame(self, object rec, object flags, object prov)

    cpdef _next_regs_pc(self)
