cdef class Target:
    cdef public object arch, mem, task, release, vmcoreinfo, symbols, image, info, options, shared
