"""Models in a shard store: write tensors by the shard plan, record the model version, load back.

The store's ``model`` metadata records the shard plan, the model version and the
Merkle root of the full-precision shard digests at that version; ``fedshard verify
--store`` checks the stored shards against it. A genesis version
(``H("fedshard/genesis" ‖ plan digest ‖ root)``) binds the root itself, so for a fresh
model the check reaches the version; later versions chain the aggregates' roots
(:mod:`fedshard.integrity.version`), and the recorded root is what the check uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.errors import ShardError, StoreError
from fedshard.integrity.merkle import merkle_root
from fedshard.integrity.version import genesis_version
from fedshard.sharding.plan import DEFAULT_TILE, ShardPlan, TensorSpec, as_numpy
from fedshard.store.prefetch import PrefetchLoader
from fedshard.store.sealed_store import SealedShardStore

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "MODEL_META",
    "LoadReport",
    "ModelRecord",
    "load_module",
    "model_record",
    "plan_of",
    "read_into",
    "read_tensors",
    "record_model",
    "write_tensors",
]

MODEL_META = "model"


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """The model a store holds: its plan, version and the root of its shard digests."""

    plan: ShardPlan
    version: str
    root: str
    genesis: bool = False  # the version is the genesis version of plan and root


def plan_of(tensors: Iterable[tuple[str, tuple[int, ...], str]], tile: tuple[int, int] = DEFAULT_TILE) -> ShardPlan:
    """A shard plan from ``(name, shape, dtype)`` triples (no values needed: works for lazily built models)."""
    specs = [
        TensorSpec(name, tuple(int(d) for d in shape), np.dtype(dtype).newbyteorder("<").str)
        for name, shape, dtype in tensors
    ]
    return ShardPlan(specs, tile)


def record_model(store: SealedShardStore, plan: ShardPlan, version: str | None = None) -> ModelRecord:
    """Record ``plan``, the model version and the Merkle root of the stored shards in the store.

    ``version`` defaults to the genesis version of ``plan`` and the root (a fresh model).
    Every shard of the plan must be in the store.
    """
    entries = store.entries()
    missing = [sid for sid in plan.shard_ids if sid not in entries]
    if missing:
        raise ShardError(f"shard {missing[0]!r} of the plan is not in the store ({len(missing)} missing)")
    root = merkle_root({sid: entries[sid].source_digest for sid in plan.shard_ids})
    genesis = version is None
    version = version or genesis_version(plan.digest, root)
    store.set_meta(MODEL_META, {"plan": plan.to_json(), "version": version, "root": root, "genesis": genesis})
    return ModelRecord(plan, version, root, genesis)


def model_record(store: SealedShardStore) -> ModelRecord | None:
    """The model recorded in the store, or ``None``."""
    doc = store.get_meta(MODEL_META)
    if doc is None:
        return None
    try:
        plan = ShardPlan.from_json(doc["plan"])
        return ModelRecord(plan, str(doc["version"]), str(doc["root"]), bool(doc.get("genesis", False)))
    except (KeyError, TypeError, ShardError) as exc:
        raise StoreError(f"the model record of store {store.location} is malformed ({exc})") from None


def write_tensors(
    store: SealedShardStore,
    plan: ShardPlan,
    tensors: Iterable[tuple[str, Any]],
    *,
    version: str | None = None,
) -> ModelRecord:
    """Write ``(name, tensor)`` pairs, cut by ``plan``, in one commit, and record the model.

    Tensors may come from a generator: only one is held at a time (plus its shards).
    """
    specs = {t.name: t for t in plan.tensors}
    with store.batch():
        for name, tensor in tensors:
            if name not in specs:
                raise ShardError(f"tensor {name!r} is not in the shard plan")
            sub = ShardPlan([specs[name]], plan.tile)  # the same shard ids as the full plan
            store.put_many(sub.split({name: as_numpy(tensor)}))
        return record_model(store, plan, version)


def read_tensors(store: SealedShardStore, lookahead: int = 2) -> dict[str, np.ndarray]:
    """Every tensor of the recorded model, ``{name: array}``."""
    record = model_record(store)
    if record is None:
        raise StoreError(f"store {store.location} records no model")
    out: dict[str, np.ndarray] = {}
    for _, tensors in PrefetchLoader(store.get, record.plan, lookahead=lookahead):
        out.update(tensors)
    return out


@dataclass(frozen=True, slots=True)
class LoadReport:
    """How a model load went."""

    seconds: float
    layers: int
    tensors: int
    peak_resident_layers: int
    peak_resident_bytes: int


def read_into(
    store: SealedShardStore,
    plan: ShardPlan,
    out: Mapping[str, np.ndarray],
    *,
    lookahead: int = 2,
    workers: int = 2,
) -> LoadReport:
    """Decrypt and verify every shard of ``plan`` straight into ``out`` (``{tensor name: array}``).

    The arrays (typically views of a module's tensors) must be C-contiguous and of the
    plan's shapes; nothing else is allocated for the model (``lookahead`` layers ahead,
    ``workers`` shards at a time; see :class:`~fedshard.store.prefetch.PrefetchLoader`).
    """
    t0 = time.perf_counter()
    loader = PrefetchLoader(store.get, plan, lookahead=lookahead, out=out, workers=workers)
    count = sum(len(tensors) for _, tensors in loader)
    return LoadReport(time.perf_counter() - t0, len(loader.layers), count, loader.peak_resident, loader.peak_bytes)


def load_module(module: nn.Module, store: SealedShardStore, *, lookahead: int = 2, workers: int = 2) -> LoadReport:
    """Fill ``module``'s parameters and buffers from the store, layer by layer in forward order.

    A module built on the ``meta`` device is given real (CPU) storage first, so a large
    model never exists twice in memory: shards are decrypted, checked and written
    straight into the module's tensors (see :func:`read_into`). The module's tensor
    names, shapes and dtypes must match the plan's.
    """
    import torch

    record = model_record(store)
    if record is None:
        raise StoreError(f"store {store.location} records no model")
    t0 = time.perf_counter()
    if any(t.is_meta for t in module.state_dict().values()):
        module.to_empty(device="cpu")
    targets = module.state_dict(keep_vars=True)
    unknown = [t.name for t in record.plan.tensors if t.name not in targets]
    if unknown:
        raise ShardError(f"the stored model has tensor {unknown[0]!r}, which the module lacks")
    out = {}
    for spec in record.plan.tensors:
        target = targets[spec.name].detach()
        if tuple(target.shape) != spec.shape or target.dtype != torch.from_numpy(np.empty(0, spec.dtype)).dtype:
            raise ShardError(f"tensor {spec.name!r} of the module does not match the stored plan ({spec.shape})")
        out[spec.name] = target.numpy()  # shares the module's memory
    report = read_into(store, record.plan, out, lookahead=lookahead, workers=workers)
    return LoadReport(
        time.perf_counter() - t0, report.layers, report.tensors, report.peak_resident_layers, report.peak_resident_bytes
    )
