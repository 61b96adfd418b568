"""The Flower ClientApp: each message runs fedshard's Site for this node.

Flower may start a fresh process per message, so this module imports only Flower at
the top; the site, its task and torch load inside the handlers. The site's state
(parameter shards, model version) lives on disk under its state directory; a process
that handles several messages keeps its Site, and so its model, between them
(:func:`fedshard.assembly.site_for`).

Deployment (``fedshard site up``): the node config gives ``site-config``, the site's own
config file on its host (federation config copy, state folder, key bundle), plus
``site-id`` and ``jurisdiction``, which must match it. Nothing the aggregator sends can
point the site at other files.

Simulation: ``config`` (federation YAML) and ``state-root`` from the run config (or the
defaults given to :func:`create_client_app`); the node config gives ``partition-id``
(the n-th site of the config) or ``site-id``, and may give ``state-dir``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedshard._heap import release_free_memory

if TYPE_CHECKING:
    from fedshard.config import FederationConfig
    from fedshard.site.site import Site

__all__ = ["create_client_app"]


def _site(context: Context, defaults: Mapping[str, Any]) -> Site:
    """The site this node runs: from its own config file (deployment) or the run config (simulation)."""
    from pathlib import Path

    from fedshard.assembly import deployed_site_for, site_for

    node = dict(context.node_config)
    if "site-config" in node:  # deployment: the site's own config file, on its own host
        return deployed_site_for(
            Path(str(node["site-config"])),
            site_id=str(node.get("site-id", "")),
            jurisdiction=str(node.get("jurisdiction", "")),
        )
    settings = {**defaults, **dict(context.run_config)}
    path = str(settings["config"])
    stat = os.stat(path)
    config = _federation(path, stat.st_mtime_ns, stat.st_size)
    # simulation numbers the nodes, the n-th being the config's n-th site
    site_id = str(node["site-id"]) if "site-id" in node else config.sites[int(node["partition-id"])].id
    state_root = Path(str(node["state-dir"])).parent if "state-dir" in node else Path(str(settings["state-root"]))
    # the zones' real endpoints: a simulation's host started them on free ports (one host, one operator)
    zones = str(settings.get("zones", "") or "")
    return site_for(config, site_id, state_root, endpoints=json.loads(zones) if zones else None)


@functools.lru_cache(maxsize=4)
def _federation(path: str, mtime_ns: int, size: int) -> FederationConfig:
    """The federation config in ``path``, parsed once per version of the file (per process)."""
    from fedshard.config import load_federation

    return load_federation(path)


def _handle(kind_value: str, msg: Message, context: Context, defaults: Mapping[str, Any]) -> Message:
    from fedshard.protocol.messages import MessageKind
    from fedshard.transports.flower.records import REQUESTS, pack, unpack

    site = _site(context, defaults)
    kind = MessageKind(kind_value)
    try:
        reply = site.handle(kind, unpack(msg, REQUESTS[kind]))
    finally:  # a warm worker answers message after message: give back what training freed
        release_free_memory()
    return Message(content=pack(reply), reply_to=msg)


def create_client_app(defaults: Mapping[str, Any] | None = None) -> ClientApp:
    """A ClientApp whose settings are ``defaults`` overridden by the run config."""
    client_app = ClientApp()
    base = dict(defaults or {})

    @client_app.query()
    def query(msg: Message, context: Context) -> Message:
        return _handle("query", msg, context, base)

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        return _handle("train", msg, context, base)

    @client_app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return _handle("evaluate", msg, context, base)

    return client_app
