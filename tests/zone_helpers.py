"""Builders shared by the zone tests (in-process and over gRPC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedshard.config import ResidencyConfig
from fedshard.integrity import Manifest, build_manifest, shard_digest
from fedshard.protocol.messages import TrainInstruction
from fedshard.protocol.rounds import PartialEntry, PartialSum
from fedshard.residency import Policy, Router, ZoneInfo
from fedshard.sharding import ShardPlan
from fedshard.zone.policy import ZonePolicy

BASE = "ab" * 32
TOKEN = "token-round-1"

Shards = dict[str, np.ndarray]


def random_update(seed: int, plan: ShardPlan) -> Shards:
    """A reproducible random update, split by ``plan``."""
    rng = np.random.default_rng(seed)
    return plan.split({t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in plan.tensors})


def manifest_for(
    site: str,
    shards: Shards,
    *,
    plan: ShardPlan,
    weight: float = 1.0,
    round: int = 1,
    zone: str = "eu-1",
    base: str = BASE,
) -> Manifest:
    """The manifest ``site`` would send for ``shards``."""
    return build_manifest(
        site_id=site, round=round, plan_digest=plan.digest, base_version=base, zone=zone, weight=weight, shards=shards
    )


FORWARD_WEIGHTS = (("site-a", 4.0), ("site-b", 2.0))
"""The weights a round opened with :data:`FORWARD_WEIGHTS` fixes: ``site-a`` (US, its
sums arrive forwarded by ``us-1``) 4, ``site-b`` (EU, pushes to the reducing zone) 2."""


def reducing_policy(
    plan: ShardPlan, sites: tuple[str, ...], zone: str = "eu-1", *, us_sites: tuple[str, ...] = ("site-a",)
) -> ZonePolicy:
    """Residency of ``zone`` (EU), the reducing zone of a federation with a second zone
    ``us-1`` (US): every shard public, so every shard's sums are global. The ``us_sites``
    are in the US, so they push to ``us-1`` (which forwards their sums); every other site
    is in the EU and pushes to ``zone``."""
    router = Router(Policy.from_config(ResidencyConfig()), [ZoneInfo(zone, "EU"), ZoneInfo("us-1", "US")], zone)
    jurisdictions = {site: "US" if site in us_sites else "EU" for site in sites}
    return ZonePolicy(zone, "EU", router, {sid: "public" for sid in plan.shard_ids}, jurisdictions)


def partial_from(
    sums: Shards, *, weight: float = 4.0, zone: str = "us-1", token: str = TOKEN, sites: tuple[str, ...] = ("site-a",)
) -> PartialSum:
    """The header zone ``zone`` forwards for partial sums ``sums`` (``Σ (w/unit)·x``) of ``sites``."""
    entries = tuple(PartialEntry(sid, shard_digest(v), int(v.nbytes), weight, sites) for sid, v in sums.items())
    return PartialSum(zone, 1, token, entries)


def site_model(state_root: Path, site_id: str) -> tuple[dict[str, Any], Shards]:
    """What a site built by ``make_site(config, site_id, state_root)`` saved: its encrypted
    shard store, opened with the site's key (kept beside ``state_root``, never inside it)."""
    from fedshard.assembly import STORE_KEYS_DIR
    from fedshard.site.model_store import SealedModelStore, site_kek

    kek = site_kek(state_root.parent / STORE_KEYS_DIR / f"{site_id}.kek", create=False)
    return SealedModelStore(state_root / site_id / "shards", kek).load()


def assert_weighted_mean(mean: np.ndarray, updates: list[np.ndarray], weights: list[float]) -> None:
    """``mean`` is the weighted mean of ``updates``, in their dtype, within the bound the
    accumulator states (:mod:`fedshard.aggregation._accumulator`): a site whose weight is
    not the round's largest is folded with a factor, so even one site's mean may differ
    from its update in the last bit."""
    from fedshard.aggregation import error_bound

    total = sum(weights)
    exact = sum(w * u.astype(np.float64) for w, u in zip(weights, updates, strict=True)) / total
    magnitude = sum(w * np.abs(u.astype(np.float64)) for w, u in zip(weights, updates, strict=True)) / total
    assert mean.dtype == updates[0].dtype
    assert mean.shape == updates[0].shape
    assert np.all(np.abs(mean - exact) <= error_bound(len(updates), magnitude))


SMALL_PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32), "b": np.zeros(5, np.float32)}, tile=(4, 4))
"""The zone tests' model: w (6, 8) -> 4 shards of (4, 4) and (2, 4); b (5,) -> (4, 1) and (1, 1)."""

ONE_ZONE = "eu-1"
ONE_ZONE_SITES = ("site-a", "site-b", "site-c")
ONE_ZONE_WEIGHTS = {"site-a": 1.0, "site-b": 3.0, "site-c": 2.0}  # what round 1 fixes for each site


def one_zone_manifest(site: str, shards: Shards, **kwargs: Any) -> Manifest:
    """``site``'s manifest for ``shards`` at :data:`ONE_ZONE`, with the weight round 1 fixed for it unless told."""
    kwargs.setdefault("weight", ONE_ZONE_WEIGHTS.get(site, 1.0))
    kwargs.setdefault("plan", SMALL_PLAN)
    kwargs.setdefault("zone", ONE_ZONE)
    return manifest_for(site, shards, **kwargs)


def train_instruction(zones: tuple[str, ...]) -> TrainInstruction:
    """A round-1 train message naming ``zones`` (at made-up endpoints ``zone:1``)."""
    return TrainInstruction(
        round=1,
        token="tok",
        base_version="0" * 64,
        missed=[],
        zones={z: f"{z}:1" for z in zones},
        epochs=1,
        batch_size=1,
        learning_rate=0.1,
        seed=0,
    )
