"""A push in progress at a zone: frames checked one by one, staged within a byte budget,
folded into the round only when the whole push is valid (see :class:`PushSession`).

The manifest's weight must be the one the coordinator fixed for the site when it
opened the round (:func:`check_manifest`), and the plaintext values are held to the
federation's bounds (``aggregation`` in the config): each value within
``±max_value`` and the site's shards at this zone within the push's L2 bound
(``max_update_norm``, and the zone's reference of earlier rounds: :mod:`fedshard.zone._norms`),
refused or clipped by the configured rule. Clipping happens after the frames were
checked against the signed manifest's digests, just before the fold.
"""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedshard import faults
from fedshard.aggregation import extremes, norm_scale, squared_norm, within
from fedshard.config import BoundRule
from fedshard.crypto.ciphertexts import load_ciphertexts
from fedshard.crypto.he import Pack, pack_layout
from fedshard.errors import FrameError, IntegrityError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import Manifest
from fedshard.protocol.rounds import DEFAULT_GROUP, PushReceipt, RoundSpec, ShardPayload
from fedshard.zone._staging import Loan, StagingPool
from fedshard.zone.frames import Buffer, Chunk, Declared, FrameAssembler, Header

if TYPE_CHECKING:
    from fedshard.zone._rounds import ZoneRounds
    from fedshard.zone._state import OpenRound

__all__ = [
    "PushSession",
    "PushTarget",
    "accepted_fields",
    "check_manifest",
    "check_packs",
    "check_round_weights",
]


