"""What a run produces, as the coordinator reports it (metadata only): each round's
result, the whole run's, and the observer that receives them as they come.

They are what the event log records (:mod:`fedshard.coordinator.events`) and what
``summary.json`` and the progress display are made from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fedshard.errors import RefusalCode
from fedshard.protocol.messages import SiteInfo
from fedshard.protocol.rounds import AggregateSummary

__all__ = ["PhaseObserver", "RoundObserver", "RoundResult", "RunResult", "aggregate_entries", "refusal_line"]


def aggregate_entries(published: Iterable[AggregateSummary]) -> list[dict[str, Any]]:
    """What each zone published in a round, as :attr:`RoundResult.aggregates` records it: zone,
    group, Merkle root (what a resumed coordinator announces to sites that are behind), counts."""
    return [
        {
            "zone": s.zone,
            "group": s.group,
            "merkle_root": s.merkle_root,
            "shards": len(s.shards),
            "sites": list(s.sites),
        }
        for s in published
    ]


def refusal_line(reason: str, code: RefusalCode | None) -> str:
    """A refusal as people see it: ``code: reason`` where it has a code, e.g. ``digest: zone
    eu-central refused site-a's push for round 3: shard fc1.weight#r0c0: digest does not
    match the manifest``; the reason alone otherwise."""
    return f"{code.value}: {reason}" if code is not None else reason


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round produced (metadata only).

    ``refused`` says, in one line per site, why a selected site did not contribute;
    ``refusal_codes`` holds the :class:`~fedshard.errors.RefusalCode` of those refusals
    that have one (a zone refused the site's push, or refused to serve it an aggregate).
    ``excluded`` says, in one line per site, why the coordinator left the site's train or
    evaluate reply (or both) out of the round's metrics (it disagreed with what the
    coordinator knows, or was out of bounds: :mod:`fedshard.coordinator._replies`), with their
    codes in ``excluded_codes``; whether its update counted is ``sites`` (the zones' word).
    """

    round: int
    version: str
    merkle_root: str
    sites: tuple[str, ...]
    refused: dict[str, str]
    train_loss: float
    accuracy: float
    loss: float
    bytes_up: int
    privacy: dict[str, dict[str, Any]] = field(default_factory=dict)  # site id -> PrivacyReport fields
    versions: dict[str, str] = field(default_factory=dict)  # residency group -> its model version
    roots: dict[str, str] = field(default_factory=dict)  # residency group -> root of what it applied
    aggregates: list[dict[str, Any]] = field(default_factory=list)  # what each zone published (aggregate_entries)
    refusal_codes: dict[str, RefusalCode] = field(default_factory=dict)  # site id -> code of its refusal
    timings: dict[str, Any] = field(default_factory=dict)  # where the round's time went (coordinator.timings)
    traffic: dict[str, Any] = field(default_factory=dict)  # zone -> bytes and shards by class and origin
    excluded: dict[str, str] = field(default_factory=dict)  # site id -> why its reply was left out
    excluded_codes: dict[str, tuple[RefusalCode, ...]] = field(default_factory=dict)  # site id -> their codes

    def refusal(self, site_id: str) -> str:
        """Why ``site_id`` did not contribute, as shown to people (see :func:`refusal_line`)."""
        return refusal_line(self.refused[site_id], self.refusal_codes.get(site_id))


@dataclass
class RunResult:
    """A whole run."""

    sites: list[SiteInfo]
    genesis_version: str
    version: str
    rounds: list[RoundResult] = field(default_factory=list)
    stopped_reason: str = ""
    groups: dict[str, list[str]] = field(default_factory=dict)  # residency group -> its sites
    aborted: list[dict[str, Any]] = field(default_factory=list)  # rounds a zone's failure aborted: round, reason
    refused_nodes: list[dict[str, Any]] = field(default_factory=list)  # nodes refused (NodeRefusal.as_event)
    changes: list[dict[str, Any]] = field(default_factory=list)  # changes taken mid-run: round, change, joined
    started_at: float | None = None  # wall clock (Unix seconds) of the run's fresh start, where recorded
    last_at: float | None = None  # wall clock of the latest event recorded

    @property
    def privacy(self) -> dict[str, dict[str, Any]]:
        """Each site's privacy as last reported (at discovery, then after each round)."""
        latest = {s.site_id: s.privacy.model_dump(mode="json") for s in self.sites if s.privacy is not None}
        for r in self.rounds:
            latest.update(r.privacy)
        return latest


class RoundObserver(Protocol):
    """Receives progress events (progress display, event log)."""

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        """The federation is assembled."""
        ...

    def on_round(self, result: RoundResult) -> None:
        """A round finished."""
        ...


@runtime_checkable
class PhaseObserver(Protocol):
    """An observer that also hears of the phases around the rounds (assembling, the central
    baseline): each may take minutes for a large task, and a display shows what runs."""

    def on_phase(self, what: str) -> None:
        """A phase starts (one line: what runs)."""
        ...
