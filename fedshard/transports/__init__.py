"""Transports adapt the roles to a medium: ``inprocess`` (tests, the embedded demo) and
``flower/`` (Flower's Grid, records, the ServerApp and ClientApp factories).
The zones' gRPC transport lives with the zone, in :mod:`fedshard.zone.rpc`.
"""

__all__: list[str] = []
