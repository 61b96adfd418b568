"""The coordinator's calls to every zone of a round: open it at all of them or none,
close it (the reducing zone last, so the others' partial sums have arrived), abort it.
A zone that fails to open or close the round aborts it everywhere."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fedshard.coordinator._timings import RoundClock
from fedshard.errors import FedshardError, RoundAbortedError
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.rounds import AggregateKey, AggregateSummary, RoundSpec

__all__ = ["abort_everywhere", "close_everywhere", "open_everywhere"]

log = logging.getLogger(__name__)


def open_everywhere(zones: Mapping[str, ZoneClient], spec: RoundSpec) -> None:
    """Open ``spec``'s round at every zone; if one fails, abort it at all and raise
    :class:`RoundAbortedError` naming that zone."""
    for name, zone in zones.items():
        try:
            zone.open_round(spec)
        except FedshardError as exc:
            abort_everywhere(zones, spec.round)  # also a zone that opened it before failing to answer
            raise RoundAbortedError(f"round {spec.round}: zone {name} could not open the round: {exc}", name) from None


def abort_everywhere(zones: Mapping[str, ZoneClient], rnd: int) -> None:
    """Discard round ``rnd`` at every zone (a zone that cannot is logged, not raised)."""
    for name, zone in zones.items():
        try:
            zone.abort_round(rnd)
        except FedshardError as exc:
            log.warning("round %d: zone %s could not abort: %s", rnd, name, exc)


def close_everywhere(
    zones: Mapping[str, ZoneClient], rnd: int, reducer: str | None, endpoints: Mapping[str, str], clock: RoundClock
) -> dict[AggregateKey, AggregateSummary]:
    """Close round ``rnd`` at every zone, the reducing zone last (the others forward their
    partial sums to it); the summaries by aggregate. A zone that fails aborts the round
    everywhere (:class:`RoundAbortedError` naming it)."""
    forward_to = (reducer, endpoints[reducer]) if reducer is not None else None
    order = sorted(zones, key=lambda name: (name == reducer, name))
    published: dict[AggregateKey, AggregateSummary] = {}
    for name in order:
        try:
            with clock.closing(name):
                summaries = zones[name].close_round(rnd, forward_to if name != reducer else None)
        except FedshardError as exc:
            abort_everywhere(zones, rnd)
            raise RoundAbortedError(f"round {rnd}: zone {name} could not close the round: {exc}", name) from None
        published.update({s.key: s for s in summaries})
    return published
