"""The ``unwind`` program: its console script and ``python -m unwind``."""

from __future__ import annotations

import gc
import os
import sys


def console() -> None:
    """:func:`unwind.cli.main.main`, then exit.

    The cyclic garbage collector is off while the program's modules are imported: nothing they make
    is garbage, yet they would set off ~45 collections (~8 ms of a replay); what they made is then
    frozen out of the collector. Every object is frozen again before the interpreter's exit, whose
    collections would otherwise walk all of them once more for nothing (~30 ms of a replay).

    The program does no linear algebra, so numpy's OpenBLAS gets one thread unless the user chose
    otherwise: its pool of threads costs ~60 ms of CPU when numpy is imported (in this process and in each
    triage worker, which inherit the setting).
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    gc.disable()
    try:
        from .cli.main import main
    finally:
        gc.freeze()
        gc.enable()
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    console()
