"""Releasing a site's update: split once, HE, signed manifests, pushes.

The update is computed shard by shard over the pre-training copy of the model (the
one copy a train message makes), so it exists once; the shards the policy encrypts
are replaced by their ciphertexts; each zone gets a signed manifest and its shards.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import numpy as np

from fedshard import faults
from fedshard.errors import FedshardError, HeldPush, PushRejectedError, RoundError, ZoneUnavailableError
from fedshard.integrity import build_manifest
from fedshard.protocol.channels import ZoneConnector
from fedshard.protocol.messages import TrainInstruction, ZonePush
from fedshard.protocol.rounds import PushReceipt, ShardPayload
from fedshard.protocol.timings import MAX_PHASE_S
from fedshard.site._points import pointed
from fedshard.site._retry import DEFAULT_RETRY, held_push
from fedshard.site.routes import SiteRouting

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedshard.crypto.he import HeCodec, Pack

__all__ = ["MAX_PARALLEL_PUSHES", "encrypt_shards", "he_packs", "push_update", "sealed", "update_over"]

log = logging.getLogger(__name__)


def update_over(base: dict[str, np.ndarray], trained: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``trained − base`` for every shard, written over ``base`` (returned): the update needs no new memory."""
    for sid, before in base.items():
        np.subtract(trained[sid], before, out=before)
    return base


def he_packs(routing: SiteRouting, sizes: Mapping[str, int]) -> list[Pack]:
    """How the shards ``routing`` encrypts travel (``sizes``: values per shard): packed in
    plan order per destination zone, aggregate group and shard class (see
    :func:`~fedshard.crypto.he.pack_layout`): residency holds, and as the policy routes by
    class, every site that sends a shard to an aggregate packs it with the same others."""
    from fedshard.crypto.he import pack_layout

    return pack_layout(
        (sid, sizes[sid], f"{d.zone}|{d.aggregate.group}|{d.shard_class}")
        for sid, d in routing.routes.items()
        if sid in routing.encrypted
    )


def sealed(
    update: dict[str, np.ndarray],
    message: TrainInstruction,
    routing: SiteRouting,
    codec: Callable[[], HeCodec],
    site_id: str,
) -> dict[str, ShardPayload]:
    """The payload a site pushes for ``update`` (its DP already applied): the shards its
    routes encrypt as HE ciphertext (:func:`encrypt_shards`). The coordinator fixed the
    weight (zones refuse any other); ciphertext carries it over the round's weight scale."""
    he_weight = message.weight / (message.weight_scale or message.weight)
    packs = he_packs(routing, {sid: values.size for sid, values in update.items()})
    return encrypt_shards(update, routing.encrypted, codec, he_weight, f"site {site_id} round {message.round}", packs)


def encrypt_shards(
    update: dict[str, np.ndarray],
    encrypted: frozenset[str],
    codec: Callable[[], HeCodec],
    weight: float,
    context: str,
    packs: Sequence[Pack] | None = None,
) -> dict[str, ShardPayload]:
    """The payload of ``update``: the shards in ``encrypted`` as ciphertext ``bytes`` (each
    pack's carrier its pack's ciphertexts, the other members empty bytes; without
    ``packs`` one pack per shard), the others as they are (same order; the arrays are
    not copied)."""
    if not encrypted:
        return dict(update)
    he = codec()
    if packs is None:
        from fedshard.crypto.he import Pack

        packs = [Pack(((sid, int(update[sid].size)),)) for sid in update if sid in encrypted]
    blobs, clipped = he.encrypt_packs(packs, update, min(weight, 1.0))
    payload: dict[str, ShardPayload] = {sid: blobs.get(sid, values) for sid, values in update.items()}
    if clipped:
        log.warning(
            "%s: %d update value(s) exceeded he.value_range=%g and were clipped to encrypt them",
            context,
            clipped,
            he.value_range,
        )
    return payload


MAX_PARALLEL_PUSHES = 4
"""Zones a site pushes to at once. Each push is one stream (the zone's transaction), so
this also bounds the site's streams; a zone admits a few per party (``streams_per_party``)."""


