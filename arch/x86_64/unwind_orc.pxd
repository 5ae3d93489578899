cimport cython
from unwind.core.frame cimport Frame
from unwind.core.memory cimport WordCursor
from unwind.core.walk cimport Unwinder
from unwind.core.target cimport Target, Task
from unwind.arch.x86_64.dumpstack cimport StackInfo, StackFinder
from unwind.arch.x86_64.orc cimport OrcEntry

@cython.locals(extra=dict)
cpdef bint task_on_another_cpu(Task task)

cdef class Regs:
    cdef public object addr, cpu, off

cdef class DumpConstants:
    cdef public object _pt, _view, _table, itf, itf_bp, itf_ret_addr, return_to_handler, rethook_trampoline
    cdef public object ret_from_fork_asm, fgraph_idx

cdef class TableConstants:
    cdef public object table
    cdef public DumpConstants consts
    cdef public object text, stext, etext, _basis
    cdef public dict found

cpdef TableConstants table_constants(Target target, object table)

cdef class OrcUnwinder(Unwinder):
    cdef public Target target
    cdef public object task, mem
    cdef public bint record
    cdef public TableConstants c
    cdef public dict found
    cdef public object stext, etext, return_to_handler, rethook_trampoline
    cdef public StackFinder stacks
    cdef public list stack_mask
    cdef public object ip, sp, bp
    cdef public bint signal, error, full_regs
    cdef public Regs regs, prev_regs
    cdef public StackInfo stack_info
    cdef public object graph_idx, kr_cur
    cdef public Py_ssize_t recovered
    cdef public Frame last
    cdef public WordCursor cursor

    cpdef start(self)
    cpdef next(self)

    cpdef object read_word(self, object addr)
    @cython.locals(info=StackInfo)
    cpdef bint stack_access_ok(self, object addr, object length)
    @cython.locals(info=StackInfo)
    cpdef object deref_stack_reg(self, object addr, str what, object prov)
    cpdef object get_reg(self, str member)
    @cython.locals(info=StackInfo, frame=Frame, task=Task)
    cpdef Frame _start(self)
    @cython.locals(info=StackInfo, frame=Frame, orc=OrcEntry)
    cpdef unwind_next_frame(self)
    cpdef find_orc(self, object ip, object orc, object prov)
    @cython.locals(regs=Regs, frame=Frame)
    cpdef regs_frame(self, Py_ssize_t typ, object source, str stack, Py_ssize_t flags, object prov)
    cpdef object prev_sp_reg(self, OrcEntry orc, object prov)
    cpdef str step_regs(self, object sp, object orig_ip, object prov)
    cpdef str step_regs_partial(self, object sp, object orig_ip, object prov)
    cpdef object unwind_recover_ret_addr(self, object ip, object ip_p, object prov)
    cpdef object unwind_recover_rethook(self, object ip, object ip_p, object prov)
    cpdef check_text(self, object ip)
