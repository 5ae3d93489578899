"""drgn's task list of a vmcore, recorded as the oracle ``unwind ps`` is tested against.

``python -m unwind.lab.drgn_ps ARCH VMCORE VMLINUX -o FILE.json`` (in a venv with drgn) writes
every task drgn's ``for_each_task()`` yields (pid, comm, ``task_struct``), the command that made
the file and drgn's version.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .translations import drgn_program


def drgn_tasks(vmcore: str | Path, vmlinux: str | Path, arch: str) -> dict[str, Any]:
    """``for_each_task()`` of drgn on ``vmcore``.

    On a filtered dump drgn faults on pages the dump lacks: a task whose pid or comm faults is kept
    under ``unreadable`` (its address and drgn's error), and a fault of the iteration itself ends it
    (``stopped``, drgn's error); ``tasks`` are the ones drgn lists.
    """
    import drgn
    from drgn.helpers.linux.pid import for_each_task

    prog = drgn_program(vmcore, vmlinux, arch)
    tasks: list[dict[str, Any]] = []
    unreadable: list[dict[str, str]] = []
    stopped = None
    it = iter(for_each_task(prog))
    while True:
        try:
            t = next(it)
        except StopIteration:
            break
        except drgn.FaultError as e:
            stopped = str(e)
            break
        try:
            tasks.append({"pid": int(t.pid), "comm": t.comm.string_().decode("utf-8", "replace"),
                          "task": hex(t.value_())})
        except drgn.FaultError as e:
            unreadable.append({"task": hex(t.value_()), "error": str(e)})
    return {"source": "drgn for_each_task", "drgn": drgn.__version__, "vmcore": Path(vmcore).name,
            "command": " ".join(["python -m unwind.lab.drgn_ps", *sys.argv[1:]]), "tasks": tasks,
            "unreadable": unreadable, "stopped": stopped}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m unwind.lab.drgn_ps", description=__doc__.splitlines()[0])
    p.add_argument("arch")
    p.add_argument("vmcore")
    p.add_argument("vmlinux")
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args(argv)
    Path(a.output).write_text(json.dumps(drgn_tasks(a.vmcore, a.vmlinux, a.arch), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
