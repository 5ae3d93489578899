"""A package's public names, each imported from its module on first use (PEP 562).

A package lists, per module, the names it exports::

    __getattr__, __dir__ = lazy_exports(__name__, globals(), {"replay": ("Session", "Options")})

so that importing the package loads none of those modules until one of their names is read.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's module ``__getattr__`` and ``__dir__`` for ``exports`` (module: names).

    A name read once is kept in ``namespace`` (the package's globals), so it is looked up only once.
    """
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__
