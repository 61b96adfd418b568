"""The zone aggregator: the :class:`ZoneAggregator` role, which ties a zone's parts together.

Transport-free: the gRPC service (:mod:`fedshard.zone.rpc.service`) and the
in-process client both drive it. A push is a transaction (:mod:`fedshard.zone._push`):
the manifest is checked before any frame, every frame goes through the one frame
assembler (:mod:`fedshard.zone.frames`) and each shard is checked as it completes
(dtype and shape from the plan, digest from the manifest, finite values, ciphertext
of the federation's context), and only a complete, valid push is folded into the
sums. A refused push leaves nothing behind, and every refusal carries a
:class:`~fedshard.errors.RefusalCode` and is counted and audited. Partial sums
forwarded by other zones arrive the same way (:mod:`fedshard.zone._forward`); closing a
round publishes one aggregate per group (:mod:`fedshard.zone._publish`). Per-round state
and counters live in :mod:`fedshard.zone._state`.

What is folded is bounded by the federation (``bounds``, ``aggregation`` in the config):
each site's weight is the one the coordinator fixed when it opened the round, each
plaintext value lies within ``±max_value`` and each site's update at this zone within an
L2 norm (``max_update_norm``, and by default 10× the median of the zone's earlier rounds:
:mod:`fedshard.zone._norms`); so every sum (float32, of ``(w/unit)·x``: see
:mod:`fedshard.aggregation._accumulator` for its error bound) stays finite (see
:class:`~fedshard.config.AggregationConfig`). Encrypted shards cannot be checked.

Staged pushes are bounded by a byte budget, so peak memory is the sums (one float32
model per aggregate group) plus the budget, however many sites push at once; their
clear shards are staged in buffers the zone reuses from push to push
(:mod:`fedshard.zone._staging`), at most the budget's worth.

With a :class:`~fedshard.zone.policy.ZonePolicy` the zone also enforces
residency: it re-decides every shard (refusing, with code ``residency``, what its
region may not hold), keeps one running mean per aggregate group (``global``,
``regional/EU``…), forwards the partial sums of ``global`` shards to the reducing zone
when it closes a round (or reduces them, if it is that zone), serves an aggregate
only to sites the policy allows, and writes every decision to its audit log.

The zone takes its peers from its own config: it forwards only to the reducing zone its
policy names, at the endpoint ``peers`` gives (its config's, or in simulation its serving
host's), and refuses a close that names any other target. With a ``signer`` (its TLS
key) every aggregate it publishes carries its signature (:func:`~fedshard.zone._publish.signed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedshard import faults
from fedshard.audit import AuditLog, Decision
from fedshard.config import AggregationConfig
from fedshard.crypto.ciphertexts import context_scheme
from fedshard.errors import (
    FedshardError,
    RefusalCode,
    ResidencyViolationError,
    ZoneError,
)
from fedshard.integrity import Manifest
from fedshard.protocol.codes import refusal_code
from fedshard.protocol.rounds import (
    DEFAULT_GROUP,
    GLOBAL_GROUP,
    Aggregate,
    AggregateSummary,
    PartialSum,
    PushReceipt,
    RoundSpec,
    ShardPayload,
)
from fedshard.sharding import ShardPlan
from fedshard.zone._calls import Call
from fedshard.zone._forward import ForwardSession
from fedshard.zone._intake import PushIntake, lost_reason
from fedshard.zone._journal import JOURNAL_DIR, RoundJournal, RoundState
from fedshard.zone._norms import NormReference
from fedshard.zone._publish import AggregateStore, Publications, build_aggregate, missing_noise_shares, signed
from fedshard.zone._push import PushSession, check_round_weights
from fedshard.zone._reduce import Reduction
from fedshard.zone._rounds import ZoneRounds
from fedshard.zone._staging import ByteBudget, StagingPool
from fedshard.zone._state import OpenRound, settle_audited
from fedshard.zone._stats import ZoneStats
from fedshard.zone.frames import shard_chunks
from fedshard.zone.policy import ZonePolicy
from fedshard.zone.recovery import ZoneRecovery, recover_rounds

if TYPE_CHECKING:
    from fedshard.integrity.aggregate_signature import AggregateSigner
    from fedshard.protocol.channels import ZoneClient

__all__ = ["ZoneAggregator"]


STATS_FILE = "stats.json"
"""The zone's counters for its run, in its store (:meth:`~fedshard.zone._stats.ZoneStats.save`)."""


