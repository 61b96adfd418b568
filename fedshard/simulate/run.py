"""``fedshard simulate``: a whole federation on one machine.

Zones are real gRPC servers on loopback in both engines. With ``inprocess`` the
sites are objects in this process; with ``flower`` they are ClientApps on Flower's
simulation engine (Ray) and the coordinator is the ServerApp.

Everything a run keeps is under its folder (the config as run, the event log, the
sites' stores and ledgers, the zones' published aggregates), so an in-process run
whose process died resumes from it (``resume=True``): the coordinator recovers its
version chains from the event log and the sites carry on from their stores.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from fedshard._fs import Barrier, deferred_to
from fedshard.assembly import (
    SIGNING_KEY_FILE,
    STORE_KEYS_DIR,
    ServedZones,
    check_privacy,
    grpc_connector,
    make_site,
    serving_zones,
)
from fedshard.assembly.coordination import coordinate
from fedshard.assembly.routing import FederationRouting
from fedshard.config import FederationConfig
from fedshard.coordinator.events import EventLog
from fedshard.coordinator.recovery import RunRecovery
from fedshard.coordinator.results import PhaseObserver, RoundObserver, RunResult
from fedshard.errors import ConfigError
from fedshard.observability.server import SNAPSHOT_FILE, MetricsServer, write_snapshot
from fedshard.protocol.channels import ZoneConnector
from fedshard.run_folder.resume import resumable_run
from fedshard.run_folder.summary import build_summary
from fedshard.simulate.baseline import centralized_baseline
from fedshard.transports.inprocess import InProcessSiteGateway, StagedDurability, in_process_connector

__all__ = ["DataPlane", "Engine", "simulate"]


class Engine(StrEnum):
    """Where the sites run."""

    INPROCESS = "inprocess"
    FLOWER = "flower"


class DataPlane(StrEnum):
    """How the in-process engine's sites reach their zones (the coordinator and tools always use gRPC)."""

    DIRECT = "direct"
    """Calls into the zone objects of this process: the same checks, signatures, residency
    decisions and audit records, no serialisation (the default: 3x faster per site at scale)."""
    GRPC = "grpc"
    """Over the zones' gRPC servers on loopback, one shared channel per zone: the wire
    protocol of a deployment, exercised end to end."""


def simulate(
    config: FederationConfig,
    out: str | Path,
    engine: Engine = Engine.INPROCESS,
    observer: RoundObserver | None = None,
    *,
    resume: bool = False,
    data_plane: DataPlane = DataPlane.DIRECT,
    workers: int = 1,
    metrics: MetricsServer | None = None,
) -> dict[str, Any]:
    """Run ``config`` on one machine, write ``out/summary.json``, return the summary.

    ``resume``: carry on the run in ``out`` from its last completed round (in-process
    engine only; ``config`` is the one it ran with, :func:`resumable_config`).
    ``data_plane`` and ``workers`` (sites handling messages at once; 1 folds in a fixed
    order, so a run repeats bit for bit) apply to the in-process engine. ``metrics``: a
    server that exports the zones' metrics too while they run.
    """
    out = Path(out)
    recovery: RunRecovery | None = None
    if resume:
        if engine is not Engine.INPROCESS:
            raise ConfigError("--resume runs the in-process engine only; drop --engine flower")
        if config.residency.encrypting and config.he.keys is None and (out / "keys").is_dir():
            config = _own_he_keys(config, out)  # the contexts the run made for itself when it started
        recovery = resumable_run(config, out)
    elif (out / "events.jsonl").exists() or (out / "sites").exists():
        raise ConfigError(
            f"{out} already holds a run (its sites' shards and ledgers); choose another --out, or resume it "
            f"with `fedshard simulate --resume {out}`; nothing was changed"
        )
    check_privacy(config)
    if engine is Engine.FLOWER:  # a Ray cluster named but not there: say so before writing anything
        from fedshard.simulate.ray_runtime import check_ray_address

        check_ray_address()
    out.mkdir(parents=True, exist_ok=True)
    if config.residency.encrypting and config.he.keys is None:
        from fedshard.crypto.he import he_init

        he_init(out / "keys", scheme=config.he.scheme)  # the run's own contexts: secret for sites, public for zones
        config = _own_he_keys(config, out)
    config_path = out / "federation.yaml"
    if recovery is None:
        config_path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    events = EventLog(out / "events.jsonl")
    started = time.perf_counter()
    _phase(observer, "assembling: zones and sites start; a large task's first run builds or pretrains its base")
    # in-process, the sites' files (keys, stores, ledgers) are flushed once per batch of them
    barrier = Barrier.over([out / "sites", out / STORE_KEYS_DIR]) if engine is Engine.INPROCESS else None
    try:
        with deferred_to(barrier):
            site_keys = _signing_keys(config, out / "sites", reuse=recovery is not None)
        if barrier is not None:
            barrier.sync()  # before any zone is given the public keys
        with serving_zones(config, out / "zones", site_keys) as served, _zone_metrics(metrics, served, out):
            endpoints = served.endpoints
            if engine is Engine.INPROCESS:
                connect = in_process_connector(served.zones) if DataPlane(data_plane) is DataPlane.DIRECT else None
                result = _run_inprocess(config, out, served, observer, events, recovery, connect, workers, barrier)
            else:
                from fedshard.simulate._flower import run_flower_simulation

                result = run_flower_simulation(config_path, out, endpoints, events, observer)
            zones = _zone_details(endpoints)
    finally:
        if barrier is not None:
            barrier.close()
    elapsed = time.perf_counter() - started
    _phase(observer, "central baseline: the same model trained on all the data pooled, for comparison")
    baseline = centralized_baseline(config)
    summary = build_summary(config, result, engine.value, zones, baseline.accuracy or 0.0, elapsed)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _phase(observer: RoundObserver | None, what: str) -> None:
    """Tell ``observer`` a phase starts, if it listens for phases (:class:`PhaseObserver`)."""
    if isinstance(observer, PhaseObserver):
        observer.on_phase(what)


