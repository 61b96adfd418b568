"""Hierarchical reduction at one zone: receiving other zones' partial sums (at the reducing
zone) as transactions, and sending this zone's own at round close.

:class:`Reduction` is the :class:`~fedshard.zone._forward.ForwardTarget` of the zone's
forward sessions (checks and frames: :mod:`fedshard.zone._forward`). It operates on the
zone's round state (:class:`~fedshard.zone._rounds.ZoneRounds`), which the
:class:`~fedshard.zone.aggregator.ZoneAggregator` owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard import faults
from fedshard.audit import Decision
from fedshard.errors import PushRejectedError, RefusalCode, ZoneError
from fedshard.protocol.rounds import GLOBAL_GROUP, PartialSum, ShardPayload
from fedshard.zone._calls import Call
from fedshard.zone._forward import ForwardSession, check_partial, send_partial_sums
from fedshard.zone._rounds import ZoneRounds
from fedshard.zone._state import OpenRound, settle_audited
from fedshard.zone.frames import shard_chunks

if TYPE_CHECKING:
    from fedshard.protocol.channels import ZoneConnector

__all__ = ["Reduction"]


class Reduction:
    """One zone's side of hierarchical reduction (see the module docstring).

    Parameters
    ----------
    rounds:
        The zone's round state (:class:`~fedshard.zone._rounds.ZoneRounds`).
    connect:
        Makes a client to the reducing zone (see :class:`~fedshard.zone.aggregator.ZoneAggregator`).
    """

    def __init__(self, rounds: ZoneRounds, connect: ZoneConnector | None) -> None:
        self.z = rounds
        self._connect = connect

    def begin(
        self, partial: PartialSum, timeout: float | None = None, *, certified: str | None = None
    ) -> ForwardSession:
        """Check another zone's partial-sum header and start receiving its sums.

        ``certified`` is the sending zone's name from its mTLS certificate.
        """
        with self.z.lock:
            state = self.z.open.get(partial.round)
            try:
                if certified is not None and certified != partial.zone:
                    raise PushRejectedError(f"the caller's certificate names zone {certified!r}", RefusalCode.IDENTITY)
                if state is None:
                    raise PushRejectedError(f"round {partial.round} is not open at this zone", RefusalCode.ROUND)
                check_partial(state, partial, residency=self.z.residency, he_context=self.z.he_context)
            except PushRejectedError as exc:
                raise self.refused_partial(partial, exc.code, str(exc)) from None
            state.forwarding.add(partial.zone)
        need = sum(e.nbytes for e in partial.entries)
        if not self.z.budget.acquire(need, timeout):
            self.end_forward(state, partial.zone, 0)
            raise ZoneError(f"zone {self.z.name}: busy, could not stage {need} bytes in time; retry", RefusalCode.BUSY)
        return ForwardSession(self, state, partial, need, self.z.staging)

    def refused_partial(self, partial: PartialSum, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``partial``; the error to raise (see :class:`ForwardSession`)."""
        self.z.stats.refuse(reason, code)
        fields = {"source_zone": partial.zone, "round": partial.round, "code": code, "reason": reason}
        self.z.record(Decision.REFUSED, call=Call.FORWARD, by=f"zone:{partial.zone}", **fields)
        return PushRejectedError(
            f"zone {self.z.name} refused zone {partial.zone}'s partial sums for round {partial.round}: {reason}", code
        )

    def fold_partial(
        self, state: OpenRound, partial: PartialSum, sums: dict[str, np.ndarray], ciphertexts: dict[str, list[Any]]
    ) -> int:
        """Fold a complete, valid forward into the round (called by its :class:`ForwardSession`)."""
        with self.z.lock:
            if self.z.open.get(partial.round) is not state:
                raise self.refused_partial(partial, RefusalCode.ROUND, "the round closed during the forward")
            for entry in partial.entries:
                sid = entry.shard_id
                if entry.encrypted:
                    lane = state.fold_encrypted(GLOBAL_GROUP, sid, entry.contributors, self.z.he_context, partial.noise)
                    lane.add(sid, ciphertexts[sid])
                else:
                    acc = state.fold(GLOBAL_GROUP, sid, entry.contributors)
                    acc.add_sum(sid, sums[sid], entry.weight, state.plan.shard(sid).dtype)
            state.forwarded_from.add(partial.zone)
            self.z.stats.partials_received += len(partial.entries)
        faults.point("zone.forward.received")
        self.z.record(
            Decision.ACCEPTED,
            call=Call.FORWARD,
            source_zone=partial.zone,
            round=partial.round,
            partial_shards=len(partial.entries),
            contributors=sorted({c for e in partial.entries for c in e.contributors}),
        )
        return len(partial.entries)

    def end_forward(self, state: OpenRound, zone: str, budget_bytes: int, *, freed: int | None = None) -> None:
        """A forward is over (see :class:`ForwardSession`): forget it as in progress; return its
        staging bytes (``freed`` of them freed, the others kept in the staging pool)."""
        with self.z.lock:
            state.forwarding.discard(zone)
        if budget_bytes:
            self.z.budget.release(budget_bytes, freed=freed)

    def receive(self, partial: PartialSum, sums: Mapping[str, ShardPayload], *, certified: str | None = None) -> int:
        """Fold another zone's partial sums of ``global`` shards into this round at once
        (in-process use; the gRPC service streams instead). Returns the number of shards
        folded in; raises :class:`PushRejectedError` and folds nothing if any is refused."""
        encrypted = {e.shard_id for e in partial.entries if e.encrypted}
        with self.begin(partial, certified=certified) as session:
            for shard_id, values in sums.items():
                for chunk in shard_chunks(shard_id, values, encrypted=shard_id in encrypted):
                    session.take(chunk)
            return session.commit()

    def send(self, state: OpenRound, forward_to: tuple[str, str] | None) -> None:
        """Forward ``state``'s partial sums of ``global`` shards to ``forward_to``, the
        reducing zone's ``(name, endpoint)`` from this zone's own config (nothing to send:
        nothing done); counted and audited."""
        noise = settle_audited(state, GLOBAL_GROUP, self.z.record, self.z.name, "forwarding")
        partial = send_partial_sums(state, self.z.name, self._connect, forward_to, noise)
        if partial is None or forward_to is None:
            return
        faults.point("zone.forward.sent")
        nbytes = sum(e.nbytes for e in partial.entries)
        self.z.stats.forwarded_shards += len(partial.entries)
        self.z.stats.forwarded_bytes += nbytes
        if self.z.residency is not None:
            entries = ((e.shard_id, e.contributors) for e in partial.entries)
            self.z.stats.count_forward(entries, self.z.residency.classes, self.z.residency.jurisdictions)
        who = sorted({c for e in partial.entries for c in e.contributors})
        self.z.record(
            Decision.FORWARDED,
            round=partial.round,
            to_zone=forward_to[0],
            shards=len(partial.entries),
            bytes=nbytes,
            contributors=who,
        )
