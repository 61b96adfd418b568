"""Zone clients: how a part of a federation reaches the zones (gRPC, with mutual TLS when given).

Under mutual TLS every connection checks the peer is the zone it is meant for: the
connector knows each zone's region from the config of the party that builds it (a site's
own copy, the coordinator's, a zone's), and the client completes a handshake only with
the certificate the CA issued to that zone name in that region
(:mod:`fedshard.zone.rpc.client`). A zone the party's config does not list cannot be
dialled at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedshard.errors import PeerIdentityError
from fedshard.protocol.channels import ZoneClient, ZoneConnector

if TYPE_CHECKING:
    from fedshard.crypto.tls import TlsFiles

__all__ = [
    "grpc_connector",
    "tls_connector",
]


def grpc_connector(name: str, endpoint: str) -> ZoneClient:
    """Zone client over gRPC in plain text (loopback: simulation, tests); nothing checks who answers."""
    from fedshard.zone.rpc.client import GrpcZoneClient

    return GrpcZoneClient(endpoint)


def tls_connector(tls: TlsFiles | None, regions: Mapping[str, str]) -> ZoneConnector:
    """Zone clients over gRPC; with ``tls``, mutual TLS that accepts only the zone named.

    Parameters
    ----------
    tls:
        This party's certificate and key, and the federation CA; None: plain text.
    regions:
        Zone name → region, from this party's own config (it may be a live mapping, read
        at each connection). ``connect(name, endpoint)`` then talks only to a peer whose
        certificate names zone ``name`` in ``regions[name]``, whoever gave the endpoint.

    Raises
    ------
    PeerIdentityError
        (from ``connect``) ``name`` is not a zone of this party's config.
    """
    from fedshard.crypto.identity import ZoneId
    from fedshard.zone.rpc.client import GrpcZoneClient

    def connect(name: str, endpoint: str) -> ZoneClient:
        if tls is None:
            return GrpcZoneClient(endpoint)
        region = regions.get(name)
        if region is None:
            known = ", ".join(sorted(regions)) or "none"
            raise PeerIdentityError(f"zone {name!r} is not a zone of this party's config (zones: {known})")
        return GrpcZoneClient(endpoint, tls=tls, zone=ZoneId(name, region))

    return connect