def push_update(
    payload: Mapping[str, ShardPayload],
    routing: SiteRouting,
    message: TrainInstruction,
    endpoints: Mapping[str, str],
    *,
    site_id: str,
    plan_digest: str,
    weight: float,
    signing_key: Ed25519PrivateKey | None,
    connect: ZoneConnector,
    noise: str = "",
    max_parallel: int = MAX_PARALLEL_PUSHES,
) -> list[ZonePush]:
    """Push every zone its shards (ciphertext ``bytes`` where the routes encrypt) with a (signed) manifest.

    The zones are pushed in parallel, at most ``max_parallel`` at once (a thread each:
    digests, signing and gRPC all release the GIL for most of their work). Every push
    runs to its end, whether or not another fails; a failed push is a refused
    transaction at its zone, so nothing of it is counted there.

    ``endpoints`` are the site's own (its config's) endpoints of the zones the round
    includes: a zone the routes use but the round does not include is refused before
    anything is pushed; no endpoint from the message is ever dialled.

    ``weight`` is the one the coordinator fixed for the site this round
    (:attr:`TrainInstruction.weight`): a zone refuses a manifest with any other.
    ``noise`` names the terms of the site's shared DP noise (:attr:`Manifest.noise`; "":
    none shared), in every manifest.

    Returns
    -------
    list[ZonePush]
        What each zone acknowledged, zones by name.

    Raises
    ------
    RoundError
        With the reason to report: the round names no endpoint for a zone the routes
        use (then nothing is pushed), or a zone refused the push (then with the zone's
        :class:`RefusalCode` in ``code`` and the zone's own line as the message; where
        several failed, the first of them in zone order, the others logged).
    """
    by_zone = routing.by_zone()
    for zone, shard_ids in by_zone.items():
        if zone not in endpoints:
            raise RoundError(
                f"the round does not include zone {zone} of this site's config, where residency routes "
                f"{len(shard_ids)} shard(s)"
            )

    push = functools.partial(
        _push_zone,
        payload=payload,
        routing=routing,
        message=message,
        endpoints=endpoints,
        site_id=site_id,
        plan_digest=plan_digest,
        weight=weight,
        signing_key=signing_key,
        connect=connect,
        noise=noise,
    )
    jobs = [functools.partial(push, zone, shard_ids) for zone, shard_ids in by_zone.items()]
    return _run_all(jobs, list(by_zone), max_parallel, f"site {site_id}, round {message.round}")


def _push_zone(
    zone: str,
    shard_ids: list[str],
    *,
    payload: Mapping[str, ShardPayload],
    routing: SiteRouting,
    message: TrainInstruction,
    endpoints: Mapping[str, str],
    site_id: str,
    plan_digest: str,
    weight: float,
    signing_key: Ed25519PrivateKey | None,
    connect: ZoneConnector,
    noise: str,
) -> ZonePush:
    """Push ``zone`` its shards with a (signed) manifest; :class:`RoundError` if it refuses."""
    part = {sid: payload[sid] for sid in shard_ids}
    manifest = build_manifest(
        site_id=site_id,
        round=message.round,
        plan_digest=plan_digest,
        base_version=message.base_version,
        zone=zone,
        weight=weight,
        shards=part,
        classes={sid: routing.routes[sid].shard_class for sid in shard_ids},
        policy_digest=routing.policy_digest,
        encrypted=frozenset(shard_ids) & routing.encrypted,
        noise=noise,
    )
    if signing_key is not None:
        manifest = manifest.signed(signing_key)
    faults.point("site.push.manifest")

    def attempt(n: int) -> PushReceipt:
        client = connect(zone, endpoints[zone])  # a fresh channel per attempt: no stale reconnect backoff
        try:
            return client.push(manifest, message.token, pointed("site.push.shard", part))
        except PushRejectedError as exc:
            held = held_push(exc, n)
            if held is HeldPush.COUNTED:  # an earlier attempt landed: this very manifest is counted
                return PushReceipt(zone, manifest.round, site_id, len(manifest.shards), manifest.total_bytes)
            if held is HeldPush.PENDING:
                raise ZoneUnavailableError(f"zone {zone} is still receiving an earlier attempt") from None
            raise
        finally:
            client.close()

    try:
        receipt = DEFAULT_RETRY.call(
            attempt, deadline=message.deadline(), what=f"site {site_id}: push to zone {zone}, round {message.round}"
        )
    except PushRejectedError as exc:  # the zone's own line names the zone, the site and the round
        raise RoundError(str(exc), code=exc.code) from None
    except FedshardError as exc:
        raise RoundError(f"push to zone {zone} failed: {exc}", code=exc.code) from None
    faults.point("site.push.done")
    classes = collections.Counter(entry.shard_class or "unclassified" for entry in manifest.shards)
    return ZonePush(
        zone=receipt.zone,
        merkle_root=manifest.merkle_root,
        shards=receipt.shards,
        nbytes=receipt.bytes,
        fold_s=min(receipt.fold_s, MAX_PHASE_S),
        classes=dict(sorted(classes.items())),
    )


def _run_all(jobs: Sequence[Callable[[], ZonePush]], zones: list[str], max_parallel: int, who: str) -> list[ZonePush]:
    """Run every job to its end, at most ``max_parallel`` at once; the first failure (in
    zone order) is raised, the others logged."""
    if len(jobs) <= 1 or max_parallel <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(max_parallel, len(jobs)), thread_name_prefix="push") as pool:
        futures = [pool.submit(job) for job in jobs]
        wait(futures)
    failed = [(zone, f.exception()) for zone, f in zip(zones, futures, strict=True) if f.exception() is not None]
    for zone, exc in failed[1:]:
        log.warning("%s: push to zone %s failed too: %s", who, zone, exc)
    if failed:
        raise failed[0][1]  # type: ignore[misc]
    return [f.result() for f in futures]
