"""Bringing a site's model up to its group's head: fetch, verify, decrypt, apply in place.

The coordinator sends a site only the rounds it has not applied (``missed``); the
site extends its own model-version chain with them. Each round's aggregates are
fetched from the zones that published them, checked against the roots the
coordinator announced, decrypted where they are HE sums, and applied by the
federation's server-side optimiser straight into the module's tensors. However many
rounds a site missed, its store is written once, after the last (the caller saves).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard import faults
from fedshard.aggregation import ServerOptimizer
from fedshard.errors import IntegrityError, RoundError
from fedshard.integrity import ciphertext_digest, merkle_root, next_version, shard_digest
from fedshard.protocol.channels import ZoneConnector
from fedshard.protocol.messages import AppliedRound, ApplyRule, PublishedAggregate
from fedshard.protocol.rounds import Aggregate, AggregateKey
from fedshard.site._retry import FETCH_RETRY

if TYPE_CHECKING:
    from fedshard.crypto.he import HeCodec, Pack
    from fedshard.sharding import ShardPlan

__all__ = [
    "OPTIMIZER_PREFIX",
    "ModelState",
    "RoundShards",
    "apply_rounds",
    "check_chain",
    "decrypt_aggregate",
    "fetch_view",
    "optimizer_for",
]

OPTIMIZER_PREFIX = "optimizer/"  # store ids of the server-optimiser state (m, v) beside the model's shards


@dataclass
class ModelState:
    """Where a site's model stands: its version chain and server-optimiser state."""

    version: str
    genesis: str
    applied_round: int
    rule: str = ""  # the server optimiser that produced these parameters
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)  # server optimiser state (m, v)

    @classmethod
    def from_store(cls, meta: Mapping[str, Any], extras: Mapping[str, np.ndarray]) -> ModelState:
        """The state a store's metadata and extra arrays describe."""
        n = len(OPTIMIZER_PREFIX)
        optimizer = {k[n:]: v for k, v in extras.items() if k.startswith(OPTIMIZER_PREFIX)}
        return cls(
            str(meta["version"]), str(meta["genesis"]), int(meta["applied_round"]), meta.get("rule", ""), optimizer
        )

    def meta(self, plan_json: str, site_id: str) -> dict[str, Any]:
        """The store metadata of this state."""
        return {
            "version": self.version,
            "genesis": self.genesis,
            "applied_round": self.applied_round,
            "plan": plan_json,
            "site_id": site_id,
            "rule": self.rule,
        }

    def extras(self) -> dict[str, np.ndarray]:
        """The arrays saved beside the model's shards."""
        return {OPTIMIZER_PREFIX + k: v for k, v in self.optimizer.items()}


def optimizer_for(rule: ApplyRule, state: ModelState, pending: bool, site_id: str) -> ServerOptimizer:
    """The federation's server optimiser; refuses a rule change while rounds remain to apply."""
    optimizer = ServerOptimizer(rule.kind, rule.learning_rate, rule.beta1, rule.beta2, rule.tau)
    if state.rule and state.rule != optimizer.describe() and pending:
        raise RoundError(
            f"site {site_id}: the server optimiser changed mid-federation ({state.rule} → "
            f"{optimizer.describe()}); sites would no longer hold the same model"
        )
    return optimizer


@dataclass
class RoundShards:
    """The shards a site applies from one round's aggregates, as the zones serve them:
    weighted means, and encrypted sums as HE ciphertext ``bytes`` (the shards each
    aggregate's summary flags ``encrypted``)."""

    means: dict[str, np.ndarray] = field(default_factory=dict)
    ciphertexts: dict[str, bytes] = field(default_factory=dict)

    def shard_ids(self) -> list[str]:
        """Every shard, means first."""
        return [*self.means, *self.ciphertexts]

    def digests(self) -> dict[str, str]:
        """Shard id → digest, as the zones listed them (ciphertexts: over their bytes)."""
        out = {sid: shard_digest(v) for sid, v in self.means.items()}
        out.update({sid: ciphertext_digest(c) for sid, c in self.ciphertexts.items()})
        return out


def fetch_view(
    site_id: str,
    applied: AppliedRound,
    view: Mapping[AggregateKey, list[str]],
    zones: Mapping[str, str],
    connect: ZoneConnector,
    deadline: float = math.inf,
) -> RoundShards:
    """Download the round's aggregates this site applies: its shards from each (a zone that
    does not answer is asked again until ``deadline``, a :func:`time.monotonic` time)."""
    out = RoundShards()
    for published in applied.aggregates:
        wanted = view.get(published.key)
        if not wanted:
            continue
        endpoint = zones.get(published.zone)
        if endpoint is None:
            raise RoundError(
                f"site {site_id}: zone {published.zone!r}, which published an aggregate of round {applied.round} it "
                "applies, is not in this site's config; its operator adds the zone to the site's copy of the config"
            )

        def attempt(n: int, zone: str = published.zone, group: str = published.group, at: str = endpoint) -> Aggregate:
            client = connect(zone, at)  # a fresh channel per attempt: no stale reconnect backoff
            try:
                return client.fetch(applied.round, group, site_id)
            finally:
                client.close()

        what = f"site {site_id}: fetch of aggregate {published.group} of round {applied.round}"
        aggregate = FETCH_RETRY.call(attempt, deadline=deadline, what=what)
        _check_relayed(site_id, applied.round, published, aggregate)
        if aggregate.summary.merkle_root != published.merkle_root:
            raise IntegrityError(
                f"site {site_id}: aggregate {published.group} of round {applied.round} from zone "
                f"{published.zone} has root {aggregate.summary.merkle_root[:12]}…, the coordinator announced "
                f"{published.merkle_root[:12]}…"
            )
        out.means.update({sid: aggregate.means[sid] for sid in wanted if sid in aggregate.means})
        out.ciphertexts.update({sid: aggregate.ciphertexts[sid] for sid in wanted if sid in aggregate.ciphertexts})
        del aggregate  # shards this site does not apply go now
    return out


