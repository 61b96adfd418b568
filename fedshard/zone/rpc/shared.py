"""One gRPC channel per zone for every site of a process (the simulation engines).

A deployed site opens a channel of its own per call (its own mTLS identity, no stale
reconnect backoff). A simulation runs hundreds or thousands of sites in one process
over plaintext loopback, where a channel per site and call costs more than the call:
:class:`SharedZoneChannels` hands every site the same client per zone. What a site
sends is still signed with its own key and checked by the zone as before; sharing the
channel shares only the connection. A call that finds the zone unreachable retires
that channel, so the next attempt (the callers retry) connects afresh.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fedshard.errors import ZoneUnavailableError
from fedshard.integrity import Manifest
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.rounds import (
    DEFAULT_GROUP,
    Aggregate,
    AggregateSummary,
    PartialSum,
    PushReceipt,
    RoundSpec,
    ShardPayload,
)
from fedshard.zone.rpc.client import GrpcZoneClient

__all__ = ["SharedZoneChannels"]

T = TypeVar("T")


class SharedZoneChannels:
    """A :data:`~fedshard.protocol.channels.ZoneConnector` with one plaintext channel per zone.

    Call it as ``connect(name, endpoint)``; the client it returns ignores ``close``
    (:meth:`close` closes every channel, at the end of the run).
    """

    def __init__(self, timeout: float = 300.0) -> None:
        self._timeout = timeout
        self._clients: dict[tuple[str, str], GrpcZoneClient] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, endpoint: str) -> ZoneClient:
        with self._lock:
            client = self._clients.get((name, endpoint))
            if client is None:
                client = self._clients[(name, endpoint)] = GrpcZoneClient(endpoint, timeout=self._timeout)
        return _Borrowed(self, (name, endpoint), client)

    def retire(self, key: tuple[str, str], client: GrpcZoneClient) -> None:
        """Drop ``client`` (its zone did not answer) so the next call connects afresh."""
        with self._lock:
            if self._clients.get(key) is client:
                del self._clients[key]
        # Not closed here: another site's call may still be on it; the channel goes with its last user.

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


class _Borrowed:
    """A site's handle on a shared client: every call goes through; ``close`` keeps the channel."""

    def __init__(self, owner: SharedZoneChannels, key: tuple[str, str], client: GrpcZoneClient) -> None:
        self._owner = owner
        self._key = key
        self._client = client

    def _call(self, method: Callable[..., T], *args: Any) -> T:
        try:
            return method(*args)
        except ZoneUnavailableError:
            self._owner.retire(self._key, self._client)
            raise

    def open_round(self, spec: RoundSpec) -> None:
        """See :class:`ZoneClient`."""
        self._call(self._client.open_round, spec)

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        """See :class:`ZoneClient`."""
        return self._call(self._client.push, manifest, token, shards)

    def close_round(self, round: int, forward_to: tuple[str, str] | None = None) -> list[AggregateSummary]:
        """See :class:`ZoneClient`."""
        return self._call(self._client.close_round, round, forward_to)

    def forward(self, partial: PartialSum, sums: Mapping[str, ShardPayload]) -> int:
        """See :class:`ZoneClient`."""
        return self._call(self._client.forward, partial, sums)

    def abort_round(self, round: int) -> None:
        """See :class:`ZoneClient`."""
        self._call(self._client.abort_round, round)

    def fetch(self, round: int, group: str = DEFAULT_GROUP, site_id: str = "") -> Aggregate:
        """See :class:`ZoneClient`."""
        return self._call(self._client.fetch, round, group, site_id)

    def close(self) -> None:
        """Keep the shared channel open (:meth:`SharedZoneChannels.close` closes it)."""
