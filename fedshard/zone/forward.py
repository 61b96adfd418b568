"""Hierarchical reduction: partial sums of ``global`` shards, from zone to reducing zone.

At round close a zone that is not the reducing zone forwards, for every ``global``
shard, ``Σ w x`` (float64) with ``Σ w`` and the sites it holds, or the encrypted sum as
it is (:func:`partial_sums`). The reducing zone receives them as a transaction, the
way it receives a push (:class:`ForwardSession`): the header is checked before any
frame (:func:`check_partial`: round and token, once per zone, every contribution's
residency, sizes), the frames go through the one
:class:`~fedshard.zone.frames.FrameAssembler`, and nothing is folded until the whole
forward is complete and valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedshard.aggregation import ShardAccumulator, all_finite
from fedshard.crypto.he import load_ciphertexts
from fedshard.errors import FrameError, IntegrityError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import ciphertext_digest, shard_digest
from fedshard.protocol.rounds import GLOBAL_GROUP, PartialEntry, PartialSum, ShardPayload
from fedshard.zone.frames import Chunk, Declared, FrameAssembler, Header
from fedshard.zone.heap import trim_heap

if TYPE_CHECKING:
    from fedshard.protocol.channels import ZoneConnector
    from fedshard.zone.policy import ZonePolicy
    from fedshard.zone.state import OpenRound

__all__ = ["ForwardSession", "ForwardTarget", "check_partial", "partial_sums", "send_partial_sums"]

_TRIM_BYTES = 8 << 20  # forwards at least this large hand their memory back when done


def partial_sums(state: OpenRound, zone: str) -> tuple[PartialSum, dict[str, ShardPayload]]:
    """The header and values this zone forwards for ``state``'s ``global`` shards (none: empty)."""
    acc = state.groups.get(GLOBAL_GROUP, ShardAccumulator())
    enc = state.encrypted.get(GLOBAL_GROUP)
    contributors = state.contributors.get(GLOBAL_GROUP, {})
    totals = acc.partial_sums()
    sums = {sid: total for sid, (total, _) in totals.items()}
    weights = {sid: weight for sid, (_, weight) in totals.items()}
    entries = [
        PartialEntry(sid, shard_digest(arr), int(arr.nbytes), weights[sid], tuple(sorted(contributors[sid])))
        for sid, arr in sums.items()
    ]
    payload: dict[str, ShardPayload] = dict(sums)
    if enc is not None:  # encrypted sums travel as they are: the weight is inside them
        for sid in enc.shard_ids():
            data = payload[sid] = enc.serialize(sid)
            who = tuple(sorted(contributors[sid]))
            entries.append(PartialEntry(sid, ciphertext_digest(data), len(data), 1.0, who, encrypted=True))
    return PartialSum(zone, state.spec.round, state.spec.token, tuple(entries)), payload


def send_partial_sums(
    state: OpenRound, zone: str, connect: ZoneConnector | None, forward_to: tuple[str, str] | None
) -> PartialSum | None:
    """Forward ``state``'s ``global`` partial sums to ``forward_to`` = the reducing zone's
    ``(name, endpoint)``; what was sent (None: nothing to send).

    Raises
    ------
    ZoneError
        There are global sums but no reducing zone to send them to (code
        :attr:`~RefusalCode.LIFECYCLE`), or the reducing zone refused them.
    """
    partial, sums = partial_sums(state, zone)
    if not partial.entries:
        return None
    if forward_to is None or connect is None:
        raise ZoneError(
            f"zone {zone}: round {state.spec.round} has global shards but no reducing zone to forward them to",
            RefusalCode.LIFECYCLE,
        )
    client = connect(*forward_to)
    try:
        client.forward(partial, sums)
    finally:
        client.close()
    return partial


def check_partial(state: OpenRound, partial: PartialSum, *, residency: ZonePolicy | None, he_context: Any) -> None:
    """Check a forward's header against the open round, before any frame.

    Raises
    ------
    PushRejectedError
        With the reason (without the zone's prefix) and its code: token, duplicate,
        residency, identity, malformed, unknown-shard, shape, non-finite, encryption.
    """
    if partial.token != state.spec.token:
        raise PushRejectedError("round token does not match", RefusalCode.TOKEN)
    if partial.zone in state.forwarded_from or partial.zone in state.forwarding:
        raise PushRejectedError("this zone already forwarded its partial sums for the round", RefusalCode.DUPLICATE)
    if residency is None:
        raise PushRejectedError(
            "this zone has no residency policy, so it reduces nothing globally", RefusalCode.RESIDENCY
        )
    ids = [e.shard_id for e in partial.entries]
    if len(set(ids)) != len(ids):
        raise PushRejectedError("the header lists a shard twice", RefusalCode.MALFORMED)
    for entry in partial.entries:
        _check_entry(state, entry, he_context)
        residency.check_partial(partial.zone, entry.shard_id, entry.contributors)