class ZoneAggregator:
    """One zone: accepts validated pushes, aggregates, publishes per-round aggregates.

    Parameters
    ----------
    name:
        Zone name, e.g. ``"eu-central"``.
    region:
        Region the zone is in, e.g. ``"EU"``.
    store_dir:
        Where published aggregates and round records are kept; in memory only when None.
        A zone started on the store of one that stopped comes back with what it had
        published, and refuses the rounds that were open (see :mod:`fedshard.zone.recovery`).
    staging_bytes:
        Budget for pushes being received and not yet committed.
    residency:
        The zone's residency policy and facts; None: no residency checks, every
        shard joins one aggregate (single-zone tests and tools).
    audit:
        Where decisions are recorded (append-only, hash-chained).
    connect:
        Makes a client to another zone from ``(name, endpoint)``, for forwarding
        partial sums to the reducing zone (under mutual TLS: one that checks the peer
        is that zone, see :func:`fedshard.assembly.tls_connector`).
    peers:
        Zone name → endpoint, from the zone's own config (in simulation: its serving
        host's, who knows the ports; read when a round closes). Partial sums go to the
        reducing zone at this endpoint, and nowhere else.
    signer:
        Signs every published aggregate with the zone's TLS key (None: unsigned, as
        without mutual TLS).
    he_context:
        The federation's *public* HE context, to sum encrypted shards (None: the
        zone refuses encrypted shards). A context holding the secret key is refused.
    bounds:
        The federation's bounds on weights, values and update norms (``aggregation``
        in its config; None: the defaults).
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
        bounds: AggregationConfig | None = None,
        peers: Mapping[str, str] | None = None,
        signer: AggregateSigner | None = None,
    ) -> None:
        if he_context is not None and he_context.has_secret_key():
            raise ZoneError(f"zone {name}: refusing an HE context with the secret key; zones get the public context")
        self.he_context = he_context
        self.bounds = bounds if bounds is not None else AggregationConfig()
        self.name = name
        self.region = region
        self.audit = audit
        self._connect = connect
        self._peers: Mapping[str, str] = peers if peers is not None else {}
        self._signer = signer
        self._published = Publications(name, store_dir)
        self._norms = NormReference(self.bounds)
        self.stats = ZoneStats()
        self._stats_file = Path(store_dir) / STATS_FILE if store_dir is not None else None
        if self._stats_file is not None:
            self.stats.load(self._stats_file)  # the run's counters so far, across restarts
        self._z = ZoneRounds(
            name,
            ByteBudget(staging_bytes),
            StagingPool(staging_bytes),
            self.stats,
            self._record,
            self.bounds,
            residency,
            he_context,
            None if he_context is None else context_scheme(he_context),
        )
        """The round state the lifecycle below, the intake and the reduction share."""
        self._journal = RoundJournal(Path(store_dir) / JOURNAL_DIR) if store_dir is not None else None
        if store_dir is not None and self._journal is not None:
            self._z.recovery = recover_rounds(name, store_dir, self._journal, AggregateStore(store_dir))
            self._z.closed |= self._z.recovery.closed
            self._published.restore(self._z.recovery.summaries)
            if self._z.recovery.notes:
                recovered = self._z.recovery
                self._record("recovered", lost_rounds=sorted(recovered.lost), notes=recovered.notes)
        self._reduction = Reduction(self._z, connect)
        self._intake = PushIntake(self._z, self._norms)

    @property
    def round_state(self) -> ZoneRounds:
        """The zone's round state (open rounds, staging, counters…), read by tools and tests."""
        return self._z

    @property
    def residency(self) -> ZonePolicy | None:
        """The zone's residency policy and facts (None: no residency checks)."""
        return self._z.residency

    @property
    def recovery(self) -> ZoneRecovery:
        """What the zone found in its store when it started (rounds lost, files discarded)."""
        return self._z.recovery

    def _record(self, decision: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.append(decision, zone=self.name, region=self.region, **fields)
            faults.point("zone.audit.appended")

    # round lifecycle --------------------------------------------------------------------
    def open_round(self, spec: RoundSpec, *, by: str = "-") -> None:
        """Start accepting pushes for ``spec.round``; ``by`` names the caller in the audit log."""
        try:
            plan = ShardPlan.from_json(spec.plan_json)
            if self.residency is not None:
                unknown = [sid for sid in plan.shard_ids if sid not in self.residency.classes]
                if unknown:
                    raise ZoneError(
                        f"zone {self.name}: the round's shard plan has shard {unknown[0]} that this zone's "
                        "classification does not know (zone and sites run different models or configs)",
                        RefusalCode.INVALID,
                    )
            check_round_weights(spec, self.bounds.max_site_weight, zone=self.name)
            with self._z.lock:
                if spec.round in self._z.closed:
                    raise ZoneError(
                        f"zone {self.name}: round {spec.round} was already published here (its store keeps it); "
                        "resume the federation after its last round, or give the zone a fresh store",
                        RefusalCode.LIFECYCLE,
                    )
                if spec.round in self._z.open or spec.round in self.recovery.lost:
                    raise ZoneError(f"zone {self.name}: round {spec.round} was already opened", RefusalCode.LIFECYCLE)
                if self._journal is not None:  # on disk before anything is accepted: a restart knows it was open
                    self._journal.write(spec.round, RoundState.OPEN)
                self._z.open[spec.round] = OpenRound(spec, plan, norm_reference=self._norms.snapshot())
                self.stats.round = max(self.stats.round, spec.round)
        except FedshardError as exc:
            self.refused_call(Call.OPEN, by, refusal_code(exc), str(exc), round=spec.round)
            raise
        self._record(Call.OPEN, by=by, round=spec.round, sites=len(spec.sites))

    def refused_call(self, call: str, caller: str, code: RefusalCode, reason: str, **fields: Any) -> None:
        """Count and audit a refused call (one the zone refused before or outside a push)."""
        self.stats.refuse(reason, code)
        self._record(Decision.REFUSED, call=call, by=caller, code=code, reason=reason, **fields)

    def begin_push(
        self, manifest: Manifest, token: str, timeout: float | None = None, *, certified: str | None = None
    ) -> PushSession:
        """Check a push's manifest and start receiving its shards (:meth:`PushIntake.begin`).

        ``certified`` is the caller's jurisdiction from its mTLS certificate; the
        residency checks use it rather than anything the request says.
        """
        return self._intake.begin(manifest, token, timeout, certified=certified)

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        """Push a whole update at once (in-process use; the gRPC service streams instead).

        Shards the manifest lists ``encrypted`` are ciphertext ``bytes``.
        """
        encrypted = {e.shard_id for e in manifest.shards if e.encrypted}
        with self.begin_push(manifest, token) as session:
            for shard_id, values in shards.items():
                for chunk in shard_chunks(shard_id, values, encrypted=shard_id in encrypted):
                    session.take(chunk)
            return session.commit()

    # hierarchical reduction (see fedshard.zone._reduce) ----------------------------------------
    def begin_forward(
        self, partial: PartialSum, timeout: float | None = None, *, certified: str | None = None
    ) -> ForwardSession:
        """Check another zone's partial-sum header and start receiving its sums.

        ``certified`` is the sending zone's name from its mTLS certificate.
        """
        return self._reduction.begin(partial, timeout, certified=certified)

    def receive_partial(
        self, partial: PartialSum, sums: Mapping[str, ShardPayload], *, certified: str | None = None
    ) -> int:
        """Fold another zone's partial sums of ``global`` shards into this round at once
        (in-process use; the gRPC service streams instead). Returns the number of shards
        folded in; raises :class:`PushRejectedError` and folds nothing if any is refused."""
        return self._reduction.receive(partial, sums, certified=certified)

    def close_round(
        self, round: int, forward_to: tuple[str, str] | None = None, *, by: str = "-"
    ) -> list[AggregateSummary]:
        """Stop accepting pushes for ``round`` and publish its aggregates, one per group.

        The partial sums of ``global`` shards go to the reducing zone of this zone's own
        config, at the endpoint of its ``peers``, unless this zone is the reducing zone;
        close the other zones first, so that their partial sums have arrived. If
        forwarding fails the round stays open, so closing it can be retried.

        ``forward_to`` is where the caller (the coordinator) believes they go: None says
        nothing; any other target than the zone's own is refused (code ``authority``,
        audited) and nothing is forwarded.
        """
        try:
            return self._close(round, forward_to, by)
        except FedshardError as exc:
            self.refused_call(Call.CLOSE, by, refusal_code(exc), str(exc), round=round)
            raise

    def _close(self, round: int, forward_to: tuple[str, str] | None, by: str) -> list[AggregateSummary]:
        started = time.perf_counter()
        reducer = self.residency is not None and self.residency.is_reducer
        target = None if reducer else self._forward_target()
        if forward_to is not None and tuple(forward_to) != target:
            own = f"{target[0]} at {target[1]}" if target is not None else "nowhere"
            raise ZoneError(
                f"zone {self.name}: round {round}: partial sums go to the reducing zone of this zone's own config "
                f"({own}), not {forward_to[0]} at {forward_to[1]}; nothing was forwarded",
                RefusalCode.AUTHORITY,
            )
        with self._z.lock:
            if round in self.recovery.lost:
                raise ZoneError(f"zone {self.name}: {lost_reason(self.name, round)}", RefusalCode.ROUND)
            state = self._z.open.pop(round, None)
            if state is None:
                if round in self._z.closed:
                    return self._published.summaries(round)
                raise ZoneError(f"zone {self.name}: round {round} is not open", RefusalCode.LIFECYCLE)
            self._z.closed.add(round)
            outliers = self._norms.closed(round, state.norms, state.norm_reference)  # what bounds the next rounds
            if outliers:  # folded unbounded (no reference yet): publish nothing; the coordinator aborts it
                self._z.closed.discard(round)
                self._z.open[round] = state
                raise ZoneError(
                    f"zone {self.name}: round {round} had no norm reference yet and "
                    f"{'; '.join(o.describe() for o in outliers)}; not publishing it (the next rounds clip "
                    "such updates)",
                    RefusalCode.BOUND,
                )
        faults.point("zone.close.start")
        if self.audit is not None:  # pushes audited under a caller's barrier: durable before any sum leaves
            self.audit.sync()
        if not reducer:
            try:
                self._reduction.send(state, target)
            except FedshardError:
                with self._z.lock:  # the round is not lost: closing it again retries the forward
                    self._z.closed.discard(round)
                    self._z.open[round] = state
                raise
        self._record(Call.CLOSE, by=by, round=round, sites=len(state.counted))
        published = [g for g in state.group_names() if g != GLOBAL_GROUP or reducer]
        for group in published:  # every group checked before any is published
            self._check_noise_shares(state, group)
        self._published.spill()  # the sites fetched the round before during this one: its memory goes now
        summaries = []
        for group in published:
            aggregate, contributors = build_aggregate(self.name, state, group)
            if self._signer is not None:
                aggregate = signed(aggregate, self._signer, self.region, state)
            self._published.publish(aggregate, contributors)
            faults.point("zone.publish.written")
            summary = aggregate.summary
            self._record(
                Decision.PUBLISHED,
                round=round,
                group=group,
                shards=len(summary.shards),
                sites=list(summary.sites),
                merkle_root=summary.merkle_root,
            )
            summaries.append(summary)
        if self._journal is not None:  # every aggregate stored: only now is the round published
            self._published.sync()
            self._journal.write(round, RoundState.PUBLISHED, tuple(s.group for s in summaries))
        self.stats.closed(time.perf_counter() - started)
        if self._stats_file is not None:
            self.stats.save(self._stats_file)
        return summaries

    def _forward_target(self) -> tuple[str, str] | None:
        """The reducing zone of this zone's own config and its endpoint (None: no reducing
        zone, or no endpoint for it)."""
        reducing = self.residency.router.reducing_zone if self.residency is not None else None
        endpoint = self._peers.get(reducing) if reducing is not None else None
        return (reducing, endpoint) if reducing is not None and endpoint else None

    def _check_noise_shares(self, state: OpenRound, group: str) -> None:
        """Settle ``group``'s encrypted sums (the lane of the noise terms most of its sites named;
        the others' sites left out and audited), then refuse to publish an encrypted shard that
        holds fewer sites' noise shares than accounted, or a group whose lanes tie."""
        settle_audited(state, group, self._record, self.name, "publishing")
        needed = self.residency.min_contributors if self.residency is not None else 1
        short = missing_noise_shares(state, group, needed)
        if short is not None:
            round = state.spec.round
            self._record(Decision.REFUSED, round=round, group=group, reason="too few contributions to publish")
            raise ZoneError(
                f"zone {self.name}: round {round}: encrypted shard {short} of group {group} holds fewer than "
                f"{needed} sites' noise shares (privacy.*.distributed_over); not publishing it",
                RefusalCode.PRIVACY,
            )

    def abort_round(self, round: int, *, by: str = "-") -> None:
        """Discard ``round`` without publishing anything."""
        with self._z.lock:
            state = self._z.open.pop(round, None)
            lost = round in self.recovery.lost
            if (state is not None or lost) and self._journal is not None:
                self._journal.write(round, RoundState.ABORTED)  # a lost round aborted may open again, afresh
            self.recovery.lost.discard(round)
        self._record(Call.ABORT, by=by, round=round, was_open=state is not None, was_lost=lost)

    # serving aggregates (kept by fedshard.zone._publish) ---------------------------------------
    def fetch(
        self, round: int, group: str = DEFAULT_GROUP, *, jurisdiction: str | None = None, by: str = "-"
    ) -> Aggregate:
        """The published aggregate ``group`` of ``round``: summary, means and encrypted sums.

        With residency on, ``jurisdiction`` (the requesting site's, from its
        certificate or the config) must be one the policy lets receive every shard of
        it. The latest round is served from memory (a large model's only until the next round closes); the
        others (and any after a restart) are read from the store and checked against
        their Merkle root.

        Raises
        ------
        AggregateNotFoundError
            No such aggregate (not closed yet, unknown, or not kept without a store).
        ResidencyViolationError
            With code :attr:`~RefusalCode.NOT_SERVED`: the policy does not let ``jurisdiction`` receive it.
        """
        try:
            aggregate, contributors = self._published.load(round, group)
        except FedshardError as exc:
            self.refused_call(Call.FETCH, by, refusal_code(exc), str(exc), round=round, group=group)
            raise
        if self.residency is not None:
            try:
                if jurisdiction is None:
                    raise ResidencyViolationError(
                        f"residency: the zone serves the {group} aggregate only to a site it can identify"
                    )
                self.residency.check_serve(group, contributors, jurisdiction)
            except ResidencyViolationError as exc:
                code = RefusalCode.NOT_SERVED
                self.refused_call(Call.FETCH, by, code, str(exc), round=round, group=group, to=jurisdiction or "?")
                raise ResidencyViolationError(f"zone {self.name}: {exc}", code=code) from None
        self.stats.served += 1
        self._record(Decision.SERVED, call=Call.FETCH, by=by, round=round, group=group, to=jurisdiction or "?")
        return aggregate

    def reconfigure(self, residency: ZonePolicy, *, by: str = "-") -> None:
        """Take the federation's new membership (zones added or drained, sites joined) between rounds.

        Raises
        ------
        ZoneError
            A round is open here (it was opened under the old membership).
        """
        with self._z.lock:
            open_round = min(self._z.open, default=None)
            if open_round is None:
                self._z.residency = residency  # the intake's and the reduction's too
        if open_round is not None:
            exc = ZoneError(f"zone {self.name}: round {open_round} is open; reconfigure between rounds")
            self.refused_call(Call.RECONFIGURE, by, refusal_code(exc), str(exc))
            raise exc
        self._record(Decision.RECONFIGURED, by=by, policy=residency.policy.digest, sites=len(residency.jurisdictions))

    def close(self) -> None:
        """Close the audit log (the zone accepts nothing more)."""
        if self.audit is not None:
            self.audit.close()

    @property
    def open_rounds(self) -> int:
        """Rounds open at the zone now."""
        return len(self._z.open)

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
