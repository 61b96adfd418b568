"""In-process adapters: sites called directly, zones called directly (no network).

The embedded demo uses :class:`InProcessSiteGateway` with real gRPC zones; tests may
also reach zones directly, through :func:`in_process_connector` (the same
:class:`~fedshard.protocol.channels.ZoneClient` contract as the gRPC client).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from pydantic import BaseModel

from fedshard._fs import Barrier, deferred_to, immediate
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

__all__ = ["InProcessSiteGateway", "InProcessZoneClient", "StagedDurability", "in_process_connector"]


class InProcessZoneClient:
    """A :class:`~fedshard.protocol.channels.ZoneClient` that calls a ZoneAggregator directly."""

    def __init__(self, zone: ZoneAggregator) -> None:
        self.zone = zone

    def open_round(self, spec: RoundSpec) -> None:
        """See :class:`ZoneClient`."""
        with immediate():  # the zone's writes are its own promises, whatever its caller deferred (but see push)
            self.zone.open_round(spec)

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        """See :class:`ZoneClient`. Runs in the caller's context: a site whose flushes are deferred
        to a barrier (:class:`StagedDurability`) defers the zone's audit record of its push to the
        same barrier, which the gateway syncs before the site's reply goes on; the zone flushes its
        audit log itself before it forwards or publishes any sum (its close)."""
        return self.zone.push(manifest, token, shards)

    def close_round(self, round: int, forward_to: tuple[str, str] | None = None) -> list[AggregateSummary]:
        """See :class:`ZoneClient`."""
        with immediate():
            return self.zone.close_round(round, forward_to)

    def forward(self, partial: PartialSum, sums: Mapping[str, ShardPayload]) -> int:
        """See :class:`ZoneClient`."""
        with immediate():
            return self.zone.receive_partial(partial, sums)

    def abort_round(self, round: int) -> None:
        """See :class:`ZoneClient`."""
        with immediate():
            self.zone.abort_round(round)

    def fetch(self, round: int, group: str = DEFAULT_GROUP, site_id: str = "") -> Aggregate:
        """See :class:`ZoneClient`. The zone serves ``site_id`` as the jurisdiction its
        residency config gives that site (a site it does not know is refused). Like
        :meth:`push`, in the caller's context (the audit record of the fetch follows its barrier)."""
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


@dataclass(frozen=True)
class StagedDurability:
    """How an :class:`InProcessSiteGateway` makes its sites' writes durable: deferred to
    ``barrier`` and flushed once for every ``batch`` sites, before any of them releases."""

    barrier: Barrier
    batch: int


Staged = Generator[None, None, BaseModel]


class InProcessSiteGateway:
    """A :class:`~fedshard.protocol.channels.SiteGateway` over Site objects in this process.

    Sites run in a thread pool so that a slow site hits the timeout like a remote one.

    With ``durability`` (an in-process simulation's), the sites' messages run in batches of
    ``durability.batch`` sites: every site of a batch runs up to its release point with its
    flushes deferred (:meth:`Site.staged <fedshard.site.site.Site.staged>`), one barrier
    makes what they all wrote durable, then they push and finish; a second barrier makes
    what they wrote since durable before their replies are handed on. One ``syncfs`` per
    batch and stage instead of several flushes per site and message; each site still
    releases nothing its ledger has not durably reserved. A barrier that fails fails the
    batch's sites (nothing of theirs was released).
    """

    def __init__(
        self, sites: Mapping[str, Site], max_workers: int = 1, durability: StagedDurability | None = None
    ) -> None:
        self._sites = dict(sites)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="site")
        self._durability = durability

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
        if self._durability is None:
            futures = {node: self._pool.submit(self._sites[node].handle, kind, msg) for node, msg in messages.items()}
            wait(futures.values(), timeout=timeout)
            out: dict[str, BaseModel | SiteFailure] = {}
            for node, fut in futures.items():
                if fut.done():
                    out[node] = _outcome(fut)
                else:
                    fut.cancel()
                    out[node] = SiteFailure(reason=f"no reply within {timeout:.0f}s")
            return out
        deadline = time.monotonic() + timeout
        nodes = list(messages)
        out = {}
        step = max(1, self._durability.batch)
        for i in range(0, len(nodes), step):
            batch = {node: messages[node] for node in nodes[i : i + step]}
            out.update(self._send_batch(kind, batch, deadline, timeout, self._durability.barrier))
        return out

    def _send_batch(
        self, kind: MessageKind, messages: Mapping[str, BaseModel], deadline: float, timeout: float, barrier: Barrier
    ) -> dict[str, BaseModel | SiteFailure]:
        """One batch of sites, in two stages, each followed by the barrier (see the class docstring)."""
        staged = {node: self._sites[node].staged(kind, msg) for node, msg in messages.items()}
        out: dict[str, BaseModel | SiteFailure] = {}
        waiting = staged
        for _ in range(2):
            futures = {node: self._pool.submit(_advance, stages, barrier) for node, stages in waiting.items()}
            wait(futures.values(), timeout=max(0.0, deadline - time.monotonic()))
            waiting = {}
            for node, fut in futures.items():
                if not fut.done():  # its stage may still end: it must not go on from there
                    fut.add_done_callback(_closer(staged[node]))
                    out[node] = SiteFailure(reason=f"no reply within {timeout:.0f}s")
                elif fut.exception() is None and fut.result() is None:
                    waiting[node] = staged[node]  # at its release point
                else:
                    out[node] = _outcome(fut)
            try:
                barrier.sync()
            except OSError as exc:  # what the batch wrote may be lost: none of it goes on or counts
                for stages in waiting.values():
                    stages.close()  # released nothing; a reservation it made stays spent
                reason = f"the site's writes could not be made durable: {exc.strerror or exc}"
                return dict.fromkeys(messages, SiteFailure(reason=reason))
        for node, stages in waiting.items():  # a message that yields twice is a bug: end it, say so
            stages.close()
            out[node] = SiteFailure(reason=f"site {node}: its message went past its release point twice")
        return out

    def close(self) -> None:
        """Stop the worker threads, then close the sites (what they keep open between messages)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for site in self._sites.values():
            site.close()


def _advance(stages: Staged, barrier: Barrier) -> BaseModel | None:
    """Run ``stages`` to its release point (None) or to its reply, its flushes deferred to ``barrier``."""
    with deferred_to(barrier):
        try:
            next(stages)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
    return None


def _closer(stages: Staged) -> Callable[[Future[BaseModel | None]], None]:
    """A done-callback that ends ``stages`` (a site timed out at a stage: it does not go on)."""

    def close(_: Future[BaseModel | None]) -> None:
        stages.close()

    return close


def _outcome(fut: Future[BaseModel] | Future[BaseModel | None]) -> BaseModel | SiteFailure:
    """What a site's finished future came to: its reply, or the failure to report."""
    exc = fut.exception()
    if exc is None:
        result = fut.result()
        assert result is not None  # a release point is not an outcome
        return result
    if isinstance(exc, FedshardError):
        return SiteFailure(reason=str(exc))
    return SiteFailure(reason=f"{type(exc).__name__}: {exc}")
