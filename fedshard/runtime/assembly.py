"""Building the runtime parts of a federation from its config.

Shared by every engine: the in-process demo, the Flower ServerApp/ClientApp and the
``fedshard zone up`` command all assemble sites and zones here, the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from fedshard.config import FederationConfig, ZoneConfig
from fedshard.errors import ConfigError, PrivacyError
from fedshard.runtime.channels import ZoneClient
from fedshard.runtime.site import Site
from fedshard.runtime.site_privacy import SitePrivacy
from fedshard.runtime.task import Partition, build_initial_model, load_task
from fedshard.runtime.zone import ZoneAggregator

__all__ = ["check_privacy", "dp_layers", "grpc_connector", "make_site", "make_zone", "running_zones"]


def grpc_connector(name: str, endpoint: str) -> ZoneClient:
    """Zone client over gRPC (the data plane of every real run)."""
    from fedshard.runtime.zone_rpc.client import GrpcZoneClient

    return GrpcZoneClient(endpoint)


def make_site(config: FederationConfig, site_id: str, state_root: str | Path) -> Site:
    """The :class:`Site` for ``site_id``, keeping its state under ``state_root/site_id``."""
    site = config.site(site_id)
    task = load_task(config.task.target, dict(config.task.options))
    partition = Partition(config.partition_of(site_id), config.num_partitions, config.federation.seed)
    state_dir = Path(state_root) / site.id
    return Site(
        site.id,
        site.jurisdiction,
        task,
        partition,
        tile=config.sharding.tile,
        seed=config.federation.seed,
        state_dir=state_dir,
        connect=grpc_connector,
        privacy=SitePrivacy(site.id, state_dir, cap=site.cap),
        dp_layers=dp_layers(config),
    )


def dp_layers(config: FederationConfig) -> str:
    """How the initial model treats layers DP-SGD cannot train (see build_initial_model)."""
    record = config.privacy.record_level
    if not record.enabled:
        return "keep"
    return "fix" if record.fix_incompatible_layers else "check"


def check_privacy(config: FederationConfig) -> None:
    """Refuse, before anything runs, a site whose δ exceeds 1/(its number of records),
    and a model DP-SGD cannot train when its layers may not be replaced.

    Sites check these themselves too; checking here turns a refusal in round 1 into a
    one-line error when the config is loaded.
    """
    if not config.privacy.enabled:
        return
    task = load_task(config.task.target, dict(config.task.options))
    record = config.privacy.record_level
    if record.enabled and not record.fix_incompatible_layers:
        try:
            build_initial_model(task, config.federation.seed, "check")
        except PrivacyError as exc:
            raise ConfigError(f"privacy.record_level: {exc}") from None
    for site in config.sites:
        budget = config.budget_of(site.id)
        assert budget is not None
        delta = min(budget.delta, site.cap.delta) if site.cap is not None else budget.delta
        partition = Partition(config.partition_of(site.id), config.num_partitions, config.federation.seed)
        records = task.load_data(partition).num_train
        if records and delta > 1.0 / records:
            raise ConfigError(
                f"site {site.id}: privacy δ={delta:g} is larger than 1/(its {records} records) = {1.0 / records:.3g}; "
                f"choose δ ≤ {1.0 / records:.3g}"
            )


def make_zone(zone: ZoneConfig, store_root: str | Path | None = None) -> ZoneAggregator:
    """The aggregator for ``zone``; its store is ``zone.store`` or ``store_root/name``."""
    store = zone.store if zone.store is not None else (Path(store_root) / zone.name if store_root else None)
    return ZoneAggregator(zone.name, zone.region, store_dir=store, staging_bytes=zone.staging_mb << 20)


@contextlib.contextmanager
def running_zones(config: FederationConfig, store_root: str | Path | None = None) -> Iterator[dict[str, str]]:
    """Start every configured zone as a gRPC server in this process; yields endpoints.

    Port 0 in a zone's endpoint picks a free port.
    """
    from fedshard.runtime.zone_rpc.service import serve

    servers = []
    endpoints: dict[str, str] = {}
    try:
        for zc in config.zones:
            host = zc.endpoint.rsplit(":", 1)[0]
            server, port = serve(make_zone(zc, store_root), zc.endpoint)
            servers.append(server)
            endpoints[zc.name] = f"{host}:{port}"
        yield endpoints
    finally:
        for server in servers:
            server.stop(grace=1.0).wait()
