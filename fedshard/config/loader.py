"""Loading YAML config files into validated models, with one-line errors."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple, TypeVar, cast

import yaml
from pydantic import BaseModel, ValidationError

from fedshard.config._deployment import resolve_paths
from fedshard.config._models import FederationConfig, SiteConfig, SiteLocalConfig
from fedshard.errors import ConfigError

__all__ = ["DeployedSite", "load_deployed_site", "load_federation", "load_model", "load_site", "parse_model"]

M = TypeVar("M", bound=BaseModel)


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"]
    if not loc and first["type"] == "value_error":  # a model-wide check: its message names the keys itself
        return msg.removeprefix("Value error, ") + _more(error)
    loc = loc or "(top level)"
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; see configs/demo.yaml for the accepted keys)"
    elif first["type"] == "missing":
        msg = "required key is missing"
    else:
        value = first.get("input")
        if value is not None and not isinstance(value, dict | list):
            msg = f"{msg} (got {value!r})"
    return f"{loc}: {msg}" + _more(error)


def _more(error: ValidationError) -> str:
    more = len(error.errors()) - 1
    return f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""


_KINDS: dict[str, tuple[frozenset[str], str]] = {
    "FederationConfig": (
        frozenset({"zones", "sites"}),
        "a federation config (zones:, sites:; e.g. configs/aggregator.yaml)",
    ),
    "SiteLocalConfig": (frozenset({"site"}), "a site's own config (site:; e.g. configs/sites/<site>.yaml)"),
}
"""Config kinds a command may be handed by mistake: model name → (top-level keys only it has, what it is)."""


def _swapped(model: type[BaseModel], data: dict[str, object]) -> str | None:
    """Why ``data`` is another kind of config than ``model`` (the federation's and a site's swapped); None if not."""
    wanted = _KINDS.get(model.__name__)
    if wanted is None or wanted[0] & data.keys():
        return None
    for name, (keys, what) in _KINDS.items():
        if name != model.__name__ and keys & data.keys():
            return f"this is {what}, and this command takes {wanted[1]}; were the two files swapped?"
    return None


def parse_model(model: type[M], data: object, source: str) -> M:
    """Validate plain data against ``model``; raise :class:`ConfigError` naming ``source``
    (and saying so when the file is the other kind of config: a site's for a federation's)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    swapped = _swapped(model, data)
    if swapped is not None:
        raise ConfigError(f"{source}: {swapped}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def load_model(model: type[M], path: str | Path) -> M:
    """Read a YAML file and validate it against ``model``.

    The file is read every time; what it says is parsed once per content (a deployed
    site reads its configs for every message, and parsing YAML costs milliseconds). The
    models are frozen, so callers share the parsed one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a YAML config file (not UTF-8 text); give the federation's YAML file") from None
    return cast(M, _parsed(model, text, str(p)))  # the cache's wrapper loses the type variable


@functools.lru_cache(maxsize=32)
def _parsed(model: type[M], text: str, source: str) -> M:
    """``text`` (a YAML file's content, read from ``source``) validated against ``model``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return parse_model(model, data, source)


def load_federation(path: str | Path) -> FederationConfig:
    """Load and validate a federation config file; paths in ``deployment`` are resolved against its folder."""
    config = load_model(FederationConfig, path)
    if config.deployment is None:
        return config
    deployment = resolve_paths(config.deployment, Path(path).parent, ("keys", "state_dir"))
    return config.model_copy(update={"deployment": deployment})


def load_site(path: str | Path) -> SiteLocalConfig:
    """Load a site's own config; its paths (``state_dir``, ``deployment``) are resolved against the file's folder."""
    config = load_model(SiteLocalConfig, path)
    base = Path(path).parent
    state_dir = (base / config.site.state_dir).resolve()
    update: dict[str, object] = {"site": config.site.model_copy(update={"state_dir": state_dir})}
    if config.deployment is not None:
        update["deployment"] = resolve_paths(config.deployment, base, ("federation", "keys"))
    return config.model_copy(update=update)


class DeployedSite(NamedTuple):
    """A deployed site's own config, its copy of the federation config, and its entry there."""

    local: SiteLocalConfig
    federation: FederationConfig
    listed: SiteConfig


def load_deployed_site(path: str | Path) -> DeployedSite:
    """Load a site's own config with a ``deployment`` section and the federation config it
    names; the federation must list the site, with the same jurisdiction."""
    local = load_site(path)
    if local.deployment is None:
        raise ConfigError(f"{path}: no `deployment` section (federation, keys, superlink, port)")
    federation = load_federation(local.deployment.federation)
    try:
        listed = federation.site(local.site.id)
    except KeyError:
        raise ConfigError(
            f"{local.deployment.federation}: site {local.site.id!r} is not in the federation's sites"
        ) from None
    if listed.jurisdiction != local.site.jurisdiction:
        raise ConfigError(
            f"{path}: jurisdiction {local.site.jurisdiction} differs from the federation's entry "
            f"({listed.jurisdiction})"
        )
    return DeployedSite(local, federation, listed)
