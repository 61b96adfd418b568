"""A package's public names, imported on first use (PEP 562).

A package's ``__init__`` lists its surface (``__all__``, and the same names under
``TYPE_CHECKING`` for type checkers) and where each lives; a name is imported when it is
first asked for. So importing one light module of a package (a CLI command's) never
imports the package's heavy ones (gRPC, Flower, torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_surface"]


def lazy_surface(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name of ``homes`` imported from its
    module (``homes[name]``, within the package) on first use, then kept."""

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return attribute
