"""``unwind fuzz``: mutate real dumps and check that replay stays within its promises.

Seeds are small dumps cut from the corpus (a few tasks each, with their stacks, the CPUs,
VMCOREINFO and the oracles of those tasks); the slim image of each build is opened once.
Each case applies one mutation family to one seed, in memory:

``stack``  words of a captured stack (self-loops, pointers into and out of the stacks, text
           addresses, PAC-like high bits, zero records)
``regs``   one CPU's ``NT_PRSTATUS`` registers
``json``   the ``UNWIND`` note's values and types (deleted keys, wrong types, out-of-range
           numbers, swapped ranges, deep nesting, huge text)
``vmcoreinfo`` the VMCOREINFO text (bad, huge and negative numbers, junk lines)
``elf``    the ELF header, program headers and note headers of the container
``orc``    what the arch reads from the image (``ArchBackend.fuzz_image``; x86-64: ORC entries
           the walk looks up, and the section parser on a window of the tables)
``btf``    the image's ``.BTF`` (a real blob cut to a small prefix of its types and strings):
           header fields, type records, strings; then the queries the kernel reader makes
``vmcore`` small vmcore files (``--vmcore-seeds``: ELF, kdump-compressed, flattened): headers,
           bitmaps, page descriptors, notes, some then xz-compressed as a whole (the xz stream damaged or
           not); then every page and note is read
``image``  the seed's image as ``--vmlinux`` gets it (the unpacked slim image): ELF and section
           headers, and bytes of .symtab, .strtab, .notes, .BTF and the ORC sections; then it
           is opened, its symbols, BTF and text read, and every task replayed with it
           (:data:`~unwind.dev.fuzz.cases.IMAGE_SHARE` of the cases)
``vmmem``  a committed vmcore slice's memory: 1..8 of the words a clean load read (task_structs,
           lists, runqueues, per-CPU data, page-table entries, stacks, module data); then it is
           loaded as ``Session.load(VMCORE, vmlinux=IMAGE)``, listed (``ps``), converted, and every
           task replayed (:data:`~unwind.dev.fuzz.cases.VMMEM_SHARE` of the cases, under :data:`~unwind.dev.fuzz.cases.VMMEM_CPU_LIMIT`)
``container`` the seed as a compressed file (xz, gzip) whose stream is damaged: bytes set, a run zeroed, cut
           short, junk after it; then the folder search's look at it and ``Dump.open``, and every task
           replayed where it opens (:data:`~unwind.dev.fuzz.cases.CONTAINER_SHARE` of the cases)

and checks, for every task, in faithful, complete, explain (provenance) and reliable mode,
with the trace printed and the oracles compared: no exception but a one-line input error at
open; no case over the CPU bound; no read outside a captured segment (every segment's bytes are
instrumented); at most :func:`unwind.core.walk.frame_limit` frames; every frame value and provenance
read a u64; the batch replay (``Session.replay_all``, what ``replay --all`` walks) the same as
``Session.replay``. ``btf`` and ``vmcore`` cases may raise only ``BtfError``/``VmcoreError`` (one line)
or a ``MemoryFault`` for a page.
Cases are numbered and reproducible: case ``i`` of seed ``S`` is the same everywhere.

:mod:`.seeds` cuts the seeds, :mod:`.mutators` holds one function per family, :mod:`.checks` what a
case must not do, :mod:`.cases` runs one case (:class:`~unwind.dev.fuzz.cases.Fuzzer`), :mod:`.runner`
a campaign, :mod:`.guided` the coverage-guided engine, :mod:`.cli` the command line.
"""
