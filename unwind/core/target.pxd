cdef class _Fields:
    pass

cdef class Task(_Fields):
    cdef public object pid, comm, state, cpu, regs, context, stacks, fgraph, kretprobes, user_regs, extra, lacks
    cdef public object task_struct, ppid, tgid, kthread, fgraph_lacks, kretprobes_lacks

cdef class Target(_Fields):
    cdef public object arch, mem, task, release, vmcoreinfo, symbols, image, info, options, shared