def _check_relayed(site_id: str, rnd: int, published: PublishedAggregate, aggregate: Aggregate) -> None:
    """Refuse an aggregate whose signed statement, as the coordinator relayed it, is not the
    one its zone served (the zone's signature itself is checked by the site's zone client,
    under mutual TLS, as it fetches)."""
    if published.signed is None:
        return
    served = aggregate.summary.signature
    if served is None or published.signed.signature_bytes() != served:
        raise IntegrityError(
            f"site {site_id}: the coordinator relayed a statement of aggregate {published.group} of round {rnd} "
            f"that zone {published.zone} did not serve: refusing to apply it"
        )


def decrypt_aggregate(
    site_id: str,
    plan: ShardPlan,
    fetched: RoundShards,
    codec: Callable[[], HeCodec],
    encrypted: frozenset[str] | None,
    packs: Sequence[Pack] | None = None,
) -> dict[str, np.ndarray]:
    """Every shard of ``fetched`` as a weighted mean: the means as they are, the encrypted
    sums decrypted and divided (the ciphertexts are dropped from ``fetched`` as they go).

    ``encrypted`` (the shards the policy encrypts; None without residency routing)
    refuses a shard that arrives encrypted although the policy sends it in clear, or
    in clear although the policy encrypts it. ``packs`` says how the encrypted shards
    travel (see :func:`~fedshard.site._release.he_packs`); without it, one shard per pack.
    """
    if encrypted is not None:
        clear = next((sid for sid in fetched.means if sid in encrypted), None)
        if clear is not None:
            raise IntegrityError(f"site {site_id}: shard {clear} arrived in clear, the policy encrypts it")
    from fedshard.crypto.he import Pack as OnePack

    out = fetched.means
    by_carrier = {p.carrier: p for p in packs or ()}
    members = {sid for p in by_carrier.values() for sid, _ in p.members[1:]}
    for sid in list(fetched.ciphertexts):
        if encrypted is not None and sid not in encrypted:
            raise IntegrityError(f"site {site_id}: shard {sid} arrived encrypted, the policy sends it in clear")
        data = fetched.ciphertexts.pop(sid)
        if sid in members:
            if data:
                raise IntegrityError(f"site {site_id}: shard {sid} travels in its pack's carrier, yet has bytes")
            continue
        pack = by_carrier.get(sid) or OnePack(((sid, plan.shard(sid).size),))
        for member, mean in codec().decrypt_pack(data, pack).items():
            spec = plan.shard(member)
            out[member] = mean.reshape(spec.shape).astype(spec.dtype)
    return out


def apply_rounds(
    state: ModelState,
    pending: Sequence[AppliedRound],
    optimizer: ServerOptimizer,
    shards: MutableMapping[str, np.ndarray],
    fetch: Callable[[AppliedRound], RoundShards],
    decrypt: Callable[[RoundShards], dict[str, np.ndarray]],
    *,
    plan: ShardPlan,
    site_id: str,
    skip: frozenset[str] = frozenset(),
) -> int:
    """Apply each round of ``pending`` in order, in place on ``shards``; the rounds applied.

    ``fetch`` returns a round's aggregate shards as published (their roots are checked
    here), ``decrypt`` turns them into means (decrypting the encrypted sums). Everything of a round
    is checked before any of it is applied, so on an error ``shards`` and ``state``
    stand at the last round applied. ``skip``: shards whose memory a later shard shares
    (tied weights), applied through that one.
    """
    done = 0
    for applied in pending:
        faults.point("site.apply.fetch")
        fetched = fetch(applied)
        faults.point("site.apply.fetched")
        for shard_id in fetched.shard_ids():
            plan.shard(shard_id)  # refuses shards outside the plan
        root = merkle_root(fetched.digests())
        if root != applied.merkle_root:
            raise IntegrityError(
                f"site {site_id}: the aggregates of round {applied.round} give root {root[:12]}… for this "
                f"site's shards, the coordinator announced {applied.merkle_root[:12]}…"
            )
        means = decrypt(fetched)
        faults.point("site.apply.decrypted")
        optimizer.apply(shards, {k: v for k, v in means.items() if k not in skip}, state.optimizer)
        state.rule = optimizer.describe()
        state.version = next_version(state.version, applied.merkle_root)
        state.applied_round = applied.round
        done += 1
        faults.point("site.apply.applied")
    return done


def check_chain(site_id: str, state: ModelState, pending: Sequence[AppliedRound], head: str) -> None:
    """Refuse unless the site's version extended by the roots of ``pending`` is ``head``."""
    version = state.version
    for applied in pending:
        version = next_version(version, applied.merkle_root)
    if version == head:
        return
    if not pending:
        raise IntegrityError(
            f"site {site_id}: model version {state.version[:12]}… (round {state.applied_round}) differs from the "
            f"round's {head[:12]}…"
        )
    raise IntegrityError(
        f"site {site_id}: model version {state.version[:12]}… (round {state.applied_round}) with rounds "
        f"{pending[0].round}–{pending[-1].round} gives {version[:12]}…, not the round's {head[:12]}… "
        "(a round the site missed was not sent, or its model diverged)"
    )
