"""``fedshard``: simulate a federation, deploy one (aggregator, sites, zones), manage keys.

Errors a user can cause are printed as one line (``error: …``) with exit code 2;
nothing else of the traceback is shown.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from fedshard.cli.budget import budget_app
from fedshard.cli.deploy import aggregator_app, keys_init, site_app
from fedshard.cli.metrics import MetricsHostOpt, MetricsPortOpt, start_metrics
from fedshard.cli.route import route_app
from fedshard.cli.security import audit_app, keys_app, pki_app
from fedshard.cli.store import keys_rotate, store_app, verify_store
from fedshard.errors import ConfigError, DeployError, FedshardError
from fedshard.transports.metrics import DEFAULT_METRICS_HOST

if TYPE_CHECKING:
    from fedshard.config import FederationConfig
    from fedshard.crypto.tls import TlsFiles
    from fedshard.zone.aggregator import ZoneAggregator

__all__ = ["app", "main"]

# Never print locals in tracebacks: they may hold keys.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="fedshard: federated learning over gradient shards.",
)
zone_app = typer.Typer(no_args_is_help=True, help="Run zone aggregators (the data plane).")
app.add_typer(zone_app, name="zone")
app.add_typer(budget_app, name="budget")
app.add_typer(route_app, name="route")
app.add_typer(pki_app, name="pki")
app.add_typer(audit_app, name="audit")
app.add_typer(keys_app, name="keys")
app.add_typer(aggregator_app, name="aggregator")
app.add_typer(site_app, name="site")
keys_app.command("init")(keys_init)
keys_app.command("rotate")(keys_rotate)
app.add_typer(store_app, name="store")
app.command("verify")(verify_store)

console = Console(stderr=False)
err_console = Console(stderr=True)


def _fresh_run_dir() -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / stamp
    n = 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stamp}-{n}"
    return path


@app.command()
def simulate(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Federation YAML, e.g. configs/demo.yaml")
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="Override federation.rounds")] = None,
    engine: Annotated[str, typer.Option("--engine", help="inprocess or flower")] = "inprocess",
    out: Annotated[Path | None, typer.Option("--out", help="Run folder (default: a fresh folder under runs/)")] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Carry on the run in this folder from its last completed round (inprocess)"),
    ] = None,
    data_plane: Annotated[
        str,
        typer.Option("--data-plane", help="inprocess: sites call their zones directly, or over loopback grpc"),
    ] = "direct",
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="inprocess: sites handling messages at once (1: repeatable)")
    ] = 1,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="flower: run on this Ray cluster (HOST:PORT; default: $RAY_ADDRESS)"),
    ] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = DEFAULT_METRICS_HOST,
) -> None:
    """Run a whole federation on this machine; zones are real gRPC servers on loopback."""
    from fedshard.cli.progress import RoundProgress, results_table, zones_table
    from fedshard.config import load_federation
    from fedshard.simulate.run import DataPlane, Engine, resumable_config, with_rounds
    from fedshard.simulate.run import simulate as run

    try:
        chosen = Engine(engine)
    except ValueError:
        raise FedshardError(f"--engine must be 'inprocess' or 'flower', got {engine!r}") from None
    try:
        plane = DataPlane(data_plane)
    except ValueError:
        raise FedshardError(f"--data-plane must be 'direct' or 'grpc', got {data_plane!r}") from None
    if ray_address is not None:
        if chosen is not Engine.FLOWER:
            raise FedshardError("--ray-address runs the flower engine on a Ray cluster; add --engine flower")
        from fedshard.simulate.ray_runtime import ADDRESS_ENV

        os.environ[ADDRESS_ENV] = ray_address
    if resume is not None:
        if config is not None or out is not None:
            raise FedshardError("--resume RUN_DIR runs with the config in RUN_DIR; drop --config and --out")
        cfg, out_dir = with_rounds(resumable_config(resume), rounds), resume
    elif config is None:
        raise FedshardError("give --config FILE for a new run, or --resume RUN_DIR to carry on an earlier one")
    else:
        cfg, out_dir = with_rounds(load_federation(config), rounds), out or _fresh_run_dir()
    zones = f"{len(cfg.zones)} zone{'s' if len(cfg.zones) != 1 else ''}"
    console.print(
        f"[bold]fedshard[/] [cyan]{cfg.federation.name}[/]: {len(cfg.sites)} sites, {zones}, "
        f"{cfg.federation.rounds} rounds ({chosen.value})",
        highlight=False,
    )
    _preflight(cfg, out_dir)
    from fedshard.coordinator.metrics import RunCollector

    metrics = start_metrics([RunCollector(out_dir / "events.jsonl")], metrics_port, metrics_host, console, "run")
    try:
        with RoundProgress(console) as progress:
            summary = run(
                cfg,
                out_dir,
                chosen,
                progress,
                resume=resume is not None,
                data_plane=plane,
                workers=workers,
                metrics=metrics,
            )
    finally:
        if metrics is not None:
            metrics.close()
    if summary["rounds"]:
        console.print(zones_table(summary))
        console.print(results_table(summary))
        console.print(f"model version {summary['model_version']}", soft_wrap=True)
    console.print(f"summary: {out_dir / 'summary.json'}", highlight=False, soft_wrap=True)
    console.print(f"report:  fedshard report {out_dir}", highlight=False, soft_wrap=True)
    if summary["stopped_reason"]:
        raise FedshardError(f"federation stopped after {summary['rounds']} round(s): {summary['stopped_reason']}")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder: `fedshard simulate --out`, or a deployed run's")],
    out: Annotated[Path | None, typer.Option("--out", help="Where to write it (default: RUN_DIR/report)")] = None,
) -> None:
    """Plots and tables of a run (finished or not) as one HTML page with its PNGs beside it."""
    from fedshard.report import build_report

    written = build_report(run_dir, out)
    console.print(f"wrote {len(written.images)} plots and {written.html}", highlight=False, soft_wrap=True)
    console.print(f"open it: {written.html.resolve().as_uri()}", highlight=False, soft_wrap=True)


@app.command()
def reconfigure(
    run: Annotated[Path, typer.Argument(help="The folder of a running `fedshard simulate`")],
    config: Annotated[Path, typer.Option("--config", "-c", help="The federation YAML it should run by now")],
) -> None:
    """Add or drain zones, add sites, change the rounds of a running simulation (before its next round)."""
    from fedshard.simulate.membership import PENDING, request_change

    change = request_change(run, config)
    lines = (run / "events.jsonl").read_text().splitlines()
    ended = bool(lines) and json.loads(lines[-1]).get("event") == "stop"
    when = f"`fedshard simulate --resume {run}` takes it first" if ended else "the run takes it before its next round"
    console.print(f"{change.describe()}: left in {run / PENDING}; {when}")


def _preflight(cfg: FederationConfig, out: Path) -> None:
    """What ``simulate`` refuses before it writes anything: a run folder it cannot create, a
    task that does not load, a site whose shards no zone may hold, CKKS contexts in
    ``he.keys`` that do not load."""
    from fedshard.routing import FederationRouting

    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, not a folder; choose another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: cannot create it, {existing} is not writable; choose another --out")
    if cfg.residency.encrypting and cfg.he.keys is not None:
        from fedshard.crypto.he import PUBLIC_CONTEXT_FILE, SECRET_CONTEXT_FILE, load_context

        load_context(cfg.he.keys / PUBLIC_CONTEXT_FILE, secret=False)
        load_context(cfg.he.keys / SECRET_CONTEXT_FILE, secret=True)
    FederationRouting(cfg).check()


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
    from fedshard.assembly.reload import ZoneReload
    from fedshard.config import load_federation
    from fedshard.routing import FederationRouting
    from fedshard.zone.metrics import ZoneCollector
    from fedshard.zone.rpc.service import serve

    cfg = load_federation(config)
    matches = [z for z in cfg.zones if z.name == zone]
    if not matches:
        names = ", ".join(z.name for z in cfg.zones)
        raise FedshardError(f"{config}: no zone named {zone!r} (zones: {names})")
    zc = matches[0]
    if store is not None:
        zc = zc.model_copy(update={"store": store})
    tls = _tls_files(cert, key, ca, insecure)
    _check_can_listen(zc.name, zc.endpoint, config)  # before the zone's store and audit log are touched
    if cfg.residency.encrypting:  # a zone gets the public CKKS context only, never the secret one
        from fedshard.assembly import he_keys
        from fedshard.deploy.aggregator import check_public_context

        check_public_context(he_keys(cfg))
    routing = FederationRouting(cfg)
    routing.check()
    keys = load_site_keys(site_keys) if site_keys is not None else None
    served: list[ZoneAggregator] = []  # the metrics port is bound before the store is touched
    metrics = start_metrics([ZoneCollector(lambda: served)], metrics_port, metrics_host, console, "zone")
    aggregator = make_zone(zc, Path("runs") / "zones", routing=routing, site_keys=keys, tls=tls)
    served.append(aggregator)
    reload = ZoneReload(aggregator, config, routing, site_keys)  # the coordinator's Reconfigure, between rounds
    server, port = serve(
        aggregator, zc.endpoint, tls=tls, limits=zc.limits, parties=streaming_parties(cfg), reload=reload
    )
    host = zc.endpoint.rsplit(":", 1)[0]
    if tls is None:
        from fedshard.crypto.tls import INSECURE_WARNING

        err_console.print(f"[yellow]{INSECURE_WARNING}[/]", highlight=False)
    found = aggregator.recovery
    if found.notes:  # each finding was logged in one line; this says what the zone came back with
        lost = ", ".join(map(str, sorted(found.lost))) or "none"
        err_console.print(
            f"[yellow]zone {zc.name} restarted on its store: {len(found.summaries)} published aggregate(s) "
            f"verified, rounds lost (refused, to be aborted): {lost}[/]",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"zone [cyan]{zc.name}[/] (region {zc.region}) listening on {host}:{port}", highlight=False)
    sys.stdout.flush()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if metrics is not None:
        metrics.close()
    server.stop(grace=2.0).wait()
    aggregator.close()
    console.print(f"zone {zc.name} stopped")


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


def _error_line(message: str) -> None:
    """Print ``error: message`` on stderr as one line (never wrapped; brackets in it are text, not markup)."""
    from rich.markup import escape

    err_console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def main() -> None:
    """Console-script entry point: one clear line on user errors."""
    level = os.environ.get("FEDSHARD_LOG", "WARNING").upper()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before gRPC's core starts: no fork/INFO chatter
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("flwr").setLevel(level)
    # Task plug-ins are named "module:object" relative to where the user runs fedshard,
    # as with `python -m`; PYTHONPATH carries that to Flower's simulation workers.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
    try:
        app(standalone_mode=False, prog_name="fedshard")
    except FedshardError as exc:
        _error_line(str(exc))
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise SystemExit(130) from None
    except Exception as exc:  # click's usage errors and other CLI exceptions
        import click

        if isinstance(exc, click.exceptions.UsageError) and not isinstance(exc, click.exceptions.NoArgsIsHelpError):
            # one line, as for every other bad input: what is wrong, and where the options are listed
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            _error_line(f"{exc.format_message()}{where}")
            raise SystemExit(2) from None
        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        if isinstance(exc, click.exceptions.Exit):
            raise SystemExit(exc.exit_code) from None
        if isinstance(exc, click.exceptions.Abort):
            raise SystemExit(1) from None
        raise


if __name__ == "__main__":
    main()
