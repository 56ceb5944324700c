"""Names a package offers without importing them: bound at first use (PEP 562).

A vLLM worker imports :mod:`spectune.kernels` for its registry, and then only the kernels
it routes; the kernels' modules (Triton's compiler front end, their ``@triton.jit``
functions) load when one of their names is first used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A ``__getattr__`` and a ``__dir__`` for ``package`` that import each of ``names``
    from its module on first use and bind it in the package (later uses are plain
    lookups).

    Args:
        package: The package's ``__name__`` (already in ``sys.modules``).
        names: Name -> module holding it (``.module`` is relative to ``package``). No
            name may be a submodule's: importing that module would rebind the name.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
