"""The bounds the ``UNWIND`` note's schema holds a note to: the largest value a kernel of the three arches has.

The schema (:mod:`unwind.formats.note_schema`) checks a note against them; the kernel read from a vmcore
(:mod:`unwind.kernel.model`) holds what it reads to the same ones. They are kept apart from the schema,
which imports ``pydantic_core``, and from the note's reader (:mod:`unwind.formats.note`), which imports
the schema when it validates a note.
"""

from __future__ import annotations

#: the largest stack range a note may declare: 16x the largest THREAD_SIZE any of the three arches
#: configures (arm64 64 KiB pages with KASAN, 128 KiB); real stacks are 4 KiB to 32 KiB
MAX_STACK_BYTES = 2 * 1024 * 1024
#: a dynamic ftrace trampoline is a copy of ftrace_(regs_)caller: a few hundred bytes
MAX_TRAMPOLINE_BYTES = 1024 * 1024
#: CPU numbers and pids: NR_CPUS is at most 8192, PID_MAX_LIMIT 4M
MAX_CPU = 8191
MAX_PID = 4 * 1024 * 1024
#: struct offsets and sizes from BTF (pt_regs is a few hundred bytes)
MAX_STRUCT_BYTES = 1024 * 1024
#: a module region (the largest modules' text is a few MiB)
MAX_MODULE_BYTES = 1 << 30
