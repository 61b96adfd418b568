"""Transports adapt the roles to a medium: ``inprocess`` (tests, the embedded demo) and
``flower/`` (Flower's Grid, records, the ServerApp and ClientApp factories).
The zones' gRPC transport lives with the zone, in :mod:`fedshard.zone.rpc`.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.transports.inprocess import InProcessSiteGateway, in_process_connector

__all__ = ["InProcessSiteGateway", "in_process_connector"]

__getattr__ = lazy_surface(__name__, {"InProcessSiteGateway": "inprocess", "in_process_connector": "inprocess"})
