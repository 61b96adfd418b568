"""``fedshard aggregator up|status|stop|reconfigure`` and ``fedshard site up|status``: a
federation deployed as separate processes (see README, "Run across machines")."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from fedshard.cli._metrics import MetricsHostOpt, MetricsPortOpt
from fedshard.cli._signals import StopSignal, on_signals
from fedshard.errors import ConfigError, DeployError, FedshardError
from fedshard.observability.server import DEFAULT_METRICS_HOST

if TYPE_CHECKING:
    from fedshard.deploy.site import SiteLaunch
    from fedshard.deploy.site_status import SiteState

__all__ = ["aggregator_app", "site_app"]

aggregator_app = typer.Typer(no_args_is_help=True, help="The aggregator host: SuperLink, zones, the run.")
site_app = typer.Typer(no_args_is_help=True, help="A site host: its SuperNode.")
console = Console()
err_console = Console(stderr=True)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="The aggregator's config (federation + deployment)")]
Insecure = Annotated[
    bool, typer.Option("--insecure", help="No TLS, no SuperNode authentication (loopback/test networks only)")
]

_INSECURE = (
    "WARNING: --insecure: SuperLink, SuperNodes and zones run WITHOUT TLS or SuperNode authentication; "
    "anyone who reaches the ports can join or read the control plane. Use this only on a test network."
)


@aggregator_app.command("up")
def aggregator_up(
    config: ConfigOpt,
    insecure: Insecure = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Carry on the newest run (or RUN_DIR) from its last completed round; sites keep their models",
        ),
    ] = False,
    run_dir: Annotated[
        Path | None, typer.Argument(help="With --resume: the run folder to resume (default: the newest)")
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option("--rounds", min=1, help="Override federation.rounds (with --resume: train a finished run on)"),
    ] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = DEFAULT_METRICS_HOST,
) -> None:
    """Start the SuperLink and this host's zones, wait for the sites, run the federation.

    With --metrics-port P the run's metrics are served on P and each zone's on P+1, P+2, …
    in the order of the config's zones. Ctrl-C (or SIGTERM) stops the run and every
    process this command started.
    """
    from fedshard.cli._progress import zones_table
    from fedshard.config import load_federation
    from fedshard.deploy.aggregator_host import LATEST_RUN, AggregatorHost
    from fedshard.deploy.status import render_status
    from fedshard.run_folder.resume import with_rounds

    if run_dir is not None and not resume:
        raise FedshardError(f"{run_dir}: a run folder is given with --resume only (`--resume {run_dir}`)")
    cfg = with_rounds(load_federation(config), rounds)
    if metrics_port is None and metrics_host != DEFAULT_METRICS_HOST:
        raise FedshardError("--metrics-host needs --metrics-port")
    host = AggregatorHost(
        cfg,
        insecure=insecure,
        resume=(run_dir or LATEST_RUN) if resume else None,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )
    on_signals(host.request_stop)
    with host.claimed():  # another aggregator here, or a port taken: that one line is all it prints
        if insecure:
            err_console.print(f"[yellow]{_INSECURE}[/]", highlight=False)
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            host.on_change = lambda state: live.update(render_status(host.config, state))  # grows with the run
            try:
                summary = host.up()
            finally:
                live.update(render_status(host.config, host.state))
    if summary.get("rounds"):
        console.print(zones_table(summary))
        console.print(f"final accuracy {summary['final_accuracy']:.4f}, model version {summary['model_version']}")
    console.print(f"run folder: {host.run_dir}", highlight=False, soft_wrap=True)
    if (host.run_dir / "summary.json").exists():
        console.print(f"summary:    {host.run_dir / 'summary.json'}", highlight=False, soft_wrap=True)
    if (host.run_dir / "events.jsonl").exists():
        console.print(f"report:     fedshard report {host.run_dir}", highlight=False, soft_wrap=True)
    if host.state.phase == "stopped":
        console.print("stopped before the run finished; sites keep their state and rejoin the next run")
        raise typer.Exit(130)
    if summary.get("stopped_reason"):
        raise FedshardError(f"federation stopped after {summary['rounds']} round(s): {summary['stopped_reason']}")


@aggregator_app.command("reconfigure")
def aggregator_reconfigure(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="The aggregator's config with the zones and sites added or drained")
    ],
    run_dir: Annotated[
        Path | None, typer.Argument(help="The running federation's run folder (default: the newest)")
    ] = None,
    insecure: Insecure = False,
) -> None:
    """Add zones and sites to (or drain zones of) the running federation, between rounds.

    Checks the new config against the run's, then leaves it for `aggregator up`, which
    starts the new zones it hosts and registers the new sites' SuperNode keys; the
    coordinator gives every zone the new membership and takes it before its next round.
    Write the new parties' keys first (`fedshard keys init --add`); give the zones'
    and sites' hosts the new config.
    """
    from fedshard.config import load_federation
    from fedshard.config.layout import KeysLayout
    from fedshard.deploy.aggregator_host import LATEST_RUN, check_aggregator_config, he_folder, run_to_resume
    from fedshard.membership.deployed import request_deployed_change
    from fedshard.membership.offer import PENDING

    cfg = load_federation(config)
    dep = check_aggregator_config(cfg, insecure=insecure)
    run = run_to_resume(dep.state_dir, run_dir or LATEST_RUN)
    he = he_folder(cfg, KeysLayout(dep.keys).aggregator) if cfg.residency.encrypting else None
    change = request_deployed_change(cfg, run, he)
    console.print(
        f"{change.describe()}: left in {run / PENDING}; the aggregator prepares it and the coordinator "
        "takes it before its next round (`aggregator status` shows when)",
        highlight=False,
    )


@aggregator_app.command("status")
def aggregator_status(
    config: ConfigOpt,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object (for scripts and monitoring)")] = False,
) -> None:
    """Print the aggregator's status once (sites connected, round, ε per site, zones)."""
    from fedshard.config import load_federation
    from fedshard.deploy.aggregator_host import check_aggregator_config
    from fedshard.deploy.host_lock import is_held
    from fedshard.deploy.status import ENDED, read_state, render_status

    cfg = load_federation(config)
    dep = check_aggregator_config(cfg, insecure=True)
    state = read_state(dep.state_dir)
    running = is_held(dep.state_dir)
    if as_json:
        import dataclasses
        import json

        died = not running and state.phase not in ENDED
        doc = {**dataclasses.asdict(state), "running": running, "died": died, "state_dir": str(dep.state_dir)}
        typer.echo(json.dumps(doc, indent=2))
        return
    console.print(render_status(cfg, state, running))
    if state.run_dir:
        console.print(f"run folder: {escape(state.run_dir)}", highlight=False)
    if not running and state.phase not in ENDED:
        console.print(
            f"the aggregator (pid {state.pid}) died; its zones and SuperLink stopped with it. "
            f"`fedshard aggregator up --config {escape(str(config))} --resume` goes on from its last round",
            highlight=False,
        )


