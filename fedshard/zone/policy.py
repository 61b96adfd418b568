"""What a zone knows of the residency policy, and the checks it runs itself.

A zone does not trust the site, the coordinator or another zone to have routed
correctly: it holds the federation's policy, its own classification of every shard
and every site's jurisdiction (all derived from the federation config, see
:func:`fedshard.assembly.routing.zone_policy_for`), and re-decides every shard it is
sent. It **fails closed**: anything it cannot place under a rule is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from fedshard.errors import IntegrityError, PushRejectedError, RefusalCode, ResidencyViolationError
from fedshard.integrity import Manifest
from fedshard.residency import Policy, PolicyDecision, Router, Scope, ShardProtection, refusal

__all__ = ["ZonePolicy"]

_SERVED_MEMO = 64
"""Serve decisions a zone remembers (aggregates × jurisdictions; forgotten all at once beyond)."""


@dataclass(frozen=True)
class ZonePolicy:
    """The residency facts and checks of one zone.

    Parameters
    ----------
    zone, region:
        This zone and the region it runs in.
    router:
        The federation's router (its policy, zones and reducing zone).
    classes:
        Shard id → sensitivity class, as the zone classifies the model itself.
    jurisdictions:
        Site id → jurisdiction (from the federation config). Under mTLS the caller's
        certificate must say the same.
    protections:
        Site id → how its shards are protected when they leave it.
    site_keys:
        Site id → Ed25519 public key; when given, every manifest must carry a valid
        signature by its site.
    """

    zone: str
    region: str
    router: Router
    classes: Mapping[str, str]
    jurisdictions: Mapping[str, str]
    protections: Mapping[str, ShardProtection] = field(default_factory=dict)
    site_keys: Mapping[str, bytes] | None = None
    min_contributors: int = 1  # with distributed DP noise: fewer sites' shares carry less noise than accounted
    _served: dict[tuple[str, int, str], tuple[object, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # (group, id(contributors), jurisdiction) → (contributors, refusal or ""), see check_serve

    @property
    def policy(self) -> Policy:
        """The federation's residency policy."""
        return self.router.policy

    @property
    def is_reducer(self) -> bool:
        """True if global partial sums are reduced here."""
        return self.router.reducing_zone == self.zone

    def _decision(self, shard_id: str, site_id: str) -> tuple[str, str, PolicyDecision]:
        shard_class = self.classes[shard_id]
        origin = self.jurisdictions[site_id]
        protection = replace(
            self.protections.get(site_id, ShardProtection()), encrypted=self.policy.encrypts(shard_class)
        )
        return shard_class, origin, self.policy.decide(shard_class, origin, protection)

    def group(self, shard_id: str, site_id: str) -> str:
        """The aggregate (``global``, ``regional/EU``…) a site's shard joins."""
        return self.router.route_group(self._decision(shard_id, site_id)[2])

    # pushes from sites -----------------------------------------------------------------------
    def origin(self, site_id: str, certified: str | None) -> str:
        """The jurisdiction a push comes from: the caller's certificate (mTLS), else the config's."""
        configured = self.jurisdictions.get(site_id)
        if configured is None:
            raise PushRejectedError(f"site {site_id!r} is not a site of this federation", RefusalCode.IDENTITY)
        if certified is not None and certified != configured:
            raise PushRejectedError(
                f"identity: the caller's certificate says jurisdiction {certified}, the federation config "
                f"{configured}; re-issue the certificate or fix the config",
                RefusalCode.IDENTITY,
            )
        return configured

    def check_manifest(self, manifest: Manifest) -> dict[str, str]:
        """Check a site's manifest against the policy; the group of each of its shards.

        Raises
        ------
        PushRejectedError
            ``policy`` (other policy digest), ``signature``, ``class`` (a class that
            differs from the zone's) or ``residency`` (a shard this region may not hold).
        """
        if manifest.policy_digest != self.policy.digest:
            raise PushRejectedError(
                f"residency: the manifest was routed by policy {manifest.policy_digest[:12] or '(none)'}…, this "
                f"zone enforces {self.policy.digest[:12]}…; sites and zones must run the same residency config",
                RefusalCode.POLICY,
            )
        if self.site_keys is not None:
            key = self.site_keys.get(manifest.site_id)
            if key is None:
                raise PushRejectedError(
                    f"no manifest-signing key is registered for site {manifest.site_id}", RefusalCode.SIGNATURE
                )
            try:
                manifest.verify_signature(key)
            except IntegrityError as exc:
                raise PushRejectedError(str(exc), RefusalCode.SIGNATURE) from None
        groups: dict[str, str] = {}
        for entry in manifest.shards:
            shard_class, origin, decision = self._decision(entry.shard_id, manifest.site_id)
            if entry.shard_class != shard_class:
                raise PushRejectedError(
                    f"residency: shard {entry.shard_id} is {shard_class} by the federation's classification, the "
                    f"manifest says {entry.shard_class or '(none)'}",
                    RefusalCode.CLASS,
                )
            if entry.encrypted != self.policy.encrypts(shard_class):
                must = "must be HE-encrypted" if self.policy.encrypts(shard_class) else "must not be encrypted"
                raise PushRejectedError(
                    f"residency: shard {entry.shard_id} ({shard_class}) {must}", RefusalCode.ENCRYPTION
                )
            if not decision.permits(self.region):
                raise PushRejectedError(
                    refusal(entry.shard_id, shard_class, origin, self.region), RefusalCode.RESIDENCY
                )
            groups[entry.shard_id] = self.router.route_group(decision)
        return groups

    # partial sums from other zones -------------------------------------------------------------
    def check_partial(self, sender: str, shard_id: str, contributors: Iterable[str]) -> None:
        """Check that a forwarded partial sum may be reduced here.

        Raises
        ------
        PushRejectedError
            ``residency`` when this zone is not the reducing zone, a contribution's
            policy does not allow it here or does not make it global, or the site pushes
            that shard to another zone than ``sender`` (so ``sender`` cannot hold it).
        """
        if not self.is_reducer:
            raise PushRejectedError(
                f"zone {self.zone} is not the reducing zone; partial sums go to {self.router.reducing_zone}",
                RefusalCode.RESIDENCY,
            )
        if sender not in {z.name for z in self.router.zones} or sender == self.zone:
            raise PushRejectedError(f"partial sum from unknown zone {sender!r}", RefusalCode.IDENTITY)
        for site_id in contributors:
            if site_id not in self.jurisdictions:
                raise PushRejectedError(f"partial sum names unknown site {site_id!r}", RefusalCode.IDENTITY)
            shard_class, origin, decision = self._decision(shard_id, site_id)
            if not decision.permits(self.region):
                raise PushRejectedError(refusal(shard_id, shard_class, origin, self.region), RefusalCode.RESIDENCY)
            if self.router.scope_of(decision) is not Scope.GLOBAL:
                raise PushRejectedError(
                    f"residency: shard {shard_id} ({shard_class}, origin {origin}) is aggregated in its region, "
                    "not globally; it may not be forwarded",
                    RefusalCode.RESIDENCY,
                )
            first_hop = self.router.zone_for(decision, origin)
            if first_hop != sender:
                raise PushRejectedError(
                    f"residency: the partial sum of shard {shard_id} names site {site_id}, which pushes that shard "
                    f"to zone {first_hop}, not to {sender}",
                    RefusalCode.RESIDENCY,
                )

    # serving aggregates ---------------------------------------------------------------------
    def check_serve(self, group: str, contributors: Mapping[str, Iterable[str]], jurisdiction: str) -> None:
        """Raise :class:`ResidencyViolationError` unless a site in ``jurisdiction`` may
        receive every shard of the aggregate (``contributors``: shard id → site ids).

        Decided once per aggregate and jurisdiction: ``contributors`` of a published
        aggregate never change, and every site of a round fetches the same one (the
        decision is remembered with the very mapping it was made for)."""
        key = (group, id(contributors), jurisdiction)
        memo = self._served.get(key)
        if memo is None or memo[0] is not contributors:
            if len(self._served) >= _SERVED_MEMO:
                self._served.clear()
            memo = self._served[key] = (contributors, self._serve_refusal(group, contributors, jurisdiction))
        if memo[1]:
            raise ResidencyViolationError(memo[1])

    def _serve_refusal(self, group: str, contributors: Mapping[str, Iterable[str]], jurisdiction: str) -> str:
        """Why a site in ``jurisdiction`` may not receive the aggregate; "" if it may."""
        for shard_id, sites in contributors.items():
            for site_id in sites:
                shard_class, origin, decision = self._decision(shard_id, site_id)
                if not decision.serves(jurisdiction):
                    return (
                        f"residency: the {group} aggregate of shard {shard_id} ({shard_class}, origin {origin}) may "
                        f"not be served to jurisdiction {jurisdiction}"
                    )
        return ""
