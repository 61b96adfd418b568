"""The zone aggregator: validates pushed shards and folds them into running means.

Transport-free: the gRPC service (:mod:`fedshard.zone.rpc.service`) and the
in-process client both drive it. A push in progress is a
:class:`~fedshard.zone.push.PushSession`; per-round state and counters live in
:mod:`fedshard.zone.state`. A push is a transaction: frames are checked one by
one as they arrive (known round and token, shard in the manifest and plan, dtype and
shape from the plan, digest from the manifest, finite values, no duplicate) and staged;
only when the whole push is complete and valid is it folded into the sums. A refused
push leaves nothing behind.

Staged pushes are bounded by a byte budget, so peak memory is the float64 sums plus
the budget, however many sites push at once.

With a :class:`~fedshard.zone.policy.ZonePolicy` the zone also enforces
residency: it re-decides every shard (refusing, with code ``residency``, what its
region may not hold), keeps one running mean per aggregate group (``global``,
``regional/EU``…), forwards the partial sums of ``global`` shards to the reducing zone
when it closes a round (or reduces them, if it is that zone), serves an aggregate
only to sites the policy allows, and writes every decision to its audit log.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.aggregation import ShardAccumulator
from fedshard.errors import (
    AggregateNotFoundError,
    FedshardError,
    IntegrityError,
    PushRejectedError,
    RefusalCode,
    ResidencyViolationError,
    ZoneError,
)
from fedshard.integrity import Manifest, ShardEntry, merkle_root, shard_digest
from fedshard.protocol.rounds import (
    DEFAULT_GROUP,
    GLOBAL_GROUP,
    AggregateSummary,
    PartialSum,
    PushReceipt,
    RoundSpec,
)
from fedshard.residency.audit import AuditLog, Decision
from fedshard.sharding import ShardPlan
from fedshard.store import LocalShardStore
from fedshard.zone.forward import ForwardSession, check_partial, partial_sums
from fedshard.zone.frames import array_chunks
from fedshard.zone.policy import ZonePolicy
from fedshard.zone.push import ByteBudget, PushSession, check_manifest
from fedshard.zone.state import OpenRound, ZoneStats

if TYPE_CHECKING:
    from fedshard.protocol.channels import ZoneClient

__all__ = ["ZoneAggregator"]


class ZoneAggregator:
    """One zone: accepts validated pushes, aggregates, publishes per-round aggregates.

    Parameters
    ----------
    name:
        Zone name, e.g. ``"eu-central"``.
    region:
        Region the zone is in, e.g. ``"EU"``.
    store_dir:
        Where published aggregates are kept; in memory only when None.
    staging_bytes:
        Budget for pushes being received and not yet committed.
    residency:
        The zone's residency policy and facts; None: no residency checks, every
        shard joins one aggregate (single-zone tests and tools).
    audit:
        Where decisions are recorded (append-only, hash-chained).
    connect:
        Makes a client to another zone from ``(name, endpoint)``, for forwarding
        partial sums to the reducing zone.
    he_context:
        The federation's *public* CKKS context, to sum encrypted shards (None: the
        zone refuses encrypted shards). A context holding the secret key is refused.
    """

    def __init__(
        self,
        name: str,
        region: str = "",
        store_dir: str | Path | None = None,
        staging_bytes: int = 256 << 20,
        *,
        residency: ZonePolicy | None = None,
        audit: AuditLog | None = None,
        connect: Callable[[str, str], ZoneClient] | None = None,
        he_context: Any = None,
    ) -> None:
        if he_context is not None and he_context.has_secret_key():
            raise ZoneError(f"zone {name}: refusing a CKKS context with the secret key; zones get the public context")
        self.he_context = he_context
        self.name = name
        self.region = region
        self.residency = residency
        self.audit = audit
        self._connect = connect
        self._store = LocalShardStore(store_dir) if store_dir is not None else None
        self._latest: dict[str, tuple[AggregateSummary, dict[str, np.ndarray], dict[str, list[str]]]] = {}
        self._latest_round = -1
        self._rounds: dict[int, OpenRound] = {}
        self._summaries: dict[tuple[int, str], AggregateSummary] = {}
        self._closed: set[int] = set()
        self._lock = threading.Lock()
        self._budget = ByteBudget(staging_bytes)
        self.staging_limit = staging_bytes
        self.stats = ZoneStats()

    def _record(self, decision: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.append(decision, zone=self.name, region=self.region, **fields)

    # round lifecycle --------------------------------------------------------------------
    def open_round(self, spec: RoundSpec) -> None:
        """Start accepting pushes for ``spec.round``."""
        plan = ShardPlan.from_json(spec.plan_json)
        if self.residency is not None:
            unknown = [sid for sid in plan.shard_ids if sid not in self.residency.classes]
            if unknown:
                raise ZoneError(
                    f"zone {self.name}: the round's shard plan has shard {unknown[0]} that this zone's "
                    "classification does not know (zone and sites run different models or configs)",
                    RefusalCode.INVALID,
                )
        with self._lock:
            if spec.round in self._rounds or spec.round in self._closed:
                raise ZoneError(f"zone {self.name}: round {spec.round} was already opened", RefusalCode.LIFECYCLE)
            self._rounds[spec.round] = OpenRound(spec, plan)

    def begin_push(
        self, manifest: Manifest, token: str, timeout: float | None = None, *, certified: str | None = None
    ) -> PushSession:
        """Check a push's manifest and start receiving its shards.

        ``certified`` is the caller's jurisdiction from its mTLS certificate; the
        residency checks use it rather than anything the request says.
        """
        groups: dict[str, str] = {}
        with self._lock:
            state = self._rounds.get(manifest.round)
            try:
                if state is None:
                    closed = manifest.round in self._closed
                    reason = "round is closed" if closed else "round is not open at this zone"
                    raise PushRejectedError(reason, RefusalCode.ROUND)
                check_manifest(state, manifest, token, zone=self.name, he_context=self.he_context)
                if self.residency is not None:
                    self.residency.origin(manifest.site_id, certified)
                    groups = self.residency.check_manifest(manifest)
            except PushRejectedError as exc:
                raise self.refused_push(manifest, exc.code, str(exc)) from None
            state.pushing.add(manifest.site_id)
        need = manifest.total_bytes
        if not self._budget.acquire(need, timeout):
            with self._lock:
                state.pushing.discard(manifest.site_id)
            raise ZoneError(f"zone {self.name}: busy, could not stage {need} bytes in time; retry", RefusalCode.BUSY)
        return PushSession(self, state, manifest, need, groups)

    def refused_push(self, manifest: Manifest, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``manifest``'s push; the error to raise (see :class:`PushSession`)."""
        self.stats.refuse(reason)
        self._record(Decision.REFUSED, site=manifest.site_id, round=manifest.round, code=code, reason=reason)
        return PushRejectedError(
            f"zone {self.name} refused {manifest.site_id}'s push for round {manifest.round}: {reason}", code
        )

    def fold_push(
        self,
        state: OpenRound,
        manifest: Manifest,
        staged: dict[str, np.ndarray],
        groups: dict[str, str],
        ciphertexts: dict[str, list[Any]],
    ) -> PushReceipt:
        """Fold a complete, valid push into the round's sums (called by its :class:`PushSession`)."""
        with self._lock:
            if self._rounds.get(manifest.round) is not state:
                raise self.refused_push(manifest, RefusalCode.ROUND, "the round closed during the push")
            for shard_id, values in staged.items():
                group = groups.get(shard_id, DEFAULT_GROUP)
                site = (manifest.site_id,)
                if shard_id in ciphertexts:  # the weight is inside the ciphertext (see fedshard.crypto.he)
                    state.fold_encrypted(group, shard_id, site, self.he_context).add(shard_id, ciphertexts[shard_id])
                else:
                    state.fold(group, shard_id, site).add(shard_id, values, manifest.weight)
            state.pushing.discard(manifest.site_id)
            state.counted.append(manifest.site_id)
            nbytes = manifest.total_bytes
            self.stats.pushes += 1
            self.stats.bytes_received += nbytes
            origin = self.residency.jurisdictions.get(manifest.site_id) if self.residency is not None else None
            suffix = f" from {origin}" if origin else ""
            self.stats.shards_by_class.update(f"{e.shard_class or 'unclassified'}{suffix}" for e in manifest.shards)
        self._record(
            Decision.ACCEPTED,
            site=manifest.site_id,
            round=manifest.round,
            shards=len(staged),
            bytes=nbytes,
            classes=dict(collections.Counter(e.shard_class or "unclassified" for e in manifest.shards)),
            groups=dict(collections.Counter(groups.values())) if groups else {DEFAULT_GROUP: len(staged)},
            manifest_root=manifest.merkle_root,
            signature=manifest.signature or "",
        )
        return PushReceipt(self.name, manifest.round, manifest.site_id, len(staged), nbytes)

    def end_push(self, state: OpenRound, site_id: str, budget_bytes: int, *, counted: bool) -> None:
        """A push is over (see :class:`PushSession`): forget it unless counted; return its staging bytes."""
        if not counted:
            with self._lock:
                state.pushing.discard(site_id)
        if budget_bytes:
            self._budget.release(budget_bytes)

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, np.ndarray]) -> PushReceipt:
        """Push a whole update at once (in-process use; the gRPC service streams instead)."""
        with self.begin_push(manifest, token) as session:
            for shard_id, values in shards.items():
                for chunk in array_chunks(shard_id, values):
                    session.take(chunk)
            return session.commit()

    # hierarchical reduction (see fedshard.zone.forward) ---------------------------------------
    def begin_forward(
        self, partial: PartialSum, timeout: float | None = None, *, certified: str | None = None
    ) -> ForwardSession:
        """Check another zone's partial-sum header and start receiving its sums.

        ``certified`` is the sending zone's name from its mTLS certificate.
        """
        with self._lock:
            state = self._rounds.get(partial.round)
            try:
                if certified is not None and certified != partial.zone:
                    raise PushRejectedError(f"the caller's certificate names zone {certified!r}", RefusalCode.IDENTITY)
                if state is None:
                    raise PushRejectedError(f"round {partial.round} is not open at this zone", RefusalCode.ROUND)
                check_partial(state, partial, residency=self.residency, he_context=self.he_context)
            except PushRejectedError as exc:
                raise self.refused_partial(partial, exc.code, str(exc)) from None
            state.forwarding.add(partial.zone)
        need = sum(e.nbytes for e in partial.entries)
        if not self._budget.acquire(need, timeout):
            self.end_forward(state, partial.zone, 0)
            raise ZoneError(f"zone {self.name}: busy, could not stage {need} bytes in time; retry", RefusalCode.BUSY)
        return ForwardSession(self, state, partial, need)

    def refused_partial(self, partial: PartialSum, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``partial``; the error to raise (see :class:`ForwardSession`)."""
        self.stats.refuse(reason)
        self._record(Decision.REFUSED, source_zone=partial.zone, round=partial.round, code=code, reason=reason)
        return PushRejectedError(
            f"zone {self.name} refused zone {partial.zone}'s partial sums for round {partial.round}: {reason}", code
        )

    def fold_partial(
        self, state: OpenRound, partial: PartialSum, sums: dict[str, np.ndarray], ciphertexts: dict[str, list[Any]]
    ) -> int:
        """Fold a complete, valid forward into the round (called by its :class:`ForwardSession`)."""
        with self._lock:
            if self._rounds.get(partial.round) is not state:
                raise self.refused_partial(partial, RefusalCode.ROUND, "the round closed during the forward")
            for entry in partial.entries:
                sid = entry.shard_id
                if entry.encrypted:
                    state.fold_encrypted(GLOBAL_GROUP, sid, entry.contributors, self.he_context).add(
                        sid, ciphertexts[sid]
                    )
                else:
                    acc = state.fold(GLOBAL_GROUP, sid, entry.contributors)
                    acc.add_sum(sid, sums[sid], entry.weight, state.plan.shard(sid).dtype)
            state.forwarded_from.add(partial.zone)
            self.stats.partials_received += len(partial.entries)
        self._record(
            Decision.ACCEPTED,
            source_zone=partial.zone,
            round=partial.round,
            partial_shards=len(partial.entries),
            contributors=sorted({c for e in partial.entries for c in e.contributors}),
        )
        return len(partial.entries)

    def end_forward(self, state: OpenRound, zone: str, budget_bytes: int) -> None:
        """A forward is over (see :class:`ForwardSession`): forget it as in progress; return its staging bytes."""
        with self._lock:
            state.forwarding.discard(zone)
        if budget_bytes:
            self._budget.release(budget_bytes)

    def receive_partial(
        self, partial: PartialSum, sums: Mapping[str, np.ndarray], *, certified: str | None = None
    ) -> int:
        """Fold another zone's partial sums of ``global`` shards into this round at once
        (in-process use; the gRPC service streams instead). Returns the number of shards
        folded in; raises :class:`PushRejectedError` and folds nothing if any is refused."""
        with self.begin_forward(partial, certified=certified) as session:
            for shard_id, values in sums.items():
                for chunk in array_chunks(shard_id, values):
                    session.take(chunk)
            return session.commit()

    def _forward(self, state: OpenRound, forward_to: tuple[str, str] | None) -> None:
        partial, sums = partial_sums(state, self.name)
        if not partial.entries:
            return
        if forward_to is None or self._connect is None:
            raise ZoneError(
                f"zone {self.name}: round {state.spec.round} has global shards but no reducing zone to forward them to",
                RefusalCode.LIFECYCLE,
            )
        client = self._connect(*forward_to)
        try:
            client.forward(partial, sums)
        finally:
            client.close()
        nbytes = sum(e.nbytes for e in partial.entries)
        self.stats.forwarded_shards += len(partial.entries)
        self.stats.forwarded_bytes += nbytes
        self._record(
            Decision.FORWARDED,
            round=state.spec.round,
            to_zone=forward_to[0],
            shards=len(partial.entries),
            bytes=nbytes,
            contributors=sorted({c for e in partial.entries for c in e.contributors}),
        )

    def close_round(self, round: int, forward_to: tuple[str, str] | None = None) -> list[AggregateSummary]:
        """Stop accepting pushes for ``round`` and publish its aggregates, one per group.

        The partial sums of ``global`` shards go to ``forward_to`` (the reducing
        zone's ``(name, endpoint)``) unless this zone is the reducing zone; close the
        other zones first, so that their partial sums have arrived.
        """
        with self._lock:
            state = self._rounds.pop(round, None)
            if state is None:
                if round in self._closed:
                    return [s for (r, _), s in sorted(self._summaries.items()) if r == round]
                raise ZoneError(f"zone {self.name}: round {round} is not open", RefusalCode.LIFECYCLE)
            self._closed.add(round)
        reducer = self.residency is not None and self.residency.is_reducer
        if not reducer:
            try:
                self._forward(state, forward_to)
            except FedshardError:
                self._closed.discard(round)
                raise
        summaries = []
        for group in state.group_names():
            if group == GLOBAL_GROUP and not reducer:
                continue
            acc = state.groups.get(group, ShardAccumulator())
            means = acc.finalize()
            enc = state.encrypted.get(group)
            needed = self.residency.min_contributors if self.residency is not None else 1
            short = [sid for sid in (enc.shard_ids() if enc else []) if len(state.contributors[group][sid]) < needed]
            if short:
                self._record(Decision.REFUSED, round=round, group=group, reason="too few contributions to publish")
                raise ZoneError(
                    f"zone {self.name}: round {round}: encrypted shard {short[0]} of group {group} holds fewer than "
                    f"{needed} sites' noise shares (privacy.update_level.distributed_over); not publishing it",
                    RefusalCode.PRIVACY,
                )
            if enc is not None:  # encrypted sums are published as they are: sites divide after decrypting
                means.update({sid: _as_bytes_array(enc.serialize(sid)) for sid in enc.shard_ids()})
            contributors = {sid: sorted(sites) for sid, sites in state.contributors.get(group, {}).items()}
            entries = tuple(ShardEntry(sid, shard_digest(arr), int(arr.nbytes)) for sid, arr in means.items())
            summary = AggregateSummary(
                zone=self.name,
                round=round,
                merkle_root=merkle_root({e.shard_id: e.digest for e in entries}),
                total_weight=max((acc.weight(sid) for sid in means if sid in acc), default=0.0),
                sites=tuple(sorted({s for sites in contributors.values() for s in sites})),
                shards=entries,
                group=group,
            )
            self._publish(summary, means, contributors)
            summaries.append(summary)
        with self._lock:
            for summary in summaries:
                self._summaries[(round, summary.group)] = summary
        return summaries

    def abort_round(self, round: int) -> None:
        """Discard ``round`` without publishing anything."""
        with self._lock:
            self._rounds.pop(round, None)

    # publication ----------------------------------------------------------------------------
    def _publish(
        self, summary: AggregateSummary, means: dict[str, np.ndarray], contributors: dict[str, list[str]]
    ) -> None:
        if self._store is not None:
            meta = {
                "zone": summary.zone,
                "round": summary.round,
                "group": summary.group,
                "merkle_root": summary.merkle_root,
                "total_weight": summary.total_weight,
                "sites": list(summary.sites),
                "contributors": contributors,
            }
            self._store.save(_aggregate_key(summary.round, summary.group), means, meta)
        if summary.round != self._latest_round:
            self._latest, self._latest_round = {}, summary.round
        self._latest[summary.group] = (summary, means, contributors)
        self._record(
            Decision.PUBLISHED,
            round=summary.round,
            group=summary.group,
            shards=len(summary.shards),
            sites=list(summary.sites),
            merkle_root=summary.merkle_root,
        )

    def aggregate(
        self, round: int, group: str = DEFAULT_GROUP, *, jurisdiction: str | None = None
    ) -> tuple[AggregateSummary, dict[str, np.ndarray]]:
        """The published aggregate ``group`` of ``round``: its summary and shards.

        With residency on, ``jurisdiction`` (the requesting site's, from its
        certificate or the config) must be one the policy lets receive every shard of
        it. The latest round is served from memory; older ones (and any after a
        restart) are read from the store and checked against their Merkle root.
        """
        summary, shards, contributors = self._load_aggregate(round, group)
        if self.residency is not None:
            try:
                if jurisdiction is None:
                    raise ResidencyViolationError(
                        f"residency: the zone serves the {group} aggregate only to a site it can identify"
                    )
                self.residency.check_serve(group, contributors, jurisdiction)
            except ResidencyViolationError as exc:
                self.stats.refuse(str(exc))
                self._record(Decision.REFUSED, round=round, group=group, to=jurisdiction or "?", reason=str(exc))
                raise ResidencyViolationError(f"zone {self.name}: {exc}", code=RefusalCode.NOT_SERVED) from None
        return summary, shards

    def _load_aggregate(
        self, round: int, group: str
    ) -> tuple[AggregateSummary, dict[str, np.ndarray], dict[str, list[str]]]:
        if round == self._latest_round and group in self._latest:
            return self._latest[group]
        key = _aggregate_key(round, group)
        if self._store is None or not self._store.exists(key):
            known = (round, group) in self._summaries
            raise AggregateNotFoundError(
                f"zone {self.name}: no {group} aggregate for round {round} "
                + ("(this zone keeps only the latest without a store)" if known else "(not closed yet, or unknown)")
            )
        meta, shards = self._store.load(key)
        entries = tuple(ShardEntry(sid, shard_digest(arr), int(arr.nbytes)) for sid, arr in shards.items())
        if merkle_root({e.shard_id: e.digest for e in entries}) != meta["merkle_root"]:
            raise IntegrityError(
                f"zone {self.name}: stored aggregate {group} of round {round} fails its Merkle root",
                code=RefusalCode.CORRUPT,
            )
        summary = AggregateSummary(
            self.name, round, meta["merkle_root"], float(meta["total_weight"]), tuple(meta["sites"]), entries, group
        )
        with self._lock:
            self._summaries.setdefault((round, group), summary)
        return summary, shards, {sid: list(v) for sid, v in meta.get("contributors", {}).items()}

    def close(self) -> None:
        """Close the audit log (the zone accepts nothing more)."""
        if self.audit is not None:
            self.audit.close()

    def info(self) -> dict[str, Any]:
        """Name, region, residency role, counters and audit head (for summaries and ``Info``)."""
        return {
            "name": self.name,
            "region": self.region,
            "reducing": bool(self.residency is not None and self.residency.is_reducer),
            "policy_digest": self.residency.policy.digest if self.residency is not None else "",
            "audit_head": self.audit.head if self.audit is not None else "",
            "audit_records": self.audit.lines if self.audit is not None else 0,
            **self.stats.as_dict(),
        }


def _as_bytes_array(data: bytes) -> np.ndarray:
    """Ciphertext bytes as the (1, n) uint8 array they travel and are stored as."""
    return np.frombuffer(data, dtype=np.uint8).reshape(1, -1)


def _aggregate_key(round: int, group: str) -> str:
    return f"aggregate-{round:06d}-{group.replace('/', '-').replace('+', '_')}"
