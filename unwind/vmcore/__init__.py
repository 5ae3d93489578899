"""Real crash dumps (vmcores): physical memory, VMCOREINFO, and kernel virtual memory over them."""
