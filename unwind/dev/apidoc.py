"""``python -m unwind.dev.apidoc OUT``: the API reference of the library, built from its docstrings.

It documents what ``unwind`` exports (``unwind.__all__``: :class:`~unwind.Session`, :class:`~unwind.Task`,
:class:`~unwind.Frame`, the walk and its adapters, ...) with pdoc, the ``docs`` extra
(``pip install '.[docs]'``), into ``OUT/unwind.html`` (``OUT/index.html`` leads there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: the module whose exports are the public API
PUBLIC = "unwind"


def build(out: Path) -> Path:
    """Write the reference into ``out``; the page of the public API. Raises ``ImportError`` without pdoc."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="restructuredtext", show_source=False,
                          footer_text="unwind: the Linux kernel's stack unwinders, replayed")
    pdoc.pdoc(PUBLIC, output_directory=out)
    return out / f"{PUBLIC}.html"


def main(argv: list[str] | None = None) -> int:
    """The command line: 0 when written, 2 without pdoc."""
    p = argparse.ArgumentParser(prog="python -m unwind.dev.apidoc", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="folder to write the HTML reference into")
    args = p.parse_args(argv)
    try:
        page = build(args.out)
    except ImportError:
        print("unwind: error: the API reference needs pdoc: pip install '.[docs]'", file=sys.stderr)
        return 2
    print(f"wrote {page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
