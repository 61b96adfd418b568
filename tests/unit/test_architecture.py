"""The dependency contracts (pyproject ``[tool.importlinter]``) hold, and they can fail.

``lint-imports`` runs on the real tree, then on a copy of it with one forbidden change per
contract: the library importing an entry point, a domain package importing a role, and an
import cycle inside a package.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the source tree and its contracts, importable from ``tmp_path``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("fedshard", "server", "clients"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_each_contract_breaks_on_its_own_forbidden_import(tree: Path) -> None:
    """One copy with four forbidden changes, one per contract; each contract names its own."""
    _append(tree / "fedshard" / "sharding" / "plan.py", "import clients  # noqa")  # library -> entry point
    _append(tree / "fedshard" / "store" / "catalog.py", "import fedshard.site.site  # noqa")  # domain -> role
    # zone._push is imported by zone.aggregator (through zone._intake); importing back closes a cycle
    _append(tree / "fedshard" / "zone" / "_push.py", "import fedshard.zone.aggregator  # noqa")
    _append(tree / "fedshard" / "deploy" / "status.py", "import fedshard.simulate.run  # noqa")  # deploy -> simulate
    result = _lint(tree)
    assert result.returncode != 0
    assert "0 kept, 4 broken" in result.stdout, result.stdout
    assert "fedshard.deploy.status -> fedshard.simulate.run" in result.stdout
    assert "fedshard.sharding.plan -> clients" in result.stdout
    assert "fedshard.store.catalog -> fedshard.site.site" in result.stdout
    assert "No cycles are allowed in fedshard.zone" in result.stdout


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_a_private_module_is_imported_only_inside_its_own_package() -> None:
    """A package's surface is its ``__init__`` and its public modules; ``_name`` modules are its own."""
    leaks = []
    for package in ("fedshard", "server", "clients", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for target in _imported(path):
                parts = target.split(".")
                private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
                if private is None or not target.startswith("fedshard.") or private == 1:
                    continue  # fedshard._fs and the like are the library's own helpers
                owner = ".".join(parts[:private])
                if not (module == owner or module.startswith(owner + ".")):
                    leaks.append(f"{module} imports {target}")
    assert leaks == []


def test_every_package_surface_resolves() -> None:
    """Every name a package's ``__init__`` lists in ``__all__`` is there."""
    import importlib
    import pkgutil

    import fedshard

    for info in pkgutil.walk_packages(fedshard.__path__, "fedshard."):
        if not info.ispkg:
            continue
        package = importlib.import_module(info.name)
        missing = [name for name in getattr(package, "__all__", []) if not hasattr(package, name)]
        assert missing == [], info.name


def test_no_test_module_imports_another() -> None:
    """What tests share lives in helper modules (``tests/*_helpers.py``, ``tests/toy_*.py``)."""
    imports = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        imports += [
            f"{path.relative_to(ROOT)} imports {t}" for t in _imported(path) if t.split(".")[-1].startswith("test_")
        ]
    assert imports == []
