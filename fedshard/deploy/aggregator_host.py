"""``fedshard aggregator up``: the aggregator host of a deployed federation.

Starts this host's zones (``fedshard zone up``, mutual TLS) and Flower's SuperLink (TLS,
SuperNode authentication), registers the sites' SuperNode keys, waits until
``federation.min_sites`` sites are connected, submits the fedshard app (ServerApp =
Coordinator) and follows the run until it ends or is interrupted; then stops its
children and writes ``summary.json`` in the run's folder.

While it waits and runs it supervises its children every second or two: a zone that dies
is restarted once per run (same port, arguments and store folder; a warning is logged);
the SuperLink dying, or a zone dying again, ends the command with one line naming the
process, how it ended and the last lines of its log.

State on this host (``deployment.state_dir``)::

    status.json              what `aggregator status` prints
    superlink.db, flwr/      the SuperLink's database; the flwr CLI's connection and installed apps
    app/                     the app bundle submitted to the SuperLink
    logs/                    superlink.log, zone-<name>.log
    run-<time>/              federation.yaml (as run), events.jsonl, summary.json, zones/<name>/ (aggregates, audit log)

While the run goes on it takes the changes ``aggregator reconfigure`` leaves in the run
folder (:meth:`AggregatorHost.take_change`, :mod:`fedshard.membership.deployed`): new
zones started, new sites' SuperNode keys registered, the change marked ready for the
coordinator, which hands it to every zone between rounds. The checks that refuse a
config before anything starts are in :mod:`fedshard.deploy.preflight`.

``aggregator up --resume`` runs again in a run's folder (the newest, or the one named):
its zones come back on their stores (they serve the aggregates of earlier rounds to
sites that are behind) and the coordinator recovers its version chains from the
folder's ``events.jsonl`` (:mod:`fedshard.coordinator.recovery`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape

from fedshard.config import FederationConfig, SiteConfig, ZoneConfig
from fedshard.config.layout import KeysLayout
from fedshard.coordinator.ledger_book import LEDGER_BOOK_FILE
from fedshard.coordinator.recovery import RunRecovery, recover
from fedshard.deploy._flower import FlowerCli, console_script, flower_env, superlink_command, write_connection
from fedshard.deploy._processes import Child, spawn, wait_for_port
from fedshard.deploy.host_lock import LOCK_FILE, holding
from fedshard.deploy.preflight import (
    LATEST_RUN,
    check_aggregator_config,
    check_ports_free,
    check_public_context,
    check_same_parties,
    he_folder,
    run_to_resume,
)
from fedshard.deploy.status import HostState, read_state, write_state, zone_details
from fedshard.errors import DeployError, FedshardError
from fedshard.membership.deployed import effective_config
from fedshard.observability.host import HostMetrics
from fedshard.observability.server import DEFAULT_METRICS_HOST, SNAPSHOT_FILE
from fedshard.transports.flower.host_watch import HOST_PID_ENV

__all__ = [
    "LATEST_RUN",
    "AggregatorHost",
    "check_aggregator_config",
    "check_public_context",
    "he_folder",
    "run_to_resume",
]

log = logging.getLogger(__name__)

_FINISHED = ("finished:completed", "finished:failed", "finished:stopped")
_ZONE_RESTARTS = 1
"""Times a zone that dies is restarted per run (same port and arguments, same store folder)
before the command fails: one crash is survived, a zone that keeps dying is reported."""
_REMEMBER_S = 10.0
"""How often supervision notes the processes each child started: a child that dies (SIGKILL)
leaves its own children behind, and :meth:`Child.stop` can only stop those it knows."""


def _write_yaml(path: Path, config: FederationConfig) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


@dataclass
class AggregatorHost:
    """Runs the aggregator side of a deployed federation.

    Parameters
    ----------
    config:
        The federation config with its ``deployment`` section (paths already resolved).
    insecure:
        Run without TLS and SuperNode authentication.
    on_change:
        Called with the :class:`HostState` whenever it changes (the live display).
    resume:
        A run folder to resume (:data:`LATEST_RUN`: the newest); None: a fresh run.
    metrics_port:
        Serve the run's Prometheus metrics on this port, and each zone's on the ports after
        it, in the order the zones start (0: any free port for each); None: no metrics.
    metrics_host:
        The address the metrics ports listen on.
    """

    config: FederationConfig
    insecure: bool = False
    on_change: Callable[[HostState], None] = lambda state: None
    poll_s: float = 1.0
    stop_requested: threading.Event = field(default_factory=threading.Event)
    state: HostState = field(default_factory=HostState)
    children: list[Child] = field(default_factory=list)
    resume: Path | None = None
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST

    def __post_init__(self) -> None:
        self.dep = check_aggregator_config(self.config, insecure=self.insecure)
        self.tls = self.dep.tls and not self.insecure
        self.keys = KeysLayout(self.dep.keys).aggregator
        self.state_dir = self.dep.state_dir
        self._recovery: RunRecovery | None = None  # the run to resume, as its event log says
        if self.resume is not None:
            self.run_dir = run_to_resume(self.state_dir, self.resume)
            self._recovery = recover(self.run_dir / "events.jsonl")
            more = self._recovery.last_round + self.config.federation.rounds
            self._recovery.check_more_to_do(
                self.config.federation.rounds, f"`fedshard aggregator up --resume --rounds {more}`"
            )
        else:
            self.run_dir = self.state_dir / time.strftime("run-%Y%m%d-%H%M%S")
        while self.resume is None and self.run_dir.exists():  # two starts within a second
            self.run_dir = self.run_dir.with_name(self.run_dir.name + "+")
        self.flwr = FlowerCli(self.state_dir / "flwr")
        self.env = flower_env(self.state_dir / "flwr") | {HOST_PID_ENV: str(os.getpid())}  # the ServerApp watches us
        self._config_path = self.run_dir / "federation.yaml"
        self._started = time.perf_counter()  # reset when the run is submitted: summary.json's elapsed_s
        self._zone_endpoints: dict[str, str] = {}  # child name -> endpoint, for restarts
        self._remembered = 0.0  # when the children's process trees were last noted
        self._metrics = HostMetrics(self.metrics_port, self.metrics_host)
        self._claimed = False  # within :meth:`claimed`

    # lifecycle -------------------------------------------------------------------------------
    def up(self) -> dict[str, Any]:
        """Start everything, run the federation once, stop everything; the run's summary.

        Holds the state folder's lock throughout (:mod:`fedshard.deploy.host_lock`). Another
        aggregator on that folder, or a port this host must listen on that is taken, is
        refused before anything is written."""
        with self.claimed():
            return self._up()

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        """Hold the state folder's lock and check this host's ports for the block (what :meth:`up`
        does first; a caller that shows a live display claims before it, so that a refusal is
        all it prints). Re-entrant."""
        if self._claimed:
            yield
            return
        fresh = not (self.state_dir / LOCK_FILE).exists()
        if fresh:  # no aggregator ran here: refuse before writing the lock
            check_ports_free(self._listeners())
        previous = None
        with contextlib.suppress(DeployError):
            previous = read_state(self.state_dir).pid
        with holding(self.state_dir, previous):
            if not fresh:  # after the lock: another aggregator here is named as such, not as its ports
                check_ports_free(self._listeners())
            self._claimed = True
            try:
                yield
            finally:
                self._claimed = False

    def _listeners(self) -> list[tuple[str, str]]:
        """(what, ``host:port``) of every port this host listens on: the SuperLink and its zones."""
        listen = f"{self.dep.listen}:{self.dep.superlink_port}"
        return [("the SuperLink", listen), *((f"zone {z.name}", z.endpoint) for z in self._hosted(self.config))]

    def _up(self) -> dict[str, Any]:
        try:
            if not self.start():
                return self._finish("stopped")
            return self.run()
        except BaseException as exc:
            self.state.message = f"[red]{escape(str(exc))}[/]" if str(exc) else ""
            if self.run_dir.exists():
                with contextlib.suppress(Exception):  # what the run got to, if it assembled
                    self._finish("failed")
            self._update(phase="failed")
            raise
        finally:
            self.stop_children()

    def start(self) -> bool:
        """Start the zones and the SuperLink, register the sites, wait for ``min_sites`` of them;
        False when asked to stop meanwhile. Call :meth:`stop_children` in any case."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(exist_ok=self.resume is not None)
        if self.resume is not None:
            check_same_parties(self._config_path, self.config, self.run_dir)
            self._check_fixed()
        self._update(superlink=self.dep.superlink, run_dir=str(self.run_dir))
        url = self._metrics.serve_run(self.run_dir / "events.jsonl", connected=lambda: len(self.state.online))
        if url is not None:
            self._update(metrics=url)
        self._write_config()
        self._start_zones()
        self._start_superlink()
        self._register_sites()
        return self._wait_for_sites()

    def run(self) -> dict[str, Any]:
        """Submit the fedshard run (once per :meth:`start`: zones keep one run's rounds) and
        follow it to its end; its summary."""
        if self.state.run_id is not None:
            raise DeployError("this aggregator already ran its federation; start it again for another run")
        self._started = time.perf_counter()
        self._submit()
        return self._finish(self._follow())

    def request_stop(self) -> None:
        """Ask :meth:`up` to stop (signal handlers call this)."""
        self.stop_requested.set()

    def stop_children(self) -> None:
        """Stop the SuperLink first (it stops the run's ServerApp), then the zones, then the metrics."""
        self.flwr.close()
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        self._metrics.close(self.run_dir / SNAPSHOT_FILE)

    # steps --------------------------------------------------------------------------------------
    def _update(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.state, key, value)
        write_state(self.state_dir, self.state)
        self.on_change(self.state)

    def _check_fixed(self) -> None:
        """Refuse to resume with a config that changes what the run keeps fixed (its privacy, residency,
        zones' regions, …: what `aggregator reconfigure` would refuse), before anything starts."""
        assert self._recovery is not None  # read when the host was made to resume
        he = he_folder(self.config, self.keys) if self.config.residency.encrypting else None
        self._recovery.check_config(effective_config(self.config, self.run_dir, he), "--config")

    def _write_config(self) -> None:
        """The config as the zones and the ServerApp use it: absolute paths, zone stores under
        the state folder, the public HE context (:func:`effective_config`)."""
        he = he_folder(self.config, self.keys) if self.config.residency.encrypting else None
        _write_yaml(self._config_path, effective_config(self.config, self.run_dir, he))

    def _hosted(self, config: FederationConfig) -> list[ZoneConfig]:
        """The zones of ``config`` this host runs (``deployment.zones``, default: all)."""
        hosted = self.dep.zones if self.dep.zones is not None else [z.name for z in config.zones]
        return [z for z in config.zones if z.name in hosted]

    def _start_zones(self, hosted: list[ZoneConfig] | None = None) -> None:
        """Start ``hosted`` (default: every zone this host runs) and wait until each listens."""
        hosted = self._hosted(self.config) if hosted is None else hosted
        started: list[Child] = []
        for zone in hosted:
            cmd = [console_script("fedshard"), "zone", "up", "--config", str(self._config_path), "--zone", zone.name]
            if self.tls:
                tls = self.keys.zone(zone.name)
                cmd += ["--cert", str(tls.cert), "--key", str(tls.key), "--ca", str(tls.ca)]
                cmd += ["--site-keys", str(self.keys.site_keys)]
            else:
                cmd += ["--insecure"]
            cmd += self._metrics.zone_args()
            child = spawn(f"zone {zone.name}", cmd, self.state_dir / "logs" / f"zone-{zone.name}.log", self.env)
            self.children.append(child)
            started.append(child)
            self._zone_endpoints[child.name] = zone.endpoint
            self.state.zones[zone.name] = {"endpoint": zone.endpoint, "pid": child.pid, "log": str(child.log)}
        for zone, child in zip(hosted, started, strict=True):
            host, port = zone.endpoint.rsplit(":", 1)
            wait_for_port(child, host, int(port), timeout=60)
        self._update()

    def _start_superlink(self) -> None:
        tls = (self.keys.superlink.cert, self.keys.superlink.key, self.keys.ca) if self.tls else None
        cmd = superlink_command(
            listen=self.dep.listen, port=self.dep.superlink_port, database=self.state_dir / "superlink.db", tls=tls
        )
        child = spawn("SuperLink", cmd, self.state_dir / "logs" / "superlink.log", self.env)
        self.children.append(child)
        wait_for_port(child, self.dep.listen, self.dep.superlink_port, timeout=60)
        write_connection(self.flwr.flwr_home, self.dep.superlink, self.keys.ca if self.tls else None)
        self._update(superlink_pid=child.pid)

    def _register_sites(self, sites: list[SiteConfig] | None = None) -> None:
        """Register the SuperNode key of ``sites`` (default: every site; only registered
        SuperNodes may connect)."""
        if not self.tls:
            return
        known_file = self.state_dir / "nodes.json"
        nodes: dict[str, str] = json.loads(known_file.read_text()) if known_file.exists() else {}
        for site in self.config.sites if sites is None else sites:
            node_id = self.flwr.register(self.keys.supernode_key(site.id))
            if node_id is not None:
                nodes = {n: s for n, s in nodes.items() if s != site.id} | {node_id: site.id}
        known_file.write_text(json.dumps(nodes, indent=2) + "\n")
        self._update(nodes=nodes)

    def _check_children(self) -> None:
        """Fail fast on a child that is gone (one line: which, its exit status, its log's last
        lines); a zone is first restarted, :data:`_ZONE_RESTARTS` time(s) per run."""
        remember = time.monotonic() - self._remembered > _REMEMBER_S
        for child in self.children:
            if child.alive():
                if remember:  # what it started (Flower detaches the ServerApp), to stop it should it die
                    child.remember_tree()
                continue
            if child.name in self._zone_endpoints and child.restarts < _ZONE_RESTARTS:
                self._restart_zone(child)
                continue
            raise DeployError(child.exit_reason())
        if remember:
            self._remembered = time.monotonic()

    def _restart_zone(self, child: Child) -> None:
        """Start a zone that died again: same port, same arguments, same store folder (what it
        recovers from there is the zone's own business); waits until it listens."""
        warning = f"{child.exit_reason()}; restarting it (once per run)"
        log.warning("%s", warning)
        child.restart()
        host, port = self._zone_endpoints[child.name].rsplit(":", 1)
        wait_for_port(child, host, int(port), timeout=60)
        zone = child.name.removeprefix("zone ")
        if zone in self.state.zones:
            self.state.zones[zone]["pid"] = child.pid
        self._update(message=f"[yellow]{escape(warning)}[/]")

    def _poll(self, call: Callable[[], Any]) -> Any:
        """``call`` (a ``flwr`` query of the SuperLink); when it fails because a child died,
        the error names the child rather than the query."""
        try:
            return call()
        except DeployError:
            self._check_children()
            raise

    def poll_nodes(self) -> int:
        """Refresh which SuperNodes are online; how many are."""
        online = [n.node_id for n in self.flwr.nodes() if n.online]
        self._update(online=online, checked_at=time.time())
        return len(online)

    def _wait_for_sites(self) -> bool:
        """Wait for ``federation.min_sites`` connected sites; False when asked to stop."""
        need = self.config.federation.min_sites
        self._update(phase="waiting for sites", message=f"waiting for {need} sites to connect to {self.dep.superlink}")
        deadline = time.monotonic() + self.dep.wait_s
        while not self.stop_requested.is_set():
            self._check_children()
            if self._poll(self.poll_nodes) >= need:
                self._update(message="")
                return True
            if time.monotonic() > deadline:
                raise DeployError(
                    f"only {len(self.state.online)} of {need} sites connected within {self.dep.wait_s:.0f}s; "
                    f"are their SuperNodes running (`fedshard site up`) and pointed at {self.dep.superlink}?"
                )
            self.stop_requested.wait(2.0)
        return False

    def _submit(self) -> None:
        from fedshard.deploy.app import build_app, write_run_config

        app = build_app(self.state_dir / "app")
        tls = self.keys.coordinator
        settings = {
            "config": str(self._config_path),
            "zones": json.dumps({z.name: z.endpoint for z in self.config.zones}),
            "events": str(self.run_dir / "events.jsonl"),
            "zone-tls": json.dumps({k: str(getattr(tls, k)) for k in ("cert", "key", "ca")}) if self.tls else "",
            "resume": "1" if self.resume is not None else "",
            "membership": "1",  # changes `aggregator reconfigure` leaves in the run folder, between rounds
            "ledger-heads": str(self.state_dir / LEDGER_BOOK_FILE),  # every site's spend, across runs
            # each SuperNode proves which site it is with its site's key (as zones check manifests: under TLS)
            "site-keys": str(self.keys.site_keys) if self.tls else "",
        }
        run_id = self.flwr.submit(app, write_run_config(self.run_dir / "run-config.toml", settings))
        self._update(phase="running", run_id=run_id)

    def _follow(self) -> str:
        """Wait for the run to end (its stop event, or Flower saying it finished); the final phase."""
        from fedshard.coordinator.events import EventKind, EventLog

        events = EventLog(self.run_dir / "events.jsonl")
        offset, last_check = 0, 0.0
        assert self.state.run_id is not None
        while not self.stop_requested.is_set():
            self._check_children()
            self.take_change()
            batch, offset = events.read(offset)
            taken = [e for e in batch if e["event"] == EventKind.RECONFIGURED]
            if taken and self.state.message.startswith("change ready"):  # the coordinator took it
                self.state.message = (
                    f"change taken before round {taken[-1]['round']}: {escape(str(taken[-1]['change']))}"
                )
            if batch:
                self._update()
            if any(e["event"] == EventKind.STOP for e in batch):
                return "finished"
            if time.monotonic() - last_check > 5.0:
                last_check = time.monotonic()
                self._poll(self.poll_nodes)
                status = self._poll(lambda: self.flwr.run_status(str(self.state.run_id)))
                if status in _FINISHED:
                    time.sleep(0.5)  # the stop event may land just after Flower's status
                    if any(e["event"] == EventKind.STOP for e in events.read(offset)[0]):
                        return "finished"
                    raise DeployError(
                        f"run {self.state.run_id} ended ({status}) without finishing; "
                        f"see `flwr log {self.state.run_id}` with FLWR_HOME={self.flwr.flwr_home}"
                    )
            self.stop_requested.wait(self.poll_s)
        self._update(message="stopping: the run is interrupted")
        with contextlib.suppress(DeployError):  # the SuperLink going down stops the run anyway
            self.flwr.stop(self.state.run_id)
        return "stopped"

    def take_change(self) -> bool:
        """Prepare the change ``aggregator reconfigure`` left in the run folder, if any: check the
        new parties' keys, make it the run's config, start the new zones this host runs,
        register the new sites; then mark it ready for the coordinator
        (:mod:`fedshard.membership.deployed`). A change that cannot be prepared is set aside as
        ``reconfigure.refused.yaml`` with one line on the display; nothing of the run changes.
        Whether a change was made ready."""
        from fedshard.config import load_federation
        from fedshard.config.changes import check_change
        from fedshard.membership.deployed import READY
        from fedshard.membership.offer import PENDING

        pending = self.run_dir / PENDING
        if not pending.exists():
            return False
        before = self._config_path.read_bytes()
        added: list[Child] = []
        try:
            new = load_federation(pending)
            change = check_change(load_federation(self._config_path), new)
            check_aggregator_config(new, insecure=self.insecure)
            hosted = [z for z in self._hosted(new) if z.name in change.added_zones]
            self._config_path.write_bytes(pending.read_bytes())  # what new zones start from, and reload
            count = len(self.children)
            try:
                self._start_zones(hosted)
            finally:
                added = self.children[count:]
            self._register_sites([s for s in new.sites if s.id in change.added_sites])
        except FedshardError as exc:
            for child in added:  # a new zone that started: it is not part of the run
                child.stop()
                self.children.remove(child)
                self._zone_endpoints.pop(child.name, None)
                self.state.zones.pop(child.name.removeprefix("zone "), None)
            self._config_path.write_bytes(before)
            pending.replace(self.run_dir / "reconfigure.refused.yaml")
            log.warning("the change in %s is refused: %s", pending, exc)
            self._update(message=f"[yellow]change refused (kept as reconfigure.refused.yaml): {escape(str(exc))}[/]")
            return False
        self.config = new
        pending.replace(self.run_dir / READY)
        self._update(message=f"change ready for the next round: {escape(change.describe())}")
        return True

    def _finish(self, phase: str) -> dict[str, Any]:
        """Write ``summary.json`` from the events so far (if the run assembled); record the phase."""
        summary: dict[str, Any] = {}
        events = self.run_dir / "events.jsonl"
        if events.exists():
            from fedshard.coordinator.events import replay, stop_reason
            from fedshard.run_folder.summary import build_summary

            try:
                result = replay(events)
            except FedshardError:  # the run never assembled its sites: nothing to summarise but why
                result = None
                summary = {"rounds": 0, "stopped_reason": stop_reason(events) or ""}
            if result is not None:
                summary = build_summary(
                    self.config,
                    result,
                    "deployment",
                    zone_details(  # every zone of the run, those on other hosts too
                        {z.name: {"endpoint": z.endpoint} for z in self.config.zones},
                        self.keys.coordinator if self.tls else None,
                    ),
                    None,
                    time.perf_counter() - self._started,
                )
                (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self._update(phase=phase)
        return summary
