"""The Flower ClientApp: each message runs fedshard's Site for this node.

Flower may start a fresh process per message, so this module imports only Flower at
the top; the site, its task and torch load inside the handlers. The site's state
(parameter shards, model version) lives on disk under its state directory.

Settings: ``config`` (federation YAML) and ``state-root`` from the run config (or the
defaults given to :func:`create_client_app`); the node config gives ``site-id``
(deployment) or ``partition-id`` (simulation: the n-th site of the config), and may
give ``state-dir``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

__all__ = ["app", "create_client_app"]


def _handle(kind_value: str, msg: Message, context: Context, defaults: Mapping[str, Any]) -> Message:
    from pathlib import Path

    from fedshard.config import load_federation
    from fedshard.runtime.assembly import make_site
    from fedshard.runtime.flower.records import REQUESTS, pack, unpack
    from fedshard.runtime.messages import MessageKind

    settings = {**defaults, **dict(context.run_config)}
    node = dict(context.node_config)
    config = load_federation(str(settings["config"]))
    # deployment names the site; simulation numbers the nodes, the n-th being the config's n-th site
    site_id = str(node["site-id"]) if "site-id" in node else config.sites[int(node["partition-id"])].id
    state_root = Path(str(node["state-dir"])).parent if "state-dir" in node else Path(str(settings["state-root"]))
    site = make_site(config, site_id, state_root)
    kind = MessageKind(kind_value)
    reply = site.handle(kind, unpack(msg, REQUESTS[kind]))
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


app = create_client_app()
