"""File formats: ELF cores and images, slim images, the project's dump and its note, vmcores
(ELF, kdump-compressed, flattened) and the vmcore opened for replay, the cache files."""
