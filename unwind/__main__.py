"""``python -m unwind`` runs the ``unwind`` command."""

import sys

from .cli import main

sys.exit(main())
