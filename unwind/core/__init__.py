"""The walker core, arch-free: the kunwind walk and its adapters, frames, stack ranges, memory, the
walk's target, printed-trace lines, the backend registry and the call-site check."""