def _check_entry(state: OpenRound, entry: PartialEntry, he_context: Any) -> None:
    sid = entry.shard_id
    if sid not in state.plan:
        raise PushRejectedError(f"shard {sid} is not in the round's shard plan", RefusalCode.UNKNOWN_SHARD)
    if not entry.contributors:
        raise PushRejectedError(f"shard {sid}: a partial sum of no site", RefusalCode.MALFORMED)
    spec = state.plan.shard(sid)
    if entry.encrypted:
        if he_context is None or not 0 < entry.nbytes <= 64 * spec.nbytes + (1 << 20):
            raise PushRejectedError(f"shard {sid}: not an encrypted partial sum this zone sums", RefusalCode.ENCRYPTION)
        return
    if entry.nbytes != 8 * spec.size:
        raise PushRejectedError(f"shard {sid}: partial sums are float64 of shape {spec.shape}", RefusalCode.SHAPE)
    if not (entry.weight > 0 and np.isfinite(entry.weight)):
        raise PushRejectedError(f"shard {sid}: non-finite values or weight", RefusalCode.NON_FINITE)


def _declared(state: OpenRound, partial: PartialSum) -> dict[str, Declared]:
    out = {}
    for e in partial.entries:
        if e.encrypted:
            out[e.shard_id] = Declared(e.shard_id, e.nbytes, e.digest, encrypted=True)
        else:
            out[e.shard_id] = Declared(e.shard_id, e.nbytes, e.digest, "<f8", state.plan.shard(e.shard_id).shape)
    return out


class ForwardTarget(Protocol):
    """What a forward session needs of the reducing zone (the
    :class:`~fedshard.zone.aggregator.ZoneAggregator`)."""

    he_context: Any
    """The zone's public CKKS context, or None."""

    def fold_partial(
        self, state: OpenRound, partial: PartialSum, sums: dict[str, np.ndarray], ciphertexts: dict[str, list[Any]]
    ) -> int:
        """Fold a complete, valid forward into the round (all or nothing); shards folded."""
        ...

    def end_forward(self, state: OpenRound, zone: str, budget_bytes: int) -> None:
        """The forward is over: forget it as in progress and return its staging bytes."""
        ...

    def refused_partial(self, partial: PartialSum, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``partial``; the error to raise."""
        ...


class ForwardSession:
    """One zone's forward in progress at the reducing zone: :meth:`take` chunks, then :meth:`commit`.

    Any failure raises :class:`PushRejectedError` and ends the forward; call
    :meth:`abort` (or use the session as a context manager) so the staging budget is
    returned.
    """

    def __init__(self, zone: ForwardTarget, state: OpenRound, partial: PartialSum, budget_bytes: int) -> None:
        self._zone = zone
        self._state = state
        self.partial = partial
        self._budget_bytes = budget_bytes
        self._frames = FrameAssembler(_declared(state, partial), source=Header.HEADER)
        self._sums: dict[str, np.ndarray] = {}
        self._ciphertexts: dict[str, list[Any]] = {}
        self._done = False

    def __enter__(self) -> ForwardSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    def refuse(self, code: RefusalCode, reason: str) -> PushRejectedError:
        """End the forward as refused (counted and audited); the error to raise."""
        self.abort()
        return self._zone.refused_partial(self.partial, code, reason)

    def take(self, chunk: Chunk) -> None:
        """Take one chunk of a partial sum (the first of each shard carries dtype and shape)."""
        if self._done:
            raise self.refuse(RefusalCode.STATE, "forward already finished")
        try:
            done = self._frames.add(chunk)
        except FrameError as exc:
            raise self.refuse(exc.code, exc.reason) from None
        if done is None:
            return
        sid, values = done
        if isinstance(values, bytes):  # the header lists it encrypted (the assembler checked)
            try:
                self._ciphertexts[sid] = load_ciphertexts(self._zone.he_context, sid, values)
            except IntegrityError as exc:
                raise self.refuse(RefusalCode.ENCRYPTION, str(exc)) from None
        elif not all_finite(values):
            raise self.refuse(RefusalCode.NON_FINITE, f"shard {sid}: non-finite values or weight")
        else:
            self._sums[sid] = values

    def commit(self) -> int:
        """Check the forward is complete, then fold it into the round; the number of shards folded."""
        if self._done:
            raise self.refuse(RefusalCode.STATE, "forward already finished")
        try:
            self._frames.finish()
        except FrameError as exc:
            raise self.refuse(exc.code, exc.reason) from None
        folded = self._zone.fold_partial(self._state, self.partial, self._sums, self._ciphertexts)
        self.abort()
        return folded

    def abort(self) -> None:
        """Drop everything staged (after a commit: release what the commit no longer needs)."""
        if self._done:
            return
        self._done = True
        self._sums, self._ciphertexts = {}, {}
        self._zone.end_forward(self._state, self.partial.zone, self._budget_bytes)
        if self._budget_bytes >= _TRIM_BYTES:
            trim_heap()
