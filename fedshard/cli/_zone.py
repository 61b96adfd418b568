"""``fedshard zone up``: one zone aggregator as a gRPC server (see README, "Run across machines")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from fedshard.cli._metrics import MetricsHostOpt, MetricsPortOpt, start_metrics
from fedshard.cli._signals import StopSignal
from fedshard.errors import ConfigError, DeployError, FedshardError
from fedshard.observability.server import DEFAULT_METRICS_HOST

if TYPE_CHECKING:
    from fedshard.config import FederationConfig, ZoneConfig
    from fedshard.crypto.tls import TlsFiles
    from fedshard.zone.aggregator import ZoneAggregator

__all__ = ["zone_app"]

zone_app = typer.Typer(no_args_is_help=True, help="Run zone aggregators (the data plane).")
console = Console(stderr=False)
err_console = Console(stderr=True)


@zone_app.command("up")
def zone_up(
    config: Annotated[Path, typer.Option("--config", "-c", help="Federation YAML listing the zones")],
    zone: Annotated[str, typer.Option("--zone", help="Name of the zone to run")],
    store: Annotated[
        Path | None, typer.Option("--store", help="Where aggregates are kept (overrides the config)")
    ] = None,
    cert: Annotated[
        Path | None, typer.Option("--cert", help="The zone's certificate (fedshard pki issue-zone)")
    ] = None,
    key: Annotated[Path | None, typer.Option("--key", help="The zone's private key")] = None,
    ca: Annotated[Path | None, typer.Option("--ca", help="The federation CA certificate (ca.pem)")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Plain-text gRPC (loopback/testing only)")] = False,
    site_keys: Annotated[
        Path | None,
        typer.Option("--site-keys", help="Folder of <site>.pub manifest-signing keys; unsigned manifests are refused"),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            help="Interface to bind (default: the endpoint's host); 0.0.0.0 for every one, e.g. a zone on several "
            "networks",
        ),
    ] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = DEFAULT_METRICS_HOST,
) -> None:
    """Run one zone aggregator as a gRPC server until interrupted (mutual TLS unless --insecure).

    The zone enforces the federation's residency policy on every shard it receives,
    forwards partial sums of global shards to the reducing zone, and records every
    decision in ``audit.jsonl`` in its store (check it with ``fedshard audit verify``).
    Started again on the store of a zone that was stopped or killed, it comes back with
    the aggregates it had published (each checked) and refuses the rounds that were open.
    Between rounds the coordinator may ask it to read --config and --site-keys again
    (zones and sites added to the running federation; the file must list what the
    coordinator's config lists).
    """
    from fedshard.assembly import load_site_keys, make_zone, streaming_parties
    from fedshard.assembly.routing import FederationRouting
    from fedshard.config import load_federation
    from fedshard.membership.zone_reload import ZoneReload
    from fedshard.observability.zone_metrics import ZoneCollector
    from fedshard.zone.rpc.service import serve

    cfg = _with_public_context(load_federation(config))
    zc = _zone_config(cfg, zone, store, config)
    tls = _tls_files(cert, key, ca, insecure)
    bind = zc.endpoint if listen is None else f"{listen}:{zc.endpoint.rsplit(':', 1)[1]}"
    _check_can_listen(zc.name, bind, config)  # before the zone's store and audit log are touched
    if cfg.residency.encrypting:  # a zone gets the public HE context only, never the secret one
        from fedshard.assembly import he_keys
        from fedshard.deploy.aggregator_host import check_public_context

        check_public_context(he_keys(cfg))
    routing = FederationRouting(cfg)
    routing.check()
    keys = load_site_keys(site_keys) if site_keys is not None else None
    served: list[ZoneAggregator] = []  # the metrics port is bound before the store is touched
    metrics = start_metrics([ZoneCollector(lambda: served)], metrics_port, metrics_host, console, "zone")
    aggregator = make_zone(zc, Path("runs") / "zones", routing=routing, site_keys=keys, tls=tls)
    served.append(aggregator)
    reload = ZoneReload(aggregator, config, routing, site_keys)  # the coordinator's Reconfigure, between rounds
    stop = StopSignal()  # before it says it listens: a signal that comes at once stops it too
    server, port = serve(aggregator, bind, tls=tls, limits=zc.limits, parties=streaming_parties(cfg), reload=reload)
    host = bind.rsplit(":", 1)[0]
    if tls is None:
        from fedshard.crypto.tls import INSECURE_WARNING

        err_console.print(f"[yellow]{INSECURE_WARNING}[/]", highlight=False)
    _say_recovered(aggregator)
    console.print(f"zone [cyan]{zc.name}[/] (region {zc.region}) listening on {host}:{port}", highlight=False)
    sys.stdout.flush()
    stop.wait()
    if metrics is not None:
        metrics.close()
    server.stop(grace=2.0).wait()
    aggregator.close()
    console.print(f"zone {zc.name} stopped")


def _with_public_context(cfg: FederationConfig) -> FederationConfig:
    """``cfg`` with ``he.keys`` where the aggregator's keys keep the public HE context, when it
    encrypts, names no ``he.keys`` and has a ``deployment`` (a zone on its own host, handed the
    aggregator's ``he/`` folder as `keys init` wrote it)."""
    if not cfg.residency.encrypting or cfg.he.keys is not None or cfg.deployment is None:
        return cfg
    from fedshard.config.layout import KeysLayout
    from fedshard.deploy.aggregator_host import he_folder  # where the aggregator host looks too

    he = he_folder(cfg, KeysLayout(cfg.deployment.keys).aggregator)
    return cfg.model_copy(update={"he": cfg.he.model_copy(update={"keys": he})})


def _zone_config(cfg: FederationConfig, zone: str, store: Path | None, config: Path) -> ZoneConfig:
    """Zone ``zone`` of ``cfg`` (its store replaced by ``store``, where given)."""
    matches = [z for z in cfg.zones if z.name == zone]
    if not matches:
        names = ", ".join(z.name for z in cfg.zones)
        raise FedshardError(f"{config}: no zone named {zone!r} (zones: {names})")
    return matches[0] if store is None else matches[0].model_copy(update={"store": store})


def _say_recovered(aggregator: ZoneAggregator) -> None:
    """What a zone restarted on its store came back with (each finding was logged in one line)."""
    found = aggregator.recovery
    if found.notes:
        lost = ", ".join(map(str, sorted(found.lost))) or "none"
        err_console.print(
            f"[yellow]zone {aggregator.name} restarted on its store: {len(found.summaries)} published aggregate(s) "
            f"verified, rounds lost (refused, to be aborted): {lost}[/]",
            highlight=False,
            soft_wrap=True,
        )


def _tls_files(cert: Path | None, key: Path | None, ca: Path | None, insecure: bool) -> TlsFiles | None:
    from fedshard.crypto.tls import TlsFiles

    given = [p for p in (cert, key, ca) if p is not None]
    if insecure:
        if given:
            raise FedshardError("--insecure cannot be combined with --cert/--key/--ca")
        return None
    if cert is None or key is None or ca is None:
        raise FedshardError(
            "the zone needs --cert, --key and --ca for mutual TLS (see `fedshard pki`), "
            "or --insecure for plain text on a loopback/test network"
        )
    files = TlsFiles(cert, key, ca)
    files.read()  # a missing or unreadable file is refused before anything is written
    return files


def _check_can_listen(zone: str, endpoint: str, config: Path) -> None:
    """Refuse, before the zone starts, an endpoint it cannot listen on: a port another process
    (another zone, an earlier ``zone up``) holds, a host that is not this machine's."""
    import errno
    import socket

    host, port = endpoint.rsplit(":", 1)
    if int(port) == 0:
        return
    fix = f"change the endpoint of zone {zone} in {config}"
    try:
        addresses = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"zone {zone}: cannot listen on {endpoint}: unknown host ({exc}); {fix}") from None
    failures: list[OSError] = []
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # SO_REUSEADDR, as gRPC binds: connections of an earlier run in TIME_WAIT do not count
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                failures.append(exc)
    if any(exc.errno == errno.EADDRINUSE for exc in failures):
        raise DeployError(
            f"zone {zone}: cannot listen on {endpoint}: port {port} is in use (is this zone, or another server, "
            f"already running?); stop it, or {fix}"
        )
    if failures and len(failures) == len(addresses):
        reason = failures[0].strerror or str(failures[0])
        raise ConfigError(f"zone {zone}: cannot listen on {endpoint}: {reason}; {fix}")
