"""In-process adapters: sites called directly, zones called directly (no network).

The embedded demo uses :class:`InProcessSiteGateway` with real gRPC zones; tests may
also reach zones directly, through :func:`in_process_connector` (the same
:class:`~fedshard.protocol.channels.ZoneClient` contract as the gRPC client).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait

from pydantic import BaseModel

from fedshard.errors import FedshardError, ZoneError
from fedshard.integrity import Manifest
from fedshard.protocol.channels import ZoneClient, ZoneConnector
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
from fedshard.site.site import Site
from fedshard.zone.aggregator import ZoneAggregator

__all__ = ["InProcessSiteGateway", "InProcessZoneClient", "in_process_connector"]


class InProcessZoneClient:
    """A :class:`~fedshard.protocol.channels.ZoneClient` that calls a ZoneAggregator directly."""

    def __init__(self, zone: ZoneAggregator) -> None:
        self.zone = zone

    def open_round(self, spec: RoundSpec) -> None:
        """See :class:`ZoneClient`."""
        self.zone.open_round(spec)

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        """See :class:`ZoneClient`."""
        return self.zone.push(manifest, token, shards)

    def close_round(self, round: int, forward_to: tuple[str, str] | None = None) -> list[AggregateSummary]:
        """See :class:`ZoneClient`."""
        return self.zone.close_round(round, forward_to)

    def forward(self, partial: PartialSum, sums: Mapping[str, ShardPayload]) -> int:
        """See :class:`ZoneClient`."""
        return self.zone.receive_partial(partial, sums)

    def abort_round(self, round: int) -> None:
        """See :class:`ZoneClient`."""
        self.zone.abort_round(round)

    def fetch(self, round: int, group: str = DEFAULT_GROUP, site_id: str = "") -> Aggregate:
        """See :class:`ZoneClient`. The zone serves ``site_id`` as the jurisdiction its
        residency config gives that site (a site it does not know is refused)."""
        residency = self.zone.residency
        jurisdiction = residency.jurisdictions.get(site_id) if residency is not None else None
        return self.zone.fetch(round, group, jurisdiction=jurisdiction, by=f"site:{site_id}" if site_id else "-")

    def close(self) -> None:
        """Nothing to release."""


def in_process_connector(zones: Mapping[str, ZoneAggregator]) -> ZoneConnector:
    """Zone clients that call the zones of this process directly, by zone name (the
    endpoint is ignored): the data plane of a federation without a network."""

    def connect(name: str, endpoint: str) -> ZoneClient:
        zone = zones.get(name)
        if zone is None:
            raise ZoneError(f"no zone named {name!r} in this process (known: {', '.join(sorted(zones)) or 'none'})")
        return InProcessZoneClient(zone)

    return connect


class InProcessSiteGateway:
    """A :class:`~fedshard.protocol.channels.SiteGateway` over Site objects in this process.

    Sites run in a thread pool so that a slow site hits the timeout like a remote one.
    """

    def __init__(self, sites: Mapping[str, Site], max_workers: int = 1) -> None:
        self._sites = dict(sites)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="site")

    def add(self, sites: Mapping[str, Site]) -> None:
        """Connect more sites (sites joining a running federation)."""
        self._sites.update(sites)

    def nodes(self) -> list[str]:
        """See :class:`SiteGateway`."""
        return list(self._sites)

    def send(
        self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float
    ) -> dict[str, BaseModel | SiteFailure]:
        """See :class:`SiteGateway`."""
        futures = {node: self._pool.submit(self._sites[node].handle, kind, msg) for node, msg in messages.items()}
        wait(futures.values(), timeout=timeout)
        out: dict[str, BaseModel | SiteFailure] = {}
        for node, fut in futures.items():
            if not fut.done():
                fut.cancel()
                out[node] = SiteFailure(reason=f"no reply within {timeout:.0f}s")
                continue
            exc = fut.exception()
            if exc is None:
                out[node] = fut.result()
            elif isinstance(exc, FedshardError):
                out[node] = SiteFailure(reason=str(exc))
            else:
                out[node] = SiteFailure(reason=f"{type(exc).__name__}: {exc}")
        return out

    def close(self) -> None:
        """Stop the worker threads, then close the sites (what they keep open between messages)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for site in self._sites.values():
            site.close()
