"""The Flower ServerApp: fedshard's Coordinator driven over Flower's Grid.

Run settings (``run_config`` under ``flwr run``, or the defaults given to
:func:`create_server_app` by ``fedshard simulate --engine flower``):

``config``      path of the federation YAML
``zones``       JSON ``{zone name: endpoint}`` (default: endpoints from the config)
``events``      path of the JSON-lines event log (default: ``events.jsonl``)
``zone-tls``    JSON ``{"cert", "key", "ca"}``: the certificate the coordinator shows zones
                (mutual TLS; empty: plain text)
``resume``      non-empty: resume the run recorded in ``events`` from its last completed round
``membership``  non-empty: take, between rounds, the changes the aggregator host prepares in
                the run folder (the folder of ``config``; :mod:`fedshard.membership.deployed`)
``ledger-heads`` path of the aggregator host's ledger book: every site's ledger head and spend
                across runs (:mod:`fedshard.coordinator.ledger_book`); empty: none
``site-keys``   folder of the sites' manifest-signing public keys (``<site>.pub``): each node must
                prove which site it is with its site's key (:mod:`fedshard.coordinator.binding`).
                Without it, a simulation reads them from ``state-root`` (``<site>/signing.key.pub``);
                with neither, no proof is asked (the first node per site id is kept)
"""

from __future__ import annotations

import json
import pathlib
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

if TYPE_CHECKING:
    from fedshard.coordinator.binding import SiteKeys

__all__ = ["create_server_app", "site_keys"]


def create_server_app(
    defaults: Mapping[str, Any] | None = None, *, engine_stopped: threading.Event | None = None
) -> ServerApp:
    """A ServerApp whose settings are ``defaults`` overridden by the run config.

    ``engine_stopped`` (simulation only) is set when Flower's engine has stopped; the
    coordinator then stops waiting for replies that cannot come.
    """
    server_app = ServerApp()
    alive = None if engine_stopped is None else (lambda: not engine_stopped.is_set())

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        from fedshard.assembly import tls_connector
        from fedshard.assembly.coordination import coordinate
        from fedshard.config import load_federation
        from fedshard.coordinator.events import EventLog
        from fedshard.crypto.tls import TlsFiles
        from fedshard.transports.flower.compat.waits import shorten_grid_pulls
        from fedshard.transports.flower.grid import FlowerSiteGateway
        from fedshard.transports.flower.host_watch import stop_with_host

        stop_with_host()  # deployed: no coordinator outlives its aggregator host
        shorten_grid_pulls()  # replies are pulled as soon as they are there
        settings = {**(defaults or {}), **dict(context.run_config)}
        config = load_federation(str(settings["config"]))
        endpoints = (
            json.loads(str(settings["zones"])) if settings.get("zones") else {z.name: z.endpoint for z in config.zones}
        )
        events = EventLog(str(settings.get("events", "events.jsonl")))
        gateway = FlowerSiteGateway(
            grid, min_nodes=len(config.sites), wait_s=config.federation.round_timeout_s, engine_alive=alive
        )
        tls = TlsFiles(**json.loads(str(settings["zone-tls"]))) if settings.get("zone-tls") else None
        connect = tls_connector(tls, {z.name: z.region for z in config.zones})  # each zone's identity checked
        zones = {name: connect(name, ep) for name, ep in endpoints.items()}
        membership = None
        if settings.get("membership"):
            from pathlib import Path

            from fedshard.membership.deployed import FolderMembership

            run_dir = Path(str(settings["config"])).parent
            membership = FolderMembership(config, run_dir, zones, tls, journal=events)
        coordinate(
            config,
            gateway,
            zones,
            endpoints,
            events,
            resume=bool(settings.get("resume")),
            membership=membership,
            ledger_heads=str(settings["ledger-heads"]) if settings.get("ledger-heads") else None,
            site_keys=site_keys(settings),
        )

    return server_app


def site_keys(settings: Mapping[str, Any]) -> SiteKeys | None:
    """Where the coordinator reads the sites' public keys (see the module docstring); None: nowhere."""
    from fedshard.assembly import load_site_keys

    if settings.get("site-keys"):
        folder = pathlib.Path(str(settings["site-keys"]))
        return lambda: load_site_keys(folder)
    if settings.get("state-root"):
        root = pathlib.Path(str(settings["state-root"]))
        return lambda: _state_site_keys(root)
    return None


def _state_site_keys(state_root: pathlib.Path) -> dict[str, bytes]:
    """The public keys of the sites whose state folders are under ``state_root`` (a simulation:
    ``<site>/signing.key.pub``), by site id."""
    from fedshard.assembly import SIGNING_KEY_FILE
    from fedshard.crypto.signing import load_public_key, public_key_bytes, public_key_path

    folders = sorted(p for p in state_root.iterdir() if p.is_dir()) if state_root.is_dir() else []
    pubs = {f.name: public_key_path(f / SIGNING_KEY_FILE) for f in folders}
    return {site: public_key_bytes(load_public_key(pub.read_bytes())) for site, pub in pubs.items() if pub.is_file()}
