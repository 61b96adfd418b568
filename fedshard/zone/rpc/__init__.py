"""gRPC data plane of a zone: generated stubs, the service, and the site/coordinator client.

``zone_pb2*.py`` are generated from ``zone.proto`` by ``make proto``; do not edit them.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.zone.rpc.client import GrpcZoneClient
    from fedshard.zone.rpc.service import ZoneService, serve
    from fedshard.zone.rpc.shared import SharedZoneChannels

__all__ = ["GrpcZoneClient", "SharedZoneChannels", "ZoneService", "serve"]

__getattr__ = lazy_surface(
    __name__, {"GrpcZoneClient": "client", "SharedZoneChannels": "shared", "ZoneService": "service", "serve": "service"}
)
