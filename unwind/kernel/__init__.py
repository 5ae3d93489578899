"""The kernel model: a stopped kernel read through BTF (tasks, CPUs, modules), struct layouts,
symbols and KASLR."""
