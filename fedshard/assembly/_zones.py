"""Assembling zones from the federation config, and serving them in this process (simulation, tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.assembly._connectors import tls_connector
from fedshard.assembly.sites import he_keys
from fedshard.config import FederationConfig, ZoneConfig
from fedshard.errors import PkiError
from fedshard.zone.aggregator import ZoneAggregator

if TYPE_CHECKING:
    import grpc

    from fedshard.assembly.routing import FederationRouting
    from fedshard.crypto.tls import TlsFiles
    from fedshard.integrity.aggregate_signature import AggregateSigner

__all__ = [
    "AUDIT_FILE",
    "ServedZones",
    "make_zone",
    "running_zones",
    "serving_zones",
    "streaming_parties",
]

AUDIT_FILE = "audit.jsonl"
"""A zone's audit log, in its store folder."""


def make_zone(
    zone: ZoneConfig,
    store_root: str | Path | None = None,
    *,
    routing: FederationRouting | None = None,
    site_keys: Mapping[str, bytes] | None = None,
    tls: TlsFiles | None = None,
    peers: Mapping[str, str] | None = None,
) -> ZoneAggregator:
    """The aggregator for ``zone``; its store (and audit log) is ``zone.store`` or ``store_root/name``.

    With ``routing`` the zone enforces the federation's residency policy and its
    ``aggregation`` bounds (without: the default bounds); with
    ``site_keys`` it accepts only manifests signed by their site; ``tls`` is what it
    presents when it forwards partial sums to the reducing zone (whose certificate it
    checks names that zone, in the region of the zone's own config), and its key signs
    the audit log's head and every aggregate the zone publishes. Partial sums go to the
    reducing zone at its endpoint in ``peers`` (zone name → endpoint; default: the
    endpoints of ``routing``'s config, the zone's own; a serving host that picked the
    ports passes its own, possibly still filling, mapping).

    Raises
    ------
    PkiError
        ``tls`` holds the certificate of another party than this zone (name and region).
    """
    from fedshard.audit import AuditLog, HeadSigner
    from fedshard.zone.recovery import repair_audit_tail

    store = zone.store if zone.store is not None else (Path(store_root) / zone.name if store_root else None)
    config_zones = routing.config.zones if routing is not None else [zone]
    he_context = None
    if routing is not None and routing.config.residency.encrypting:
        from fedshard.crypto.he import PUBLIC_CONTEXT_FILE, load_context

        config = routing.config
        he_context = load_context(he_keys(config) / PUBLIC_CONTEXT_FILE, secret=False, scheme=config.he.scheme)
    aggregate_signer = _aggregate_signer(zone, tls) if tls is not None else None
    audit = None
    if store is not None:
        Path(store).mkdir(parents=True, exist_ok=True)
        signer = HeadSigner.from_files(tls.key, tls.cert) if tls is not None else None  # unsigned when insecure
        repair_audit_tail(Path(store) / AUDIT_FILE)  # an append a crash cut short; logged, kept aside
        audit = AuditLog(Path(store) / AUDIT_FILE, signer=signer)
    return ZoneAggregator(
        zone.name,
        zone.region,
        store_dir=store,
        staging_bytes=zone.staging_mb << 20,
        residency=routing.zone_policy(zone.name, site_keys) if routing is not None else None,
        audit=audit,
        connect=tls_connector(tls, {z.name: z.region for z in config_zones}),
        he_context=he_context,
        bounds=routing.config.aggregation if routing is not None else None,
        peers=peers if peers is not None else {z.name: z.endpoint for z in config_zones if _dialable(z.endpoint)},
        signer=aggregate_signer,
    )


def _dialable(endpoint: str) -> bool:
    """Whether ``endpoint`` can be dialled as it is (port 0 asks the serving host for a free port)."""
    return not endpoint.endswith(":0")


def _aggregate_signer(zone: ZoneConfig, tls: TlsFiles) -> AggregateSigner:
    """The zone's aggregate signer, from its TLS files; refuses a certificate of another party."""
    from fedshard.crypto.identity import Role, read_identity
    from fedshard.integrity.aggregate_signature import AggregateSigner

    cert, key, ca = tls.read()
    holder = read_identity(cert, ca)
    if holder.role is not Role.ZONE or (holder.name, holder.jurisdiction_or_region) != (zone.name, zone.region):
        raise PkiError(
            f"zone {zone.name} ({zone.region}) was given the certificate of {holder} ({tls.cert}); "
            f"pass the certificate `fedshard keys init` issued to zone {zone.name}"
        )
    return AggregateSigner(key, cert)


def streaming_parties(config: FederationConfig) -> int:
    """How many parties may hold streams at a zone: every site (push, fetch) and zone (forward)."""
    return len(config.sites) + len(config.zones)


class ServedZones:
    """The zones of :func:`serving_zones`: each a gRPC server in this process, and the zone objects.

    :meth:`add` starts one more (a zone added to a running federation).
    """

    def __init__(
        self, routing: FederationRouting, store_root: str | Path | None, site_keys: Mapping[str, bytes] | None
    ) -> None:
        self.routing = routing
        self.store_root = store_root
        self.site_keys = site_keys
        self.endpoints: dict[str, str] = {}  # the zones' peers too: only this host knows the ports it picked
        self.zones: dict[str, ZoneAggregator] = {}
        self._servers: list[grpc.Server] = []

    def add(self, zc: ZoneConfig) -> str:
        """Start zone ``zc`` (port 0: any free port); its endpoint."""
        from fedshard.zone.rpc.service import serve

        host = zc.endpoint.rsplit(":", 1)[0]
        zone = self.zones[zc.name] = make_zone(
            zc, self.store_root, routing=self.routing, site_keys=self.site_keys, peers=self.endpoints
        )
        server, port = serve(zone, zc.endpoint, limits=zc.limits, parties=streaming_parties(self.routing.config))
        self._servers.append(server)
        self.endpoints[zc.name] = f"{host}:{port}"
        return self.endpoints[zc.name]

    def close(self) -> None:
        """Stop every server, then close every zone."""
        for server in self._servers:
            server.stop(grace=1.0).wait()
        for zone in self.zones.values():
            zone.close()


@contextlib.contextmanager
def serving_zones(
    config: FederationConfig,
    store_root: str | Path | None = None,
    site_keys: Mapping[str, bytes] | None = None,
) -> Iterator[ServedZones]:
    """Start every configured zone as a gRPC server in this process, enforcing the
    federation's residency policy; yields the endpoints and the zones.

    Port 0 in a zone's endpoint picks a free port.
    """
    from fedshard.assembly.routing import FederationRouting

    routing = FederationRouting(config)
    routing.check()
    served = ServedZones(routing, store_root, site_keys)
    try:
        for zc in config.zones:
            served.add(zc)
        yield served
    finally:
        served.close()


@contextlib.contextmanager
def running_zones(
    config: FederationConfig,
    store_root: str | Path | None = None,
    site_keys: Mapping[str, bytes] | None = None,
) -> Iterator[dict[str, str]]:
    """:func:`serving_zones`, yielding only the endpoints."""
    with serving_zones(config, store_root, site_keys) as served:
        yield served.endpoints
