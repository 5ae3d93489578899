"""The ``unwind`` commands."""
