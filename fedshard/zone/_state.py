"""What a zone keeps per open round (sums by group and, encrypted, by noise terms; contributors; who pushed)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fedshard.aggregation import ShardAccumulator
from fedshard.audit import Decision
from fedshard.crypto.ciphertexts import EncryptedSum
from fedshard.errors import HeldPush, RefusalCode, ZoneError
from fedshard.integrity import Manifest
from fedshard.protocol.rounds import DEFAULT_WEIGHT, RoundSpec
from fedshard.sharding import ShardPlan

__all__ = ["LEFT_OUT", "OpenRound", "manifest_digest", "settle_audited"]

log = logging.getLogger(__name__)


def manifest_digest(manifest: Manifest) -> str:
    """SHA-256 of a manifest's canonical bytes (its signature included): the same push, retried."""
    return hashlib.sha256(manifest.to_bytes()).hexdigest()


@dataclass
class OpenRound:
    """One open round at a zone: its spec and plan, running sums per aggregate group, who pushed."""

    spec: RoundSpec
    plan: ShardPlan
    groups: dict[str, ShardAccumulator] = field(default_factory=dict)  # group -> running sums
    encrypted: dict[str, EncryptedSum] = field(default_factory=dict)  # group -> ciphertext sums, once settled
    contributors: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # group -> shard -> sites
    pushing: set[str] = field(default_factory=set)
    counted: dict[str, None] = field(default_factory=dict)  # in the order counted
    forwarding: set[str] = field(default_factory=set)  # zones whose partial sums are arriving
    forwarded_from: set[str] = field(default_factory=set)  # zones whose partial sums were folded in
    packs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # encrypted shard -> its pack's members
    manifests: dict[str, str] = field(default_factory=dict)  # site pushing or counted -> its manifest's digest
    norm_reference: dict[str, float] = field(default_factory=dict)  # shard set -> median norm it is bounded by
    norms: dict[str, dict[str, float]] = field(default_factory=dict)  # shard set -> site -> norm (after clipping)
    # encrypted sums, one lane per noise terms the sites' manifests name (see settle): terms -> group -> ...
    lanes: dict[str, dict[str, EncryptedSum]] = field(default_factory=dict)  # ... -> ciphertext sums
    lane_sites: dict[str, dict[str, dict[str, set[str]]]] = field(default_factory=dict)  # ... -> shard -> sites

    def held(self, manifest: Manifest) -> HeldPush | None:
        """What this round holds of ``manifest`` itself (same digest), refused as a duplicate."""
        if self.manifests.get(manifest.site_id) != manifest_digest(manifest):
            return None
        if manifest.site_id in self.counted:
            return HeldPush.COUNTED
        return HeldPush.PENDING if manifest.site_id in self.pushing else None

    @property
    def unit_weight(self) -> float:
        """The largest weight the round fixed for a selected site: the accumulators fold
        ``(w / unit_weight)·x``, so sums stay at the scale of the values (every zone of
        the round computes the same unit, so partial sums add up as they are)."""
        return max((self.spec.weight_for(site) for site in self.spec.sites), default=DEFAULT_WEIGHT)

    def accumulator(self) -> ShardAccumulator:
        """A new accumulator for this round's sums (unit weight; at most all selected sites per shard)."""
        return ShardAccumulator(self.unit_weight, len(self.spec.sites))

    def fold(self, group: str, shard_id: str, sites: Iterable[str]) -> ShardAccumulator:
        """The group's accumulator, noting ``sites`` as contributors of ``shard_id``."""
        self.contributors.setdefault(group, {}).setdefault(shard_id, set()).update(sites)
        acc = self.groups.get(group)
        if acc is None:
            acc = self.groups[group] = self.accumulator()
        return acc

    def fold_encrypted(
        self, group: str, shard_id: str, sites: Iterable[str], context: Any, terms: str = ""
    ) -> EncryptedSum:
        """The ciphertext sums of ``group`` made under the noise ``terms`` (the manifests'
        :attr:`~fedshard.integrity.Manifest.noise`; "": none shared), noting ``sites`` as
        contributors of ``shard_id`` there (:meth:`settle` decides which lane is published)."""
        self.lane_sites.setdefault(terms, {}).setdefault(group, {}).setdefault(shard_id, set()).update(sites)
        lane = self.lanes.setdefault(terms, {})
        acc = lane.get(group)
        if acc is None:
            acc = lane[group] = EncryptedSum(context)
        return acc

    def holders(self, group: str, shard_id: str) -> set[str]:
        """Every site already counted in ``shard_id`` of ``group``, in any lane."""
        held = set(self.contributors.get(group, {}).get(shard_id, ()))
        for groups in self.lane_sites.values():
            held |= groups.get(group, {}).get(shard_id, set())
        return held

    def settle(self, group: str) -> tuple[str, dict[str, set[str]]]:
        """Choose the encrypted sums of ``group`` that are published (or forwarded): the lane
        whose noise terms the most sites named. Every share in it was made under the same
        terms, so each of its sites' σ is what the others' shares add up to; the sites of
        the other lanes are left out of the aggregate (their failure for the round). Returns
        the terms chosen and, by terms, the sites left out. Idempotent.

        Raises
        ------
        ZoneError
            Code ``privacy``: two lanes tie for the most sites (nothing tells which terms
            are the round's), naming each lane's sites.
        """
        named = {
            terms: set().union(*groups[group].values())
            for terms, groups in sorted(self.lane_sites.items())
            if group in groups
        }
        if not named:
            return "", {}
        most = max(len(sites) for sites in named.values())
        best = [terms for terms, sites in named.items() if len(sites) == most]
        if len(best) > 1:
            who = "; ".join(f"{', '.join(sorted(named[t]))}: {t or 'no shared noise'}" for t in best)
            raise ZoneError(
                f"round {self.spec.round}: the encrypted shares of group {group} were made under different noise "
                f"terms, as many sites under each ({who}); each site accounts σ for the others' shares, which only "
                "add up to it under the same terms",
                RefusalCode.PRIVACY,
            )
        chosen = best[0]
        self.encrypted[group] = self.lanes[chosen][group]
        shards = self.contributors.setdefault(group, {})
        for shard_id, sites in self.lane_sites[chosen][group].items():
            shards[shard_id] = set(sites)
        return chosen, {terms: sites for terms, sites in named.items() if terms != chosen}

    def group_names(self) -> list[str]:
        """Groups that received anything, sorted."""
        return sorted(set(self.groups) | set(self.encrypted) | {g for lane in self.lanes.values() for g in lane})


