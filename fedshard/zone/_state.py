"""What a zone keeps per open round (sums by group, contributors, who pushed, their noise terms)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fedshard.aggregation import ShardAccumulator
from fedshard.crypto.ciphertexts import EncryptedSum
from fedshard.errors import HeldPush, RefusalCode, ZoneError
from fedshard.integrity import Manifest
from fedshard.protocol.rounds import DEFAULT_WEIGHT, RoundSpec
from fedshard.sharding import ShardPlan

__all__ = ["OpenRound", "manifest_digest"]


def manifest_digest(manifest: Manifest) -> str:
    """SHA-256 of a manifest's canonical bytes (its signature included): the same push, retried."""
    return hashlib.sha256(manifest.to_bytes()).hexdigest()


@dataclass
class OpenRound:
    """One open round at a zone: its spec and plan, running sums per aggregate group, who pushed."""

    spec: RoundSpec
    plan: ShardPlan
    groups: dict[str, ShardAccumulator] = field(default_factory=dict)  # group -> running sums
    encrypted: dict[str, EncryptedSum] = field(default_factory=dict)  # group -> ciphertext sums
    contributors: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # group -> shard -> sites
    pushing: set[str] = field(default_factory=set)
    counted: dict[str, None] = field(default_factory=dict)  # in the order counted
    forwarding: set[str] = field(default_factory=set)  # zones whose partial sums are arriving
    forwarded_from: set[str] = field(default_factory=set)  # zones whose partial sums were folded in
    packs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # encrypted shard -> its pack's members
    manifests: dict[str, str] = field(default_factory=dict)  # site pushing or counted -> its manifest's digest
    norm_reference: dict[str, float] = field(default_factory=dict)  # shard set -> median norm it is bounded by
    norms: dict[str, dict[str, float]] = field(default_factory=dict)  # shard set -> site -> norm (after clipping)
    noise: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # group -> noise terms -> sites naming them

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

    def fold_encrypted(self, group: str, shard_id: str, sites: Iterable[str], context: Any) -> EncryptedSum:
        """The group's ciphertext sums, noting ``sites`` as contributors of ``shard_id``."""
        self.contributors.setdefault(group, {}).setdefault(shard_id, set()).update(sites)
        acc = self.encrypted.get(group)
        if acc is None:
            acc = self.encrypted[group] = EncryptedSum(context)
        return acc

    def note_noise(self, group: str, terms: str, sites: Iterable[str]) -> None:
        """Note that ``sites``' shares in ``group`` were made under the noise ``terms``
        (:attr:`~fedshard.integrity.Manifest.noise`; "": no shared noise)."""
        self.noise.setdefault(group, {}).setdefault(terms, set()).update(sites)

    def noise_terms(self, group: str) -> str:
        """The noise terms every share of ``group`` names ("": none, or no shares);
        :class:`~fedshard.errors.ZoneError` (code ``privacy``) when they differ: then the
        shares protect each site's records with less noise than some site accounts."""
        named = self.noise.get(group, {})
        if len(named) <= 1:
            return next(iter(named), "")
        who = "; ".join(
            f"{', '.join(sorted(sites))}: {terms or 'no shared noise'}" for terms, sites in sorted(named.items())
        )
        raise ZoneError(
            f"round {self.spec.round}: the shares of group {group} were made under different noise terms ({who}); "
            "each site accounts σ for the others' shares, which only add up to it under the same terms",
            RefusalCode.PRIVACY,
        )

    def group_names(self) -> list[str]:
        """Groups that received anything, sorted."""
        return sorted(set(self.groups) | set(self.encrypted))
