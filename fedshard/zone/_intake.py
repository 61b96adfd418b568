"""How a zone takes in pushes: the manifest checked before any frame (:meth:`PushIntake.begin`),
a complete, valid push folded into the round's sums all at once (:meth:`PushIntake.fold_push`),
every refusal counted and audited. The frames between are the push's own
(:class:`~fedshard.zone._push.PushSession`); forwarded partial sums come in through
:class:`~fedshard.zone._reduce.Reduction`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedshard import faults
from fedshard.audit import Decision
from fedshard.errors import PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import Manifest
from fedshard.protocol.rounds import DEFAULT_GROUP, PushReceipt
from fedshard.zone._calls import Call
from fedshard.zone._norms import NormReference, shard_set
from fedshard.zone._push import PushSession, accepted_fields, check_manifest, check_packs
from fedshard.zone._rounds import ZoneRounds
from fedshard.zone._state import OpenRound, manifest_digest

__all__ = ["PushIntake", "lost_reason"]


def lost_reason(zone: str, round: int) -> str:
    """Why a round open when the zone stopped is refused now."""
    return (
        f"round {round} was lost: zone {zone} stopped while it was open (its sums were in memory); "
        "the coordinator must abort it"
    )


class PushIntake:
    """A zone's pushes (the :class:`~fedshard.zone._push.PushTarget` its sessions report to).

    Parameters
    ----------
    rounds:
        The zone's round state (:class:`~fedshard.zone._rounds.ZoneRounds`).
    norms:
        The zone's reference of update norms, which bounds each push (:mod:`fedshard.zone._norms`).
    """

    def __init__(self, rounds: ZoneRounds, norms: NormReference) -> None:
        self.z = rounds
        self.norms = norms

    def begin(
        self, manifest: Manifest, token: str, timeout: float | None = None, *, certified: str | None = None
    ) -> PushSession:
        """Check a push's manifest and start receiving its shards.

        ``certified`` is the caller's jurisdiction from its mTLS certificate; the
        residency checks use it rather than anything the request says.
        """
        groups: dict[str, str] = {}
        with self.z.lock:
            state = self.z.open.get(manifest.round)
            try:
                if state is None:
                    closed = manifest.round in self.z.closed
                    reason = "round is closed" if closed else "round is not open at this zone"
                    if manifest.round in self.z.recovery.lost:
                        reason = lost_reason(self.z.name, manifest.round)
                    raise PushRejectedError(reason, RefusalCode.ROUND)
                check_manifest(state, manifest, token, zone=self.z.name, he_context=self.z.he_context)
                if self.z.residency is not None:
                    self.z.residency.origin(manifest.site_id, certified)
                    groups = self.z.residency.check_manifest(manifest)
                packs = check_packs(state, manifest, groups)
            except PushRejectedError as exc:
                # a retry of a push that landed, or that is still arriving: say so (to that site only)
                held = state.held(manifest) if exc.code is RefusalCode.DUPLICATE and state is not None else None
                reason = f"{exc} (this very manifest: {held})" if held is not None else str(exc)
                error = self.refused_push(manifest, exc.code, reason)
                error.held = held
                raise error from None
            state.pushing.add(manifest.site_id)
            state.manifests[manifest.site_id] = manifest_digest(manifest)
        need = manifest.total_bytes
        if not self.z.budget.acquire(need, timeout):
            self.end_push(state, manifest.site_id, 0, counted=False)
            raise ZoneError(f"zone {self.z.name}: busy, could not stage {need} bytes in time; retry", RefusalCode.BUSY)
        faults.point("zone.push.header")
        bound = self.norms.bound(state.norm_reference, shard_set(manifest))
        return PushSession(self, state, manifest, need, groups, packs, self.z.staging, bound)

    def refused_push(self, manifest: Manifest, code: RefusalCode, reason: str) -> PushRejectedError:
        """Count and audit a refusal of ``manifest``'s push; the error to raise (see :class:`PushSession`)."""
        self.z.stats.refuse(reason, code)
        fields = {"site": manifest.site_id, "round": manifest.round, "code": code, "reason": reason}
        self.z.record(Decision.REFUSED, call=Call.PUSH, by=f"site:{manifest.site_id}", **fields)
        return PushRejectedError(
            f"zone {self.z.name} refused {manifest.site_id}'s push for round {manifest.round}: {reason}", code
        )

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
        """Fold a complete, valid push into the round's sums (called by its :class:`PushSession`);
        ``bounded["norm_scale"]`` scales its plaintext values (clipped to the push's norm bound);
        ``norm`` (their L2 norm as folded) joins the round's norms (:mod:`fedshard.zone._norms`)."""
        bounded = bounded or {}
        scale = float(bounded.get("norm_scale", 1.0))
        with self.z.lock:
            started = time.perf_counter()
            if self.z.open.get(manifest.round) is not state:
                raise self.refused_push(manifest, RefusalCode.ROUND, "the round closed during the push")
            site = (manifest.site_id,)
            weight = state.spec.weight_for(manifest.site_id)  # the manifest's, checked before any frame
            for shard_id, values in staged.items():
                group = groups.get(shard_id, DEFAULT_GROUP)
                state.fold(group, shard_id, site).add(shard_id, values, weight, scale)
            for shard_id, parsed in ciphertexts.items():  # the weight is inside the ciphertext (see fedshard.crypto.he)
                group = groups.get(shard_id, DEFAULT_GROUP)
                state.fold_encrypted(group, shard_id, site, self.z.he_context, manifest.noise).add(shard_id, parsed)
            state.pushing.discard(manifest.site_id)
            state.counted[manifest.site_id] = None
            if norm is not None:
                state.norms.setdefault(shard_set(manifest), {})[manifest.site_id] = norm
            origin = self.z.residency.jurisdictions.get(manifest.site_id) if self.z.residency is not None else None
            fold_s = time.perf_counter() - started
            self.z.stats.count_push(manifest, origin, fold_s)
        if norm is not None:
            bounded = {**bounded, "norm": round(norm, 6)}  # what the next round's bound is taken from
        self.z.record(Decision.ACCEPTED, call=Call.PUSH, **accepted_fields(manifest, groups), **bounded)
        faults.point("zone.push.commit")  # counted; the site has not heard so yet
        shards, nbytes = len(manifest.shards), manifest.total_bytes
        return PushReceipt(self.z.name, manifest.round, manifest.site_id, shards, nbytes, fold_s)

    def end_push(
        self, state: OpenRound, site_id: str, budget_bytes: int, *, counted: bool, freed: int | None = None
    ) -> None:
        """A push is over (see :class:`PushSession`): forget it unless counted; return its staging
        bytes (``freed`` of them freed, the others kept in the staging pool)."""
        if not counted:
            with self.z.lock:
                state.pushing.discard(site_id)
                state.manifests.pop(site_id, None)
        if budget_bytes:
            self.z.budget.release(budget_bytes, freed=freed)