@contextlib.contextmanager
def _zone_metrics(metrics: MetricsServer | None, served: ServedZones, out: Path) -> Iterator[None]:
    """Export the served zones (those added during the run too) on ``metrics`` while they run;
    when they stop, keep the last values of every series in ``out/metrics.prom``."""
    if metrics is None:
        yield
        return
    from fedshard.observability.zone_metrics import ZoneCollector

    collector = ZoneCollector(lambda: list(served.zones.values()))
    metrics.registry.register(collector)
    try:
        yield
    finally:
        write_snapshot(metrics.registry, out / SNAPSHOT_FILE)
        metrics.registry.unregister(collector)


def _own_he_keys(config: FederationConfig, out: Path) -> FederationConfig:
    """``config`` with ``he.keys`` at the contexts a run without them makes for itself (``<out>/keys``)."""
    return config.model_copy(update={"he": config.he.model_copy(update={"keys": (out / "keys").resolve()})})


def _signing_keys(
    config: FederationConfig, sites_root: Path, *, reuse: bool = False, only: list[str] | None = None
) -> dict[str, bytes]:
    """A manifest-signing key in every site's folder (``reuse``: the one there, if any; ``only``:
    these sites'); the public keys, for the zones."""
    from fedshard.crypto.signing import generate_signing_key, load_signing_key, public_key_bytes

    keys = {}
    for s in config.sites if only is None else [config.site(i) for i in only]:
        folder = sites_root / s.id
        folder.mkdir(parents=True, exist_ok=True)
        if reuse and (folder / SIGNING_KEY_FILE).exists():
            keys[s.id] = public_key_bytes(load_signing_key(folder / SIGNING_KEY_FILE))
        else:
            keys[s.id] = generate_signing_key(folder / SIGNING_KEY_FILE)
    return keys


def _zone_details(endpoints: dict[str, str]) -> list[dict[str, Any]]:
    """Each zone's counters, residency role and audit head, as it reports them."""
    from fedshard.zone.rpc.client import GrpcZoneClient

    out = []
    for endpoint in endpoints.values():
        with GrpcZoneClient(endpoint, timeout=30) as client:
            out.append({"endpoint": endpoint, **client.details()})
    return out


def _run_inprocess(
    config: FederationConfig,
    out: Path,
    served: ServedZones,
    observer: RoundObserver | None,
    events: EventLog,
    recovery: RunRecovery | None,
    connect: ZoneConnector | None,
    workers: int,
    barrier: Barrier | None,
) -> RunResult:
    """The coordinator over sites in this process; they reach the zones through ``connect``
    (None: over gRPC, one shared channel per zone). Changes left in ``out`` are taken
    between rounds (:mod:`fedshard.membership.in_process`). With ``barrier``, the sites are
    made (their store keys) and run their messages with their flushes deferred to it
    (:class:`~fedshard.transports.inprocess.StagedDurability`)."""
    from fedshard.membership.in_process import RunMembership
    from fedshard.zone.rpc.shared import SharedZoneChannels

    routing = served.routing
    channels = SharedZoneChannels()
    reach = connect if connect is not None else channels
    # the zones' real endpoints (this host started them on free ports), growing as zones are added
    where = served.endpoints
    with deferred_to(barrier):
        sites = {
            s.id: make_site(config, s.id, out / "sites", routing, connect=reach, endpoints=where) for s in config.sites
        }
    if barrier is not None:
        barrier.sync()
    durability = StagedDurability(barrier, _staged_batch(routing)) if barrier is not None else None
    gateway = InProcessSiteGateway(sites, max_workers=workers, durability=durability)
    endpoints = dict(served.endpoints)
    zones = {z.name: grpc_connector(z.name, endpoints[z.name]) for z in config.zones if not z.drain}

    def keys(new: FederationConfig, ids: list[str]) -> dict[str, bytes]:
        return _signing_keys(new, out / "sites", only=ids)

    membership = RunMembership(config, out, served, routing, gateway, sites, reach, keys, events)
    try:
        return coordinate(
            config,
            gateway,
            zones,
            endpoints,
            events,
            observer=observer,
            recovery=recovery,
            membership=membership,
            site_keys=lambda: served.site_keys or {},  # each node proves which site it is (sites added too)
        )
    finally:
        gateway.close()
        channels.close()


STAGED_BYTES = 256 << 20
"""What a batch of sites may hold at their release points together (their sealed updates, counted
at 4× the model's float32 bytes: HE ciphertexts are up to 4× them): 64 sites of a small model,
one of a model of 64 MiB or more."""


def _staged_batch(routing: FederationRouting) -> int:
    """Sites per barrier (:class:`~fedshard.transports.inprocess.StagedDurability`): as many as
    :data:`STAGED_BYTES` allows, at most 64 and at least 1."""
    return max(1, min(64, STAGED_BYTES // max(1, 4 * routing.plan.nbytes)))