class PushTarget(Protocol):
    """What a push session needs of its zone (the zone's :class:`~fedshard.zone._intake.PushIntake`)."""

    z: ZoneRounds
    """The zone's round state (its name, HE context, bounds)."""

    def fold_push(
        self,
        state: OpenRound,
        manifest: Manifest,
        staged: dict[str, np.ndarray],
        groups: dict[str, str],
        ciphertexts: dict[str, list[Any]],
        bounded: dict[str, Any] | None = None,
        norm: float | None = None,
    ) -> PushReceipt:
        """Fold a complete, valid push into the round's sums (all or nothing); ``bounded``
        says how it was brought within bounds (``norm_scale``, ``values_clipped``), if it was;
        ``norm`` is the L2 norm of its plaintext shards as folded (None: it has none)."""
        ...

    def end_push(
        self, state: OpenRound, site_id: str, budget_bytes: int, *, counted: bool, freed: int | None = None
    ) -> None:
        """The push is over: forget it as in progress (unless ``counted``) and return its staging
        bytes, of which ``freed`` (default: all) were freed rather than given back to a pool."""
        ...

    def refused_push(self, manifest: Manifest, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``manifest``'s push; the error to raise."""
        ...


def check_round_weights(spec: RoundSpec, cap: float, *, zone: str) -> None:
    """Refuse a round whose fixed weights name an unselected site or exceed ``cap``
    (``aggregation.max_site_weight``), before the round opens at ``zone``.

    Raises
    ------
    ZoneError
        With code :attr:`~RefusalCode.INVALID` (an unselected site) or
        :attr:`~RefusalCode.BOUND` (a weight not in ``(0, cap]``).
    """
    for site, weight in spec.weights:
        if not spec.selects(site):
            raise ZoneError(
                f"zone {zone}: round {spec.round} fixes a weight for site {site!r}, which it did not select",
                RefusalCode.INVALID,
            )
        if not (math.isfinite(weight) and 0 < weight <= cap):
            raise ZoneError(
                f"zone {zone}: round {spec.round} fixes weight {weight:g} for site {site}; weights must be "
                f"positive and at most aggregation.max_site_weight = {cap:g}",
                RefusalCode.BOUND,
            )


def check_manifest(state: OpenRound, manifest: Manifest, token: str, *, zone: str, he_context: Any) -> None:
    """Check a push's manifest and token against its open round at ``zone``, before any frame.

    Raises
    ------
    PushRejectedError
        With the reason (without the zone's prefix) and its code: token, site,
        duplicate, plan, version, zone, weight (not the weight the round fixed for the
        site), unknown-shard, shape, encryption.
    """
    spec = state.spec
    if token != spec.token:
        raise PushRejectedError("round token does not match (stale or replayed push)", RefusalCode.TOKEN)
    if not spec.selects(manifest.site_id):
        raise PushRejectedError("site was not selected for this round", RefusalCode.SITE)
    if manifest.site_id in state.pushing or manifest.site_id in state.counted:
        raise PushRejectedError("site already pushed in this round", RefusalCode.DUPLICATE)
    if manifest.plan_digest != state.plan.digest:
        raise PushRejectedError("manifest's shard plan differs from the round's", RefusalCode.PLAN)
    expected = spec.version_for(manifest.site_id)
    if manifest.base_version != expected:
        raise PushRejectedError(
            f"update computed from model version {manifest.base_version[:12]}…, round expects {expected[:12]}…",
            RefusalCode.VERSION,
        )
    if manifest.zone != zone:
        raise PushRejectedError(f"manifest is addressed to zone {manifest.zone!r}", RefusalCode.ZONE)
    fixed = spec.weight_for(manifest.site_id)
    if manifest.weight != fixed:
        raise PushRejectedError(
            f"manifest weight {manifest.weight:g} differs from {fixed:g}, the weight the round fixed for the site",
            RefusalCode.WEIGHT,
        )
    for entry in manifest.shards:
        if entry.shard_id not in state.plan:
            raise PushRejectedError(
                f"shard {entry.shard_id} is not in the round's shard plan", RefusalCode.UNKNOWN_SHARD
            )
        planned = state.plan.shard(entry.shard_id).nbytes
        if entry.encrypted:  # its size is checked with its pack's (check_packs)
            if he_context is None:
                raise PushRejectedError(
                    f"shard {entry.shard_id} is encrypted but this zone has no HE context", RefusalCode.ENCRYPTION
                )
        elif entry.nbytes != planned:
            raise PushRejectedError(
                f"shard {entry.shard_id}: manifest says {entry.nbytes} bytes, the plan {planned}", RefusalCode.SHAPE
            )


def check_packs(state: OpenRound, manifest: Manifest, groups: dict[str, str]) -> dict[str, Pack]:
    """The packs of a push's encrypted shards, by carrier, after checking the manifest
    lays them out as :func:`~fedshard.crypto.he.pack_layout` does for the plan and the
    aggregate groups (``groups``: shard → group) and the shard classes: carriers hold a
    plausible number of ciphertext bytes (at most 64× the plan's bytes of the pack, plus
    1 MiB), the other members none, and every pack is the one earlier pushes of the round
    made of its carrier (so the zone never adds differently packed ciphertexts). Records
    the packs in ``state``.

    Raises
    ------
    PushRejectedError
        ``shape``: a shard's bytes do not fit the layout, or the packs differ from
        earlier pushes'.
    """
    entries = {e.shard_id: e for e in manifest.shards if e.encrypted}
    if not entries:
        return {}
    order = [s for s in state.plan.shards if s.shard_id in entries]
    packs = pack_layout(
        (s.shard_id, s.size, f"{groups.get(s.shard_id, DEFAULT_GROUP)}|{entries[s.shard_id].shard_class}")
        for s in order
    )
    for pack in packs:
        members = tuple(sid for sid, _ in pack.members)
        if any(state.packs.get(sid, members) != members for sid in members):
            raise PushRejectedError(
                f"shard {pack.carrier}: packed with other shards than earlier pushes of the round "
                "(sites must route and classify shards alike)",
                RefusalCode.SHAPE,
            )
        planned = sum(state.plan.shard(sid).nbytes for sid, _ in pack.members)
        carrier = entries[pack.carrier]
        if not 0 < carrier.nbytes <= 64 * planned + (1 << 20):
            raise PushRejectedError(
                f"shard {carrier.shard_id}: {carrier.nbytes} bytes of ciphertext is implausible for its pack of "
                f"{len(pack.members)} shard(s)",
                RefusalCode.SHAPE,
            )
        extra = next((sid for sid, _ in pack.members[1:] if entries[sid].nbytes), None)
        if extra is not None:
            raise PushRejectedError(
                f"shard {extra}: travels in shard {pack.carrier}'s ciphertexts (the plan's packing), yet "
                f"the manifest gives it {entries[extra].nbytes} bytes",
                RefusalCode.SHAPE,
            )
    for pack in packs:
        members = tuple(sid for sid, _ in pack.members)
        state.packs.update(dict.fromkeys(members, members))
    return {p.carrier: p for p in packs}


def accepted_fields(manifest: Manifest, groups: dict[str, str]) -> dict[str, Any]:
    """What the zone's audit log records of an accepted push (``groups``: shard → aggregate group)."""
    count = len(manifest.shards)
    return {
        "site": manifest.site_id,
        "round": manifest.round,
        "shards": count,
        "bytes": manifest.total_bytes,
        "classes": dict(collections.Counter(e.shard_class or "unclassified" for e in manifest.shards)),
        "groups": dict(collections.Counter(groups.values())) if groups else {DEFAULT_GROUP: count},
        "manifest_root": manifest.merkle_root,
        "signature": manifest.signature or "",
    }


def _declared(state: OpenRound, manifest: Manifest) -> dict[str, Declared]:
    """What each shard of a push must be: the plan's layout and the manifest's digest
    (ciphertext: bytes of the manifest's size)."""
    out = {}
    for e in manifest.shards:
        if e.encrypted:
            out[e.shard_id] = Declared(e.shard_id, e.nbytes, e.digest, declared_by=Header.MANIFEST, encrypted=True)
        else:
            spec = state.plan.shard(e.shard_id)
            out[e.shard_id] = Declared(e.shard_id, spec.nbytes, e.digest, spec.dtype, spec.shape, Header.PLAN)
    return out


class PushSession:
    """One site's push in progress. Feed chunks with :meth:`receive`, then :meth:`commit`.

    Frames go through the zone's one :class:`~fedshard.zone.frames.FrameAssembler`;
    each completed shard is checked at once (finite values within ``±max_value``;
    ciphertext of the federation's context), and the plaintext shards' squared norms
    add up towards ``norm_bound`` (the push's L2 bound; None: unbounded). Any failure raises
    :class:`PushRejectedError` and ends the push; call :meth:`abort` (or use the session as
    a context manager) so the staging budget is returned.

    With ``staging`` (the zone's :class:`~fedshard.zone._staging.StagingPool`) the clear
    shards are copied out of the frames into buffers of the pool, given back when the push
    commits or ends; a session is driven by one thread, which alone takes and gives them.
    """

    def __init__(
        self,
        zone: PushTarget,
        state: OpenRound,
        manifest: Manifest,
        budget_bytes: int,
        groups: dict[str, str] | None = None,
        packs: dict[str, Pack] | None = None,
        staging: StagingPool | None = None,
        norm_bound: float | None = None,
    ) -> None:
        self._zone = zone
        self._norm_bound = norm_bound
        self._state = state
        self.manifest = manifest
        self._groups = groups or {}
        self._packs = packs or {}  # carrier → pack of the encrypted shards
        self._budget_bytes = budget_bytes
        self._loan = Loan(staging)
        self._frames = FrameAssembler(_declared(state, manifest), source=Header.MANIFEST, buffers=self._loan.taker)
        self._staged: dict[str, np.ndarray] = {}
        self._ciphertexts: dict[str, list[Any]] = {}  # parsed encrypted shards
        self._squares = 0.0  # Σ x² over the plaintext shards so far
        self._clipped = 0  # values clipped to ±max_value
        self._done = False

    def __enter__(self) -> PushSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    @property
    def site_id(self) -> str:
        """The pushing site."""
        return self.manifest.site_id

    def refuse(self, code: RefusalCode, reason: str) -> PushRejectedError:
        """End the push as refused (counted and audited); the error to raise."""
        # A refusal ends the push: what was staged before it can no longer be committed.
        self.abort()
        return self._zone.refused_push(self.manifest, code, reason)

    def receive(
        self, shard_id: str, data: Buffer, *, offset: int, dtype: str = "", shape: tuple[int, ...] = ()
    ) -> None:
        """Take one chunk of shard ``shard_id``. The first chunk (offset 0) carries dtype and shape."""
        self.take(Chunk(shard_id, offset, data, dtype, tuple(shape)))

    def take(self, chunk: Chunk) -> None:
        """Take one chunk (see :meth:`receive`)."""
        if self._done:
            raise self.refuse(RefusalCode.STATE, "push already finished")
        if self._frames.pending is None and chunk.shard_id not in self._state.plan:
            raise self.refuse(RefusalCode.UNKNOWN_SHARD, f"shard {chunk.shard_id} is not in the round's shard plan")
        try:
            done = self._frames.add(chunk)
        except FrameError as exc:
            raise self.refuse(exc.code, exc.reason) from None
        if done is not None:
            self._check(*done)
        faults.point("zone.push.frame")

    def _check(self, shard_id: str, values: ShardPayload) -> None:
        if isinstance(values, bytes):  # the manifest lists it encrypted (the assembler checked)
            scheme = self._zone.z.he_scheme
            if scheme is None:  # (refused at the manifest already)
                raise self.refuse(
                    RefusalCode.ENCRYPTION, f"shard {shard_id} is encrypted but this zone has no HE context"
                )
            try:
                parsed = load_ciphertexts(scheme, self._zone.z.he_context, shard_id, values)
            except IntegrityError as exc:
                raise self.refuse(RefusalCode.ENCRYPTION, str(exc)) from None
            pack = self._packs.get(shard_id)
            needed = None if pack is None else pack.ciphertexts(scheme.name)
            if pack is not None and len(parsed) != needed:
                raise self.refuse(
                    RefusalCode.ENCRYPTION,
                    f"shard {shard_id}: {len(parsed)} ciphertexts, its pack of {pack.count} values needs {needed}",
                )
            self._ciphertexts[shard_id] = parsed  # a packed member (no bytes): no ciphertexts
            return
        low, high = extremes(values)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise self.refuse(RefusalCode.NON_FINITE, f"shard {shard_id} contains NaN or infinite values")
        bounds = self._zone.z.bounds
        if not within(low, high, bounds.max_value):
            if bounds.value_rule is BoundRule.REFUSE:
                raise self.refuse(
                    RefusalCode.BOUND,
                    f"shard {shard_id} holds a value of magnitude {max(-low, high):.3g}, above "
                    f"aggregation.max_value = {bounds.max_value:g}",
                )
            self._clipped += int(np.count_nonzero(np.abs(values) > bounds.max_value))
            values = np.clip(values, -bounds.max_value, bounds.max_value)  # a copy: the received bytes stay as signed
        self._squares += squared_norm(values)  # also what the zone's norm reference learns from
        limit = self._norm_bound
        if limit is not None and bounds.norm_rule is BoundRule.REFUSE and math.sqrt(self._squares) > limit:
            raise self.refuse(
                RefusalCode.BOUND,
                f"the update's L2 norm at this zone exceeds its bound {limit:.6g} (aggregation.max_update_norm, "
                f"or max_norm_over_median × the norms of the zone's last round; at shard {shard_id})",
            )
        self._staged[shard_id] = values

    def commit(self) -> PushReceipt:
        """Check the push is complete, then fold it into the round's sums."""
        if self._done:
            raise self.refuse(RefusalCode.STATE, "push already finished")
        try:
            self._frames.finish()
        except FrameError as exc:
            raise self.refuse(exc.code, exc.reason) from None
        bounded: dict[str, Any] = {}
        limit, norm = self._norm_bound, math.sqrt(self._squares) if self._staged else None
        if limit is not None and norm is not None:  # norm_rule clip (refuse already refused in _check)
            scale = norm_scale(self._squares, limit)
            if scale < 1.0:
                bounded["norm_scale"] = scale
                norm = min(norm * scale, limit)
        if self._clipped:
            bounded["values_clipped"] = self._clipped
        receipt = self._zone.fold_push(
            self._state, self.manifest, self._staged, self._groups, self._ciphertexts, bounded or None, norm
        )
        self._done = True
        self._release(counted=True)
        return receipt

    def abort(self) -> None:
        """Drop everything staged; nothing of this push is counted."""
        if not self._done:
            self._done = True
            self._release(counted=False)

    def _release(self, *, counted: bool) -> None:
        self._staged = {}
        self._ciphertexts = {}
        kept = self._loan.give_back()  # nothing refers to them any more: the sums were folded, or the push ended
        if self._budget_bytes or not counted:
            # the staging bytes go back to the budget, which trims the heap when freed memory piles up
            freed = max(self._budget_bytes - kept, 0)
            self._zone.end_push(self._state, self.site_id, self._budget_bytes, counted=counted, freed=freed)
            self._budget_bytes = 0