LEFT_OUT = "noise terms differ from the round's other shares"
"""The audit reason for sites whose encrypted shares :meth:`OpenRound.settle` left out."""


def settle_audited(state: OpenRound, group: str, record: Callable[..., None], zone: str, doing: str) -> str:
    """:meth:`OpenRound.settle` ``group`` at ``zone`` (which is about to ``doing`` its sums:
    "publishing", "forwarding"), auditing through ``record`` (the zone's) the sites left
    out, with the noise terms each lane named, and logging them; the terms kept.

    Raises
    ------
    ZoneError
        Code ``privacy``: the lanes tie (audited as ``different noise terms``); the line
        names the zone and says nothing was sent on.
    """
    try:
        chosen, left_out = state.settle(group)
    except ZoneError as exc:
        record(Decision.REFUSED, round=state.spec.round, group=group, reason="different noise terms")
        raise ZoneError(f"zone {zone}: {exc}; not {doing} it", exc.code) from None
    for terms, sites in sorted(left_out.items()):
        record(Decision.REFUSED, round=state.spec.round, group=group, sites=sorted(sites), noise=terms, reason=LEFT_OUT)
        log.warning(
            "round %d: group %s: left out %s, whose encrypted shares name other noise terms (%s) than most sites'",
            state.spec.round,
            group,
            ", ".join(sorted(sites)),
            terms or "no shared noise",
        )
    return chosen