@aggregator_app.command("stop")
def aggregator_stop(
    config: ConfigOpt,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="How long to wait for it to stop")] = 60.0,
) -> None:
    """Stop the aggregator running with this config's state folder, as Ctrl-C would: the run
    stops after its current step, every process it started stops, the run folder keeps what
    it got to (`aggregator up --resume` goes on from there)."""
    from fedshard.config import load_federation
    from fedshard.deploy.aggregator_host import check_aggregator_config
    from fedshard.deploy.host_lock import is_held
    from fedshard.deploy.status import read_state

    dep = check_aggregator_config(load_federation(config), insecure=True)
    if not is_held(dep.state_dir):
        console.print(f"no aggregator runs with state folder {escape(str(dep.state_dir))}; nothing to stop")
        return
    state = read_state(dep.state_dir)  # written by the aggregator that holds the lock: its pid is current
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_held(dep.state_dir):
        if time.monotonic() > deadline:
            raise DeployError(
                f"the aggregator (pid {state.pid}) still runs {timeout_s:.0f}s after SIGTERM; `kill -9 {state.pid}` "
                "stops it, and its zones and SuperLink with it"
            )
        time.sleep(0.2)
    console.print(f"stopped the aggregator (pid {state.pid})", highlight=False)
    if state.run_dir:
        console.print(f"run folder: {escape(state.run_dir)}", highlight=False)


