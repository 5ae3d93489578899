"""``python -m unwind`` runs the ``unwind`` command."""

from .cli import console

console()
