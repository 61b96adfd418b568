"""``fedshard``: simulate a federation, deploy one (aggregator, sites, zones), manage keys.

Errors a user can cause are printed as one line (``error: …``) with exit code 2;
nothing else of the traceback is shown.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console

from fedshard.cli._budget import budget_app
from fedshard.cli._deploy import aggregator_app, site_app
from fedshard.cli._export import export_app
from fedshard.cli._folders import fresh_run_dir
from fedshard.cli._keys import keys_app
from fedshard.cli._metrics import MetricsHostOpt, MetricsPortOpt, start_metrics
from fedshard.cli._route import route_app
from fedshard.cli._security import audit_app, pki_app
from fedshard.cli._store import store_app, verify_store
from fedshard.cli._tune import tune_command
from fedshard.cli._zone import zone_app
from fedshard.errors import ConfigError, FedshardError
from fedshard.observability.server import DEFAULT_METRICS_HOST

if TYPE_CHECKING:
    from fedshard.config import FederationConfig
    from fedshard.simulate.run import DataPlane, Engine

__all__ = ["app", "main"]

# Never print locals in tracebacks: they may hold keys.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="fedshard: federated learning over gradient shards.",
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every subcommand
)


def _version(asked: bool) -> None:
    if asked:
        from fedshard import __version__

        typer.echo(f"fedshard {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit")
    ] = False,
) -> None:
    """fedshard: federated learning over gradient shards."""


app.add_typer(zone_app, name="zone")
app.add_typer(budget_app, name="budget")
app.add_typer(route_app, name="route")
app.add_typer(pki_app, name="pki")
app.add_typer(audit_app, name="audit")
app.add_typer(keys_app, name="keys")
app.add_typer(aggregator_app, name="aggregator")
app.add_typer(site_app, name="site")
app.add_typer(store_app, name="store")
app.add_typer(export_app, name="export")
app.command("verify")(verify_store)
app.command("tune")(tune_command)

console = Console(stderr=False)
err_console = Console(stderr=True)


@app.command()
def simulate(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Federation YAML, e.g. configs/demo.yaml")
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="Override federation.rounds")] = None,
    engine: Annotated[
        str, typer.Option("--engine", click_type=click.Choice(["inprocess", "flower"]), help="The engine")
    ] = "inprocess",
    out: Annotated[Path | None, typer.Option("--out", help="Run folder (default: a fresh folder under runs/)")] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Carry on the run in this folder from its last completed round (inprocess)"),
    ] = None,
    data_plane: Annotated[
        str,
        typer.Option(
            "--data-plane",
            click_type=click.Choice(["direct", "grpc"]),
            help="inprocess: sites call their zones directly, or over loopback gRPC",
        ),
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
    from fedshard.cli._progress import RoundProgress
    from fedshard.observability.run_metrics import RunCollector
    from fedshard.simulate.run import simulate as run

    chosen, plane = _engine(engine, data_plane, ray_address)
    cfg, out_dir = _run_config(config, out, resume, rounds)
    zones = f"{len(cfg.zones)} zone{'s' if len(cfg.zones) != 1 else ''}"
    console.print(
        f"[bold]fedshard[/] [cyan]{cfg.federation.name}[/]: {len(cfg.sites)} sites, {zones}, "
        f"{cfg.federation.rounds} rounds ({chosen.value})",
        highlight=False,
    )
    _preflight(cfg, out_dir)
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
            metrics.close()  # the run kept its last values in its folder (metrics.prom)
    _print_result(summary, out_dir)
    if summary["stopped_reason"]:
        raise FedshardError(f"federation stopped after {summary['rounds']} round(s): {summary['stopped_reason']}")


def _engine(engine: str, data_plane: str, ray_address: str | None) -> tuple[Engine, DataPlane]:
    """The engine and data plane asked for (``ray_address``: the flower engine's Ray cluster)."""
    from fedshard.simulate.run import DataPlane, Engine

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
    return chosen, plane


def _run_config(
    config: Path | None, out: Path | None, resume: Path | None, rounds: int | None
) -> tuple[FederationConfig, Path]:
    """The config to run and its run folder: a new run's, or the one ``resume`` names."""
    from fedshard.config import load_federation
    from fedshard.run_folder.resume import resumable_config, resumable_run, with_rounds

    if resume is not None:
        if config is not None or out is not None:
            raise FedshardError("--resume RUN_DIR runs with the config in RUN_DIR; drop --config and --out")
        cfg = with_rounds(resumable_config(resume), rounds)
        resumable_run(cfg, resume)  # checked again by the run; here, before anything is printed
        return cfg, resume
    if config is None:
        raise FedshardError("give --config FILE for a new run, or --resume RUN_DIR to carry on an earlier one")
    return with_rounds(load_federation(config), rounds), out or fresh_run_dir()


def _print_result(summary: dict[str, Any], out_dir: Path) -> None:
    """Where the shards went, the accuracy against the central baseline, and where the run's files are."""
    from fedshard.cli._progress import results_table, zones_table

    if summary["rounds"]:
        console.print(zones_table(summary))
        console.print(results_table(summary))
        console.print(f"model version {summary['model_version']}", soft_wrap=True)
    console.print(f"summary: {out_dir / 'summary.json'}", highlight=False, soft_wrap=True)
    console.print(f"report:  fedshard report {out_dir}", highlight=False, soft_wrap=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder: `fedshard simulate --out`, or a deployed run's")],
    out: Annotated[Path | None, typer.Option("--out", help="Where to write it (default: RUN_DIR/report)")] = None,
) -> None:
    """Plots and tables of a run (finished or not) as one HTML page with its PNGs beside it."""
    from fedshard.report import build_report

    written = build_report(run_dir, out)
    if written.skipped:
        first = written.skipped[0]
        more = f" and {len(written.skipped) - 1} more (listed in the report)" if len(written.skipped) > 1 else ""
        console.print(f"left out as malformed: {first}{more}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {len(written.images)} plots and {written.html}", highlight=False, soft_wrap=True)
    console.print(f"open it: {written.html.resolve().as_uri()}", highlight=False, soft_wrap=True)


@app.command()
def runs(
    folder: Annotated[Path, typer.Argument(help="Where the runs are (default: runs/)")] = Path("runs"),
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="A deployed federation's config: list its runs instead")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list (for scripts)")] = False,
) -> None:
    """List the runs in a folder: when each started, its rounds, accuracy and how it ended."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from fedshard.report.listing import list_runs

    if config is not None:
        from fedshard.config import load_federation

        cfg = load_federation(config)
        if cfg.deployment is None:
            raise ConfigError(f"{config} has no deployment section; its simulated runs are under runs/")
        folder = cfg.deployment.state_dir
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; no runs there (simulate writes under runs/)")
    from fedshard.deploy.status import deployed_run_state

    listed = list_runs(folder, deployed_run_state)
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in listed], indent=2))
        return
    if not listed:
        console.print(f"no runs under {folder}", highlight=False)
        return
    table = Table(title=f"Runs under {folder}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # stacked, and as wide as the longest folder name: identifiers are never cut
    table.add_column("run / federation", overflow="fold", min_width=max(len(r.folder.name) for r in listed))
    table.add_column("started (UTC)", no_wrap=True)
    table.add_column("rounds", justify="right", no_wrap=True)
    table.add_column("accuracy", justify="right", no_wrap=True)
    table.add_column("status", overflow="fold")
    for r in listed:
        rounds = f"{r.rounds}/{r.planned}" if r.planned is not None else str(r.rounds)
        accuracy = f"{r.accuracy:.4f}" if r.accuracy is not None else "-"
        name = f"{escape(r.folder.name)}\n[dim]{escape(r.federation)}[/]"
        table.add_row(name, r.started.removesuffix(" UTC") or "-", rounds, accuracy, escape(r.status))
    console.print(table)


@app.command()
def reconfigure(
    run: Annotated[Path, typer.Argument(help="The folder of a running `fedshard simulate`")],
    config: Annotated[Path, typer.Option("--config", "-c", help="The federation YAML it should run by now")],
) -> None:
    """Add or drain zones, add sites, change the rounds of a running simulation (before its next round)."""
    from fedshard.membership.offer import PENDING, request_change

    change = request_change(run, config)
    lines = (run / "events.jsonl").read_text().splitlines()
    ended = bool(lines) and json.loads(lines[-1]).get("event") == "stop"
    when = f"`fedshard simulate --resume {run}` takes it first" if ended else "the run takes it before its next round"
    console.print(f"{change.describe()}: left in {run / PENDING}; {when}")


def _preflight(cfg: FederationConfig, out: Path) -> None:
    """What ``simulate`` refuses before it writes anything: a run folder it cannot create, a
    task that does not load, a site whose shards no zone may hold, HE contexts in
    ``he.keys`` that do not load, a server optimiser, an accountant or a DP mechanism none is registered
    for, a zone port another program holds."""
    from fedshard.assembly.parts import check_parts
    from fedshard.assembly.routing import FederationRouting
    from fedshard.deploy.preflight import check_ports_free

    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, not a folder; choose another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: cannot create it, {existing} is not writable; choose another --out")
    if cfg.residency.encrypting and cfg.he.keys is not None:
        from fedshard.crypto.he import PUBLIC_CONTEXT_FILE, SECRET_CONTEXT_FILE, load_context

        load_context(cfg.he.keys / PUBLIC_CONTEXT_FILE, secret=False, scheme=cfg.he.scheme)
        load_context(cfg.he.keys / SECRET_CONTEXT_FILE, secret=True, scheme=cfg.he.scheme)
    FederationRouting(cfg).check()
    check_parts(cfg)
    fixed = [(f"zone {z.name}", z.endpoint) for z in cfg.zones if not z.endpoint.endswith(":0")]
    check_ports_free(fixed, "another program listens there (`ss -ltnp` shows which); give the zone port 0 (any free)")


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
