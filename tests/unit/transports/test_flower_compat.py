"""Every Flower internal fedshard relies on is listed in one place
(:data:`fedshard.transports.flower.compat.INTERNALS`), exists in the installed Flower, and is
named nowhere outside the compat package: a new reliance on Flower's internals shows up here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fedshard.transports.flower.compat import INTERNALS, missing_internals
from fedshard.transports.flower.compat._release import SUPPORTED

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "fedshard"
COMPAT = PACKAGE / "transports" / "flower" / "compat"
PUBLIC = ("flwr.app", "flwr.clientapp", "flwr.serverapp", "flwr.simulation", "flwr.common")
"""Flower's documented API: what any Flower app imports."""
_MODULE = re.compile(r"^flwr(\.[a-z_0-9]+)+$")


def _internal(module: str) -> bool:
    return not any(module == p or module.startswith(p + ".") for p in PUBLIC)


def _references(path: Path) -> set[tuple[str, str]]:
    """The Flower internals ``path`` names: ``(module, name)`` of every import from an internal
    module (name "" for a module named in a string, as for ``importlib``)."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flwr.") and node.level == 0:
            if _internal(node.module):
                found |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.name, "") for a in node.names if a.name.startswith("flwr.") and _internal(a.name)}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE.match(node.value):
            found |= {(node.value, "")} if _internal(node.value) else set()
    return found


def test_every_listed_internal_exists_in_the_supported_flower() -> None:
    from importlib.metadata import version

    assert version("flwr").startswith(SUPPORTED)
    assert missing_internals() == []


def test_no_module_outside_the_compat_package_names_a_flower_internal() -> None:
    outside = {
        str(path.relative_to(ROOT)): refs
        for path in sorted(PACKAGE.rglob("*.py"))
        if COMPAT not in path.parents and (refs := _references(path))
    }
    assert outside == {}


def test_every_internal_the_compat_package_imports_is_listed() -> None:
    listed = {(i.module, i.name.split(".")[0]) for i in INTERNALS}
    modules = {i.module for i in INTERNALS} | {f"{i.module}.{i.name}" for i in INTERNALS}
    used = set().union(*(_references(p) for p in COMPAT.rglob("*.py")))
    unlisted = sorted(
        f"{module}:{name}" if name else module
        for module, name in used
        if (name and (module, name) not in listed and f"{module}.{name}" not in modules)
        or (not name and module not in modules)
    )
    assert unlisted == []
