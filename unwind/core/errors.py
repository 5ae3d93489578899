"""The errors every layer raises for unusable input: the project's dumps, vmcores and what is read from them.

:class:`DumpError` is the one the command line prints as one line (exit 2). It is declared here, below
the formats, so that a vmcore reader or an arch's address translation raises it without importing the
dump module (:mod:`unwind.formats.dump`, which re-exports it). A read outside the captured memory is a
:class:`unwind.core.memory.MemoryFault` instead: a walk stops on it, it does not end the command.
"""

from __future__ import annotations

import re


class DumpError(Exception):
    """The dump is unusable; the message is one line for the user (a control character the dump's
    own text brings into it is shown escaped: ``\\x0a``)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message))
        #: what reading the dump had to say before it failed (the command line prints them first)
        self.warnings: tuple[str, ...] = ()


#: what would break the message's one line, or the terminal showing it
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
