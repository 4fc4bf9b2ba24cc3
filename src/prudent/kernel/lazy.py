"""Package names imported on first use (PEP 562), so that importing one module of a package
(its settings, say) does not import all of them, torch and the components included."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` giving each name of ``exports`` (name -> module) on first use."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the name Python looks up
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
