"""Architecture backends, installed as ``unwind.arch``; each registers itself on import."""
