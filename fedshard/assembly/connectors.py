"""Zone clients: how a part of a federation reaches the zones (gRPC, with mutual TLS when given)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedshard.protocol.channels import ZoneClient, ZoneConnector

if TYPE_CHECKING:
    from fedshard.crypto.tls import TlsFiles

__all__ = [
    "grpc_connector",
    "tls_connector",
]


def grpc_connector(name: str, endpoint: str) -> ZoneClient:
    """Zone client over gRPC (the data plane of every real run)."""
    from fedshard.zone.rpc.client import GrpcZoneClient

    return GrpcZoneClient(endpoint)


def tls_connector(tls: TlsFiles | None) -> ZoneConnector:
    """Zone clients over gRPC, with mutual TLS when ``tls`` is given."""
    from fedshard.zone.rpc.client import GrpcZoneClient

    def connect(name: str, endpoint: str) -> ZoneClient:
        return GrpcZoneClient(endpoint, tls=tls)

    return connect
