"""Residency groups and their model-version chains (metadata only).

Sites whose shards end up in the same aggregates form a **residency group** (for
example, EU sites share regional EU aggregates of their personal layers, while
everyone shares the global ones). Each group has its own model and version chain;
the run's ``version`` combines them.

A group remembers the rounds it applied and, from its sites' reports, the last round
each site applied, so each message carries only the rounds that site has not applied
(:meth:`Group.missed`): the head it must reach and the aggregates since its own round,
never the whole history. Sites keep their own chain and extend it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from blake3 import blake3

from fedshard.integrity import merkle_root, next_version
from fedshard.protocol.messages import AppliedRound, PublishedAggregate, SiteInfo
from fedshard.protocol.rounds import AggregateKey, AggregateSummary

__all__ = ["Group", "combine_versions", "recorded_names", "residency_groups"]


@dataclass
class Group:
    """Sites that apply the same aggregates, their model's version chain, and where each site stands."""

    view: dict[AggregateKey, list[str]]  # aggregate -> the shard ids the group applies from it
    sites: list[str]
    version: str
    rounds: list[AppliedRound] = field(default_factory=list)  # every round the group applied, in order
    applied: dict[str, int] = field(default_factory=dict)  # site id -> last round it reported applying
    _members: set[str] = field(init=False, repr=False, compare=False)  # ``sites`` as a set (10,000 sites)

    def __post_init__(self) -> None:
        self._members = set(self.sites)

    def add(self, site_id: str, applied_round: int) -> None:
        """A site joins the group, having applied up to ``applied_round``."""
        if site_id not in self._members:
            self.sites.append(site_id)
            self._members.add(site_id)
        self.applied[site_id] = applied_round

    def applied_root(self, published: Mapping[AggregateKey, AggregateSummary]) -> str:
        """Root over the shards this group applies from the round's aggregates."""
        digests: dict[str, str] = {}
        for key, shard_ids in self.view.items():
            summary = published.get(key)
            if summary is None:
                continue
            entries = {e.shard_id: e.digest for e in summary.shards}
            digests.update({sid: entries[sid] for sid in shard_ids if sid in entries})
        return merkle_root(digests)

    def extend(
        self, rnd: int, published: Mapping[AggregateKey, AggregateSummary], announced: list[PublishedAggregate]
    ) -> str:
        """Apply round ``rnd`` to the chain; the root over what the group applies."""
        root = self.applied_root(published)
        self.version = next_version(self.version, root)
        self.rounds.append(AppliedRound(round=rnd, merkle_root=root, aggregates=announced))
        return root

    def missed(self, site_id: str) -> list[AppliedRound]:
        """The rounds ``site_id`` has not applied, as far as its reports tell, oldest first."""
        since = self.applied.get(site_id, 0)
        start = len(self.rounds)
        while start > 0 and self.rounds[start - 1].round > since:
            start -= 1
        return self.rounds[start:]

    def record(self, site_id: str, applied_round: int | None) -> None:
        """Note the last round ``site_id`` applied, from its report (None: the report does not say)."""
        if applied_round is not None and site_id in self._members:
            self.applied[site_id] = applied_round


def residency_groups(sites: list[SiteInfo]) -> dict[str, list[SiteInfo]]:
    """Sites that apply the same aggregates, by group name (their jurisdictions, joined by ``+``)."""
    by_view: dict[tuple[tuple[AggregateKey, tuple[str, ...]], ...], list[SiteInfo]] = {}
    for info in sorted(sites, key=lambda i: i.site_id):
        view = tuple(sorted((key, tuple(shards)) for key, shards in info.view.items()))
        by_view.setdefault(view, []).append(info)
    groups: dict[str, list[SiteInfo]] = {}
    for members in by_view.values():
        name = "+".join(sorted({m.jurisdiction for m in members}))
        while name in groups:
            name += "'"
        groups[name] = members
    return groups


def recorded_names(formed: list[str], recorded: set[str]) -> dict[str, str]:
    """Renames (formed name → recorded name) that give resumed groups the names the run recorded.

    A group is named by its members' jurisdictions (:func:`residency_groups`). One formed while
    some of its sites had not reconnected yet has a shorter name (``SG`` for the recorded
    ``SG+US``). It takes the name of the one recorded group, not formed again, whose
    jurisdictions include its own. Where none or several do, it keeps its name, and the resume's
    chain check refuses it.
    """

    def codes(name: str) -> set[str]:
        return set(name.rstrip("'").split("+"))

    renames: dict[str, str] = {}
    for name in formed:
        if name in recorded:
            continue
        taken = set(formed) | set(renames.values())
        free = [r for r in sorted(recorded) if r not in taken and codes(name) <= codes(r)]
        if len(free) == 1:
            renames[name] = free[0]
    return renames


def combine_versions(versions: Mapping[str, str]) -> str:
    """One version for the whole federation: the only group's, or a digest over all groups'
    (BLAKE3, the hash of every model version: :mod:`fedshard.integrity.version`)."""
    if len(versions) == 1:
        return next(iter(versions.values()))
    return blake3(json.dumps(dict(sorted(versions.items()))).encode()).hexdigest()
