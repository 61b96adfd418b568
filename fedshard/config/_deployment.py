"""Deployment settings: where the aggregator and each site run, and where their keys lie.

The aggregator's config is the federation config plus a ``deployment`` section; a
site's own config (``configs/sites/<site>.yaml``) has a ``deployment`` section of its
own. Paths in both are relative to the file that holds them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["AggregatorDeployment", "SiteDeployment", "resolve_paths"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_HOST_PORT = re.compile(r"^[\w.\-\[\]:]+:\d{1,5}$")


def _host_port(v: str) -> str:
    if not _HOST_PORT.match(v):
        raise ValueError(f"must be host:port, got {v!r}")
    if not 0 < int(v.rsplit(":", 1)[1]) <= 65535:
        raise ValueError(f"{v!r}: the port must be between 1 and 65535")
    return v


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AggregatorDeployment(_Model):
    """The aggregator host: its SuperLink, the zones it runs, its keys and state."""

    keys: Path = Field(Path("keys"), description="the folder `fedshard keys init --out` wrote")
    state_dir: Path = Field(Path("runs/aggregator"), description="SuperLink database, zone stores, events, summary")
    superlink: str = Field("127.0.0.1:9092", description="host:port sites dial (the SuperLink's Fleet/Control API)")
    listen: str = Field("127.0.0.1", description="interface the SuperLink binds; 0.0.0.0 for every interface")
    hosts: list[str] = Field(
        default_factory=list, description="extra DNS names/IPs for the SuperLink certificate (its address's host is in)"
    )
    zones: list[Annotated[str, Field(pattern=_NAME)]] | None = Field(
        None,
        description="zones this host runs (default: every zone of the federation; []: none, each runs on its own host)",
    )
    tls: bool = Field(True, description="TLS and SuperNode authentication; false needs `--insecure`")
    wait_s: float = Field(300.0, gt=0, description="how long to wait for federation.min_sites sites to connect")

    @field_validator("superlink")
    @classmethod
    def _address(cls, v: str) -> str:
        return _host_port(v)

    @property
    def superlink_port(self) -> int:
        """The SuperLink's port."""
        return int(self.superlink.rsplit(":", 1)[1])

    @property
    def superlink_host(self) -> str:
        """The host sites dial."""
        return self.superlink.rsplit(":", 1)[0].strip("[]")


class SiteDeployment(_Model):
    """A site host: the federation it joins, its key bundle, the SuperLink it dials."""

    federation: Path = Field(description="the site's copy of the federation config (the aggregator's YAML)")
    keys: Path = Field(description="this site's bundle from `fedshard keys init` (keys/sites/<site>)")
    superlink: str = Field(description="host:port of the aggregator's SuperLink")
    port: int = Field(9094, ge=1, le=65535, description="the SuperNode's local ClientApp port; distinct per host")
    tls: bool = Field(True, description="TLS and SuperNode authentication; false needs `--insecure`")
    executor: Literal["warm", "flower"] = Field(
        "warm",
        description="how each message runs: `warm` forks it from a process that imported torch and fedshard once "
        "(fedshard.transports.flower.compat.warm_executor); `flower` is Flower's stock executor "
        "(a fresh process per message)",
    )
    poll_s: float = Field(
        0.2, ge=0.02, le=3.0, description="with `warm`: how often an idle SuperNode asks for a message (Flower: 3 s)"
    )

    @field_validator("superlink")
    @classmethod
    def _address(cls, v: str) -> str:
        return _host_port(v)


M = TypeVar("M", bound=BaseModel)


def resolve_paths(model: M, base: Path, fields: tuple[str, ...]) -> M:
    """A copy of ``model`` whose path ``fields`` are resolved against ``base`` (absolute ones stay)."""
    update = {name: (base / getattr(model, name)).resolve() for name in fields}
    return model.model_copy(update=update)
