"""A package's public names imported on first use (PEP 562), so importing the package stays cheap.

A command that only parses its flags, or a module that needs one small submodule of a package
(``sidecar.locking``, ``mp4.index``), does not pay for the package's heavy members (PyAV, torch).
``from package import name`` works the same either way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a public name to the module
    (relative to ``package``) it is imported from; a name, once imported, is kept in ``namespace``."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