@site_app.command("up")
def site_up(
    config: Annotated[Path, typer.Option("--config", "-c", help="The site's own config (configs/sites/<site>.yaml)")],
    insecure: Insecure = False,
    retry_s: Annotated[
        float, typer.Option("--retry-s", help="Keep retrying this long while the SuperLink refuses or is down")
    ] = 300.0,
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            click_type=click.Choice(["warm", "flower"]),
            help="warm: fork each message from a process that imported torch and fedshard once; "
            "flower: Flower's stock executor (default: deployment.executor, warm)",
        ),
    ] = None,
) -> None:
    """Start this site's SuperNode; it takes part in every round until interrupted.

    The site's data, shards, privacy ledger and secret keys stay in its own folders.
    """
    from fedshard.deploy.host_lock import SITE_LOCK_FILE, holding
    from fedshard.deploy.site import plan_site
    from fedshard.deploy.site_status import SiteState, read_site_state, write_site_state

    if executor not in (None, "warm", "flower"):
        raise ConfigError(f"--executor {executor}: choose warm or flower")
    launch = plan_site(config, insecure=insecure, executor=executor)  # type: ignore[arg-type]
    if insecure:
        err_console.print(f"[yellow]{_INSECURE}[/]", highlight=False)
    if launch.fallback:
        err_console.print(
            f"[yellow]warning: Flower's stock executor (a fresh process per message): {launch.fallback}[/]",
            highlight=False,
        )
    site = launch.config.site
    previous = read_site_state(site.state_dir)
    with holding(site.state_dir, previous.pid if previous else None, lock_file=SITE_LOCK_FILE):
        state = SiteState(site.id, executor=launch.executor)
        write_site_state(site.state_dir, state)
        try:
            _run_site(launch, retry_s, state)
        except FedshardError as exc:
            state.phase, state.message = "failed", str(exc)
            write_site_state(site.state_dir, state)
            raise


