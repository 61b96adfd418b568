"""The small interfaces the round logic talks through, like httpx's transports.

* :class:`ZoneClient` — data plane to one zone (gRPC in real runs, or direct calls).
* :class:`SiteGateway` — control plane to the sites (Flower's Grid, or in-process).

The Coordinator and Site depend only on these, so the same round logic runs in
unit tests, in the embedded demo, inside Flower's simulation engine and across
machines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from pydantic import BaseModel

from fedshard.integrity import Manifest
from fedshard.protocol.messages import MessageKind, SiteFailure
from fedshard.protocol.rounds import (
    DEFAULT_GROUP,
    Aggregate,
    AggregateSummary,
    PartialSum,
    PushReceipt,
    RoundSpec,
    ShardPayload,
)

__all__ = ["SiteGateway", "ZoneClient", "ZoneConnector"]


class ZoneClient(Protocol):
    """Data-plane operations on one zone."""

    def open_round(self, spec: RoundSpec) -> None:
        """Start accepting pushes for a round (coordinator)."""
        ...

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        """Push one site's update (site): values, or ciphertext ``bytes`` where the manifest
        says ``encrypted``. Raises PushRejectedError (with its code) if refused."""
        ...

    def close_round(self, round: int, forward_to: tuple[str, str] | None = None) -> list[AggregateSummary]:
        """Publish the round's aggregates, one per group, after forwarding partial sums
        of global shards to ``forward_to`` = the reducing zone's (name, endpoint) (coordinator)."""
        ...

    def forward(self, partial: PartialSum, sums: Mapping[str, ShardPayload]) -> int:
        """Fold another zone's partial sums into the round (zone to reducing zone):
        ``Σ (w/unit)·x`` (float32 or float64), or ciphertext ``bytes`` where the header says
        ``encrypted``."""
        ...

    def abort_round(self, round: int) -> None:
        """Discard the round (coordinator)."""
        ...

    def fetch(self, round: int, group: str = DEFAULT_GROUP, site_id: str = "") -> Aggregate:
        """Download a published aggregate (site ``site_id``): means, and encrypted sums as ``bytes``."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


ZoneConnector = Callable[[str, str], ZoneClient]
"""Makes a client from ``(zone name, endpoint)``."""


class SiteGateway(Protocol):
    """Control-plane fan-out to sites. Node keys are opaque strings (Flower node ids
    or site ids); replies that did not come back are :class:`SiteFailure`."""

    def nodes(self) -> list[str]:
        """Keys of the sites currently connected."""
        ...

    def send(
        self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float
    ) -> dict[str, BaseModel | SiteFailure]:
        """Send one message per node and collect the replies (or failures)."""
        ...
