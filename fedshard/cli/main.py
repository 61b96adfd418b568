"""``fedshard``: simulate a federation, deploy one (aggregator, sites, zones), manage keys.

Errors a user can cause are printed as one line (``error: …``) with exit code 2;
nothing else of the traceback is shown.
"""

from __future__ import annotations

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
from fedshard.cli.route import route_app
from fedshard.cli.security import audit_app, keys_app, pki_app
from fedshard.cli.store import keys_rotate, store_app, verify_store
from fedshard.errors import FedshardError

if TYPE_CHECKING:
    from fedshard.crypto.tls import TlsFiles

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
) -> None:
    """Run a whole federation on this machine; zones are real gRPC servers on loopback."""
    from fedshard.cli.progress import RoundProgress, results_table, zones_table
    from fedshard.config import load_federation
    from fedshard.simulate.run import Engine, resumable_config, with_rounds
    from fedshard.simulate.run import simulate as run

    try:
        chosen = Engine(engine)
    except ValueError:
        raise FedshardError(f"--engine must be 'inprocess' or 'flower', got {engine!r}") from None
    if resume is not None:
        if config is not None or out is not None:
            raise FedshardError("--resume RUN_DIR runs with the config in RUN_DIR; drop --config and --out")
        cfg, out_dir = with_rounds(resumable_config(resume), rounds), resume
    elif config is None:
        raise FedshardError("give --config FILE for a new run, or --resume RUN_DIR to carry on an earlier one")
    else:
        cfg, out_dir = with_rounds(load_federation(config), rounds), out or _fresh_run_dir()
    console.print(
        f"[bold]fedshard[/] federation [cyan]{cfg.federation.name}[/]: {len(cfg.sites)} sites, "
        f"{len(cfg.zones)} zone(s), {cfg.federation.rounds} rounds, engine {chosen.value}"
    )
    with RoundProgress(console) as progress:
        summary = run(cfg, out_dir, chosen, progress, resume=resume is not None)
    if summary["rounds"]:
        console.print(zones_table(summary))
        console.print(results_table(summary))
        console.print(f"model version {summary['model_version']}")
    console.print(f"summary: {out_dir / 'summary.json'}")
    if summary["stopped_reason"]:
        raise FedshardError(f"federation stopped after {summary['rounds']} round(s): {summary['stopped_reason']}")


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
) -> None:
    """Run one zone aggregator as a gRPC server until interrupted (mutual TLS unless --insecure).

    The zone enforces the federation's residency policy on every shard it receives,
    forwards partial sums of global shards to the reducing zone, and records every
    decision in ``audit.jsonl`` in its store (check it with ``fedshard audit verify``).
    """
    from fedshard.assembly import load_site_keys, make_zone, streaming_parties
    from fedshard.config import load_federation
    from fedshard.routing import FederationRouting
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
    if cfg.residency.encrypting:  # a zone gets the public CKKS context only, never the secret one
        from fedshard.assembly import he_keys
        from fedshard.deploy.aggregator import check_public_context

        check_public_context(he_keys(cfg))
    routing = FederationRouting(cfg)
    routing.check()
    keys = load_site_keys(site_keys) if site_keys is not None else None
    aggregator = make_zone(zc, Path("runs") / "zones", routing=routing, site_keys=keys, tls=tls)
    server, port = serve(aggregator, zc.endpoint, tls=tls, limits=zc.limits, parties=streaming_parties(cfg))
    host = zc.endpoint.rsplit(":", 1)[0]
    if tls is None:
        from fedshard.crypto.tls import INSECURE_WARNING

        err_console.print(f"[yellow]{INSECURE_WARNING}[/]", highlight=False)
    console.print(f"zone [cyan]{zc.name}[/] (region {zc.region}) listening on {host}:{port}", highlight=False)
    sys.stdout.flush()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
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
    return TlsFiles(cert, key, ca)


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
        app(standalone_mode=False)
    except FedshardError as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise SystemExit(130) from None
    except Exception as exc:  # click's usage errors and other CLI exceptions
        import click

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