@site_app.command("status")
def site_status(
    config: Annotated[Path, typer.Option("--config", "-c", help="The site's own config (configs/sites/<site>.yaml)")],
    key_file: Annotated[
        Path | None,
        typer.Option("--key-file", help="The site's store key, to read its ledger (default: its bundle's store.kek)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object (for scripts and monitoring)")] = False,
) -> None:
    """Print this site's status once: whether `site up` runs, its SuperNode, and its privacy
    ledger (ε spent against the site's own cap), read on the site's host."""
    import dataclasses
    import json

    from fedshard.cli._budget import ledger_summary
    from fedshard.config import load_site
    from fedshard.deploy.host_lock import SITE_LOCK_FILE, is_held
    from fedshard.deploy.site_status import SITE_ENDED, read_site_state

    site = load_site(config).site
    state = read_site_state(site.state_dir)
    running = is_held(site.state_dir, SITE_LOCK_FILE)
    died = state is not None and not running and state.phase not in SITE_ENDED
    ledger: dict[str, Any] | None = None
    ledger_note = ""
    if (site.state_dir / "ledger.sqlite").exists():
        try:
            ledger = ledger_summary(config, key_file)
        except FedshardError as exc:
            ledger_note = str(exc)
    else:
        ledger_note = "no privacy ledger yet (the site has not taken part in a round)"
    if as_json:
        doc = {
            "site": site.id,
            "jurisdiction": site.jurisdiction,
            "state_dir": str(site.state_dir),
            "running": running,
            "died": died,
            "up": dataclasses.asdict(state) if state is not None else None,
            "ledger": ledger,
            "ledger_note": ledger_note,
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    if state is None:
        said = "`site up` has never run with this state folder"
    elif running:
        said = f"site up running (pid {state.pid}), SuperNode {state.phase}"
        said += f" (pid {state.supernode_pid}, started {state.starts}×)" if state.supernode_pid else ""
    elif died:
        said = f"site up (pid {state.pid}) died while {state.phase}: `fedshard site up --config {config}` restarts it"
    else:
        said = f"site up {state.phase}"
    console.print(f"site [cyan]{escape(site.id)}[/] ({escape(site.jurisdiction)}): {escape(said)}", highlight=False)
    if state is not None:
        console.print(f"SuperLink {escape(state.superlink)}; {escape(state.executor)} executor", highlight=False)
        if state.message:
            console.print(f"last: {escape(state.message)}", highlight=False)
    if ledger is not None:
        spent, budget, delta = (float(ledger[k]) for k in ("epsilon_spent", "epsilon_budget", "delta"))
        console.print(
            f"privacy: ε {spent:.2f} / {budget:g} spent (δ {delta:g}), "
            f"{ledger['rounds_participated']} round(s), {ledger['status']}",
            highlight=False,
        )
        if ledger["note"]:
            console.print(f"note: {escape(str(ledger['note']))}", highlight=False)
    else:
        console.print(f"privacy: {escape(ledger_note)}", highlight=False)
    console.print(f"state folder: {escape(str(site.state_dir))}", highlight=False)


def _run_site(launch: SiteLaunch, retry_s: float, state: SiteState) -> None:
    """Run the site's SuperNode until interrupted, restarting it while its SuperLink refuses or
    is unreachable (at most ``retry_s``); ``state`` is kept current in the site's status file."""
    from fedshard.crypto.tls import describe_superlink
    from fedshard.deploy.site import unreachable_zones
    from fedshard.deploy.site_status import write_site_state

    site = launch.config.site
    assert launch.config.deployment is not None
    superlink = launch.config.deployment.superlink
    state.superlink = superlink

    def record(phase: str, message: str = "") -> None:
        state.phase, state.message = phase, message
        write_site_state(site.state_dir, state)

    stopping = StopSignal()
    console.print(
        f"site [cyan]{site.id}[/] ({site.jurisdiction}) → SuperLink {superlink}; "
        f"state {site.state_dir}; {launch.executor} executor; log {launch.log}",
        highlight=False,
    )
    if launch.federation is not None:  # a firewall or a wrong name: said now, not at the first round
        for line in unreachable_zones(launch.federation, site.id):
            err_console.print(f"[yellow]warning: {escape(line)}[/]", highlight=False)
    sys.stdout.flush()
    deadline = time.monotonic() + retry_s
    while True:
        # the SuperNode itself retries a lost SuperLink for ever unless told when to give up
        wait = f"{max(1.0, deadline - time.monotonic()):.0f}"
        if launch.ca is not None:  # another federation's SuperLink, or another party's port: permanent
            wrong = describe_superlink(superlink, launch.ca.read_bytes())
            if wrong is not None:
                raise DeployError(f"the SuperNode of {site.id} cannot join {superlink}: {wrong}")
        node = launch.start(float(wait))
        state.supernode_pid, state.starts = node.supernode.popen.pid, state.starts + 1
        record("running")
        started, gave_up = time.monotonic(), False
        while node.alive() and not stopping.requested:
            stopping.wait(0.5)
            if _GAVE_UP in node.supernode.new_lines():  # its SuperLink is gone; it may hang on exit (Flower 1.42)
                gave_up = True
                break
        child = node.failed()  # before stopping the other
        node.stop(timeout=5.0 if gave_up else 10.0)
        if stopping.requested:
            record("stopped")
            console.print(f"site {site.id} stopped; its shards and ledger are in {site.state_dir}", highlight=False)
            return
        gave_up = gave_up or _GAVE_UP in node.supernode.new_lines()
        waited = time.monotonic() - started
        reason = (
            f"no answer from the SuperLink for {min(waited, float(wait)):.0f}s"
            if gave_up
            else f"{child.name}: {_reason(child.tail(12))}"
        )
        refused = _tls_refusal(reason, superlink, launch.config.deployment.keys / "ca.pem")
        if refused is not None:  # permanent: retrying cannot help
            raise DeployError(f"the SuperNode of {site.id} cannot join {superlink}: {refused}")
        # A SuperNode that ran a while lost its SuperLink; one that never connected may not be
        # registered yet (the aggregator registers keys as it starts): retry until retry_s.
        if time.monotonic() - started > 60 and not gave_up:
            deadline = time.monotonic() + retry_s
        if time.monotonic() >= deadline and gave_up:
            raise DeployError(
                f"the SuperNode of {site.id} lost its SuperLink {superlink} (or never reached it): {reason}. "
                "Is the aggregator up? (--retry-s sets how long a site keeps trying)"
            )
        if time.monotonic() >= deadline:
            raise DeployError(
                f"the SuperNode of {site.id} could not join {superlink} (code {child.popen.returncode}): {reason}. "
                "Is the aggregator up, and was this site's key registered (fedshard keys init; aggregator up)?"
            )
        if _STALE_SESSION in reason:  # Flower's words for it say nothing of why
            reason += (
                " The SuperLink still holds this site's previous session (a crash or a kill leaves it open); "
                "it lapses two missed heartbeats after the last one (Flower's SuperNode beats every 30 s)."
            )
        pause = 2.0 if _STALE_SESSION in reason else 5.0  # the session lapses on its own: look again soon
        record("retrying", f"{child.name} exited ({reason})")
        err_console.print(
            f"[yellow]{escape(f'{child.name} exited ({reason}); retrying in {pause:.0f}s')}[/]", highlight=False
        )
        if stopping.wait(pause):
            record("stopped")
            return


_STALE_SESSION = "[code: 2004]"
"""Flower's error code when the SuperLink refuses to activate a SuperNode whose key it still has online."""

_GAVE_UP = "Giving up reconnection"
"""What a SuperNode logs when its ``--max-wait-time`` ran out (its SuperLink is gone)."""


def _tls_refusal(reason: str, superlink: str, ca: Path) -> str | None:
    """What a TLS failure that no retry can mend means for the operator (None: not one).

    A SuperLink certificate that this site's CA did not issue means the site and the
    aggregator hold keys of different federations. A certificate that does not name the
    address the site dials means the aggregator's certificate lacks that name."""
    if "CERTIFICATE_VERIFY_FAILED" not in reason and "certificate verify failed" not in reason:
        return None
    if "mismatch" in reason:  # Python's ssl: "Hostname mismatch" / "IP address mismatch"
        host = superlink.rsplit(":", 1)[0]
        return (
            f"the SuperLink's certificate does not name {host}; list it in the aggregator config's "
            "deployment.hosts and issue its certificate again (`fedshard keys init`), or dial a name it holds"
        )
    return (
        f"the SuperLink's certificate was not issued by this site's CA ({ca}): the site's keys and the "
        "aggregator's come from different federations (a bundle of another `fedshard keys init`); ask the "
        "aggregator's operator for this site's bundle (`fedshard keys init --add` on the aggregator host)"
    )


def _reason(log_tail: str) -> str:
    """The useful part of a SuperNode's exit log (Flower prints the cause after 'Exit Code')."""
    parts = [p for p in log_tail.split(" | ") if p and not p.startswith(("INFO", "\x1b[92mINFO"))]
    for i, part in enumerate(parts):
        if "Exit Code" in part:
            return " ".join(parts[i + 1 : i + 3]) or part
    return log_tail
