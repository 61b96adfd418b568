"""Hierarchical reduction: partial sums of ``global`` shards, from zone to reducing zone.

At round close a zone that is not the reducing zone forwards, for every ``global``
shard, its running sum ``S = Σ (w/unit)·x`` as it is (float32, or float64 where
:func:`~fedshard.aggregation.sum_dtype` says so; ``unit`` is the round's largest fixed
weight, the same at every zone) with ``Σ w`` and the sites it holds, or the encrypted
sum as it is (:func:`partial_sums`). A partial sum is already a weighted sum: adding
``K`` of them at the reducing zone adds ``K − 1`` roundings to the ``n − 1`` of the largest,
so the reduced mean keeps the bound stated in :mod:`fedshard.aggregation._accumulator`
for the ``N`` sites in all. The reducing zone receives them as a transaction, the
way it receives a push (:class:`ForwardSession`): the header is checked before any
frame (:func:`check_partial`: round and token, once per zone, every contribution's
residency, sizes), the frames go through the one
:class:`~fedshard.zone.frames.FrameAssembler`, and nothing is folded until the whole
forward is complete and valid.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedshard.aggregation import error_bound, extremes, fixed_weight_of, within
from fedshard.aggregation.bounds import SUM_TOLERANCE
from fedshard.crypto.ciphertexts import load_ciphertexts
from fedshard.errors import FrameError, IntegrityError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import MAX_NOISE_TERMS, ciphertext_digest, noise_terms_ok, shard_digest
from fedshard.protocol.rounds import DEFAULT_WEIGHT, GLOBAL_GROUP, PartialEntry, PartialSum, ShardPayload
from fedshard.zone._staging import Loan, StagingPool
from fedshard.zone.frames import Chunk, Declared, FrameAssembler, Header

if TYPE_CHECKING:
    from fedshard.protocol.channels import ZoneConnector
    from fedshard.zone._rounds import ZoneRounds
    from fedshard.zone._state import OpenRound
    from fedshard.zone.policy import ZonePolicy

__all__ = ["ForwardSession", "ForwardTarget", "check_partial", "partial_sums", "send_partial_sums"]


def partial_sums(state: OpenRound, zone: str, noise: str) -> tuple[PartialSum, dict[str, ShardPayload]]:
    """The header and values this zone forwards for ``state``'s ``global`` shards (none: empty),
    once settled (:meth:`~fedshard.zone._state.OpenRound.settle`): ``noise`` is the terms of the
    lane kept, whose encrypted sums are sent."""
    acc = state.groups.get(GLOBAL_GROUP) or state.accumulator()
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
    return PartialSum(zone, state.spec.round, state.spec.token, tuple(entries), noise), payload


def send_partial_sums(
    state: OpenRound, zone: str, connect: ZoneConnector | None, forward_to: tuple[str, str] | None, noise: str
) -> PartialSum | None:
    """Forward ``state``'s ``global`` partial sums to ``forward_to`` = the reducing zone's
    ``(name, endpoint)`` from the zone's own config, through ``connect`` (under mutual
    TLS it checks the peer's certificate names that zone); what was sent (None: nothing
    to send). ``noise``: the terms of the encrypted lane kept (see :func:`partial_sums`).

    Raises
    ------
    ZoneError
        There are global sums but no reducing zone (with an endpoint) to send them to
        (code :attr:`~RefusalCode.LIFECYCLE`), or the reducing zone refused them.
    PeerIdentityError
        The server at the reducing zone's endpoint is not that zone; nothing was sent.
    """
    partial, sums = partial_sums(state, zone, noise)
    if not partial.entries:
        return None
    if forward_to is None or connect is None:
        raise ZoneError(
            f"zone {zone}: round {state.spec.round} has global shards but no reducing zone to forward them to "
            "(its config names none, or no endpoint for it)",
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
        residency, identity, malformed, unknown-shard, shape, non-finite, encryption,
        site (a contributor not selected for the round), weight (``Σ w`` is not the sum
        of the round's weights of its contributors).
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
    if not noise_terms_ok(partial.noise):
        raise PushRejectedError(
            f"noise terms must be at most {MAX_NOISE_TERMS} printable ASCII characters (got {len(partial.noise)})",
            RefusalCode.MALFORMED,
        )
    weights = dict(state.spec.weights)
    for entry in partial.entries:
        _check_entry(state, entry, he_context)
        residency.check_partial(partial.zone, entry.shard_id, entry.contributors)
        _check_contributors(state, entry, weights)
    _check_packs(state, partial)


def _check_packs(state: OpenRound, partial: PartialSum) -> None:
    """Encrypted partial sums come packed as the sites packed them: a carrier's bytes (at
    most 64× the plan's bytes of the encrypted shards forwarded, plus 1 MiB) hold its
    pack, the other members have none; a shard this zone's own pushes packed must come
    as they packed it (the sums' ciphertext counts are checked as they are added)."""
    entries = {e.shard_id: e for e in partial.entries if e.encrypted}
    budget = 64 * sum(state.plan.shard(sid).nbytes for sid in entries) + (1 << 20)
    for sid, entry in entries.items():
        members = state.packs.get(sid)
        carrier = members is None or members[0] == sid
        if entry.nbytes > budget or (members is not None and bool(entry.nbytes) != carrier):
            raise PushRejectedError(
                f"shard {sid}: not an encrypted partial sum this zone sums (packed as the sites pack it)",
                RefusalCode.ENCRYPTION,
            )


def _check_entry(state: OpenRound, entry: PartialEntry, he_context: Any) -> None:
    sid = entry.shard_id
    if sid not in state.plan:
        raise PushRejectedError(f"shard {sid} is not in the round's shard plan", RefusalCode.UNKNOWN_SHARD)
    if not entry.contributors:
        raise PushRejectedError(f"shard {sid}: a partial sum of no site", RefusalCode.MALFORMED)
    spec = state.plan.shard(sid)
    if entry.encrypted:
        if he_context is None:  # its size is checked with its pack's (_check_packs)
            raise PushRejectedError(f"shard {sid}: not an encrypted partial sum this zone sums", RefusalCode.ENCRYPTION)
        return
    if entry.nbytes not in (4 * spec.size, 8 * spec.size):
        raise PushRejectedError(
            f"shard {sid}: partial sums are float32 or float64 of shape {spec.shape}", RefusalCode.SHAPE
        )
    if not (entry.weight > 0 and np.isfinite(entry.weight)):
        raise PushRejectedError(f"shard {sid}: non-finite values or weight", RefusalCode.NON_FINITE)


def _check_contributors(state: OpenRound, entry: PartialEntry, weights: dict[str, float]) -> None:
    """Every contributor selected, named once, not yet counted in this shard here; ``Σ w`` theirs."""
    sid = entry.shard_id
    if len(set(entry.contributors)) != len(entry.contributors):
        raise PushRejectedError(f"shard {sid}: the partial sum names a site twice", RefusalCode.MALFORMED)
    selected = set(state.spec.sites)
    stranger = next((c for c in entry.contributors if c not in selected), None)
    if stranger is not None:
        raise PushRejectedError(
            f"shard {sid}: the partial sum names site {stranger!r}, which was not selected for this round",
            RefusalCode.SITE,
        )
    counted = state.holders(GLOBAL_GROUP, sid) & set(entry.contributors)
    if counted:
        raise PushRejectedError(
            f"shard {sid}: site {min(counted)} is already counted in this shard's sum", RefusalCode.DUPLICATE
        )
    if entry.encrypted:  # the weight is inside the ciphertext
        return
    fixed = fixed_weight_of(entry.contributors, weights, DEFAULT_WEIGHT)
    if not math.isclose(entry.weight, fixed, rel_tol=SUM_TOLERANCE):
        raise PushRejectedError(
            f"shard {sid}: the partial sum's weight {entry.weight:g} differs from {fixed:g}, the round's weights "
            "of the sites it names",
            RefusalCode.WEIGHT,
        )


def _declared(state: OpenRound, partial: PartialSum) -> dict[str, Declared]:
    out = {}
    for e in partial.entries:
        if e.encrypted:
            out[e.shard_id] = Declared(e.shard_id, e.nbytes, e.digest, encrypted=True)
        else:
            spec = state.plan.shard(e.shard_id)
            dtype = "<f4" if e.nbytes == 4 * spec.size else "<f8"  # check_partial allowed only these two
            out[e.shard_id] = Declared(e.shard_id, e.nbytes, e.digest, dtype, spec.shape)
    return out


class ForwardTarget(Protocol):
    """What a forward session needs of the reducing zone (its
    :class:`~fedshard.zone._reduce.Reduction`)."""

    z: ZoneRounds
    """The zone's round state (its HE context, bounds)."""

    def fold_partial(
        self, state: OpenRound, partial: PartialSum, sums: dict[str, np.ndarray], ciphertexts: dict[str, list[Any]]
    ) -> int:
        """Fold a complete, valid forward into the round (all or nothing); shards folded."""
        ...

    def end_forward(self, state: OpenRound, zone: str, budget_bytes: int, *, freed: int | None = None) -> None:
        """The forward is over: forget it as in progress and return its staging bytes, of which
        ``freed`` (default: all) were freed rather than given back to a pool."""
        ...

    def refused_partial(self, partial: PartialSum, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``partial``; the error to raise."""
        ...


class ForwardSession:
    """One zone's forward in progress at the reducing zone: :meth:`take` chunks, then :meth:`commit`.

    Any failure raises :class:`PushRejectedError` and ends the forward; call
    :meth:`abort` (or use the session as a context manager) so the staging budget is
    returned. With ``staging`` (the zone's pool) clear partial sums are copied out of the
    frames into reused buffers, as a push's shards are (:mod:`fedshard.zone._staging`).
    """

    def __init__(
        self,
        zone: ForwardTarget,
        state: OpenRound,
        partial: PartialSum,
        budget_bytes: int,
        staging: StagingPool | None = None,
    ) -> None:
        self._zone = zone
        self._state = state
        self.partial = partial
        self._budget_bytes = budget_bytes
        self._loan = Loan(staging)
        self._frames = FrameAssembler(_declared(state, partial), source=Header.HEADER, buffers=self._loan.taker)
        self._weights = {e.shard_id: e.weight for e in partial.entries}
        self._contributors = {e.shard_id: e.contributors for e in partial.entries}
        self._unit = state.unit_weight
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
                scheme = self._zone.z.he_scheme
                if scheme is None:
                    raise IntegrityError(f"shard {sid} is encrypted but this zone has no HE context")
                self._ciphertexts[sid] = load_ciphertexts(scheme, self._zone.z.he_context, sid, values)
            except IntegrityError as exc:
                raise self.refuse(RefusalCode.ENCRYPTION, str(exc)) from None
            return
        low, high = extremes(values)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise self.refuse(RefusalCode.NON_FINITE, f"shard {sid}: non-finite values or weight")
        # S = Σ (w/unit)·x of values |x| ≤ max_value: never clipped here, it is another
        # zone's sum; the slack covers its rounding (γ_{n+3}, see fedshard.aggregation).
        n = len(self._contributors[sid])
        slack = max(SUM_TOLERANCE, 2 * float(error_bound(n, 1.0, values.dtype)))
        limit = self._weights[sid] / self._unit * self._zone.z.bounds.max_value * (1 + slack)
        if not within(low, high, limit):
            raise self.refuse(
                RefusalCode.BOUND,
                f"shard {sid}: partial sum values reach {max(-low, high):.3g}, beyond Σ w / unit weight · "
                f"aggregation.max_value = {limit:.3g}",
            )
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
        kept = self._loan.give_back()
        # the budget trims the heap when freed memory piles up
        freed = max(self._budget_bytes - kept, 0)
        self._zone.end_forward(self._state, self.partial.zone, self._budget_bytes, freed=freed)
