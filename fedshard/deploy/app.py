"""The Flower app bundle fedshard submits: ``server/`` (ServerApp) and ``clients/`` (ClientApp).

Built from the installed packages into a folder with a hand-written ``pyproject.toml``
(``flwr new`` needs the network); ``flwr run`` packs it into a FAB and the SuperLink
ships it to the SuperNodes. fedshard itself is not in the bundle: every host has it
installed, and SuperLinks run with ``--disable-runtime-dependency-installation``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from fedshard.errors import DeployError

__all__ = ["APP_NAME", "build_app", "write_run_config"]

APP_NAME = "fedshard-federation"

_PYPROJECT = """\
[project]
name = "{name}"
version = "{version}"
description = "fedshard federation: Coordinator as the ServerApp, Site as the ClientApp"
license = "Apache-2.0"
dependencies = []  # fedshard {version} is installed on every host

[tool.flwr.app]
publisher = "fedshard"

[tool.flwr.app.components]
serverapp = "server.server_app:app"
clientapp = "clients.client_app:app"

[tool.flwr.app.config]
{config}
"""

RUN_CONFIG_KEYS = (
    "config",
    "zones",
    "events",
    "zone-tls",
    "state-root",
    "resume",
    "membership",
    "ledger-heads",
    "site-keys",
)
"""Settings the ServerApp and ClientApp read (see server/server_app.py, clients/client_app.py)."""


def build_app(dest: Path) -> Path:
    """Write the app bundle's folder at ``dest`` (replacing an older one); returns ``dest``."""
    from fedshard import __version__

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("server", "clients"):
        shutil.copytree(_source_folder(package), dest / package, ignore=ignore)
    config = "\n".join(f'{key} = ""' for key in RUN_CONFIG_KEYS)
    (dest / "pyproject.toml").write_text(_PYPROJECT.format(name=APP_NAME, version=__version__, config=config))
    return dest


def _source_folder(package: str) -> Path:
    """Where the entry-point package ``package`` lies, found without importing it (the
    library never imports its entry points)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DeployError(f"cannot find the {package}/ package to bundle; install fedshard from its source tree")
    return Path(next(iter(spec.submodule_search_locations)))


def write_run_config(path: Path, settings: Mapping[str, str]) -> Path:
    """The run-config overrides ``flwr run --run-config`` reads, as TOML (JSON strings are valid TOML
    strings); Flower refuses keys the app's ``[tool.flwr.app.config]`` does not declare."""
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items()))
    return path
