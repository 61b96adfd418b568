"""The prefetching loader (order, memory bound), models in the store, and whole-store verification."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.tasks.large_transformer import (
    TransformerConfig,
    build_model,
    init_tensors,
    materialise,
    num_parameters,
    shard_plan,
    write_to_store,
)
from fedshard.crypto.at_rest import Kek
from fedshard.errors import ShardIntegrityError, StoreError
from fedshard.integrity.version import genesis_version
from fedshard.sharding.plan import ShardPlan
from fedshard.store import ColdFormat, SealedShardStore
from fedshard.store.model_io import load_module, model_record, read_tensors, record_model, write_tensors
from fedshard.store.prefetch import Layer, PrefetchLoader, layers_of
from fedshard.store.sealed_store import blob_name
from fedshard.store.verify import check_store

TINY = TransformerConfig(vocab=64, d_model=32, heads=4, layers=3, ffn=64, max_len=16)


def _plan(n_layers: int = 8) -> tuple[ShardPlan, dict[str, np.ndarray]]:
    tensors = {}
    for i in range(n_layers):
        tensors[f"blocks.{i}.w"] = np.full((6, 5), i, np.float32)
        tensors[f"blocks.{i}.b"] = np.full(6, -i, np.float32)
    tensors["head.weight"] = np.ones((3, 6), np.float32)
    return ShardPlan.from_state_dict(tensors, tile=(4, 4)), tensors


class Recorder:
    """A fetch function that records calls and can be slow."""

    def __init__(self, shards: dict[str, np.ndarray], delay: float = 0.0) -> None:
        self.shards, self.delay = shards, delay
        self.calls: list[str] = []
        self.threads: set[str] = set()

    def __call__(self, shard_id: str) -> np.ndarray:
        self.calls.append(shard_id)
        self.threads.add(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        return self.shards[shard_id].copy()


def test_layers_follow_the_plan_order() -> None:
    plan, _ = _plan(3)
    assert layers_of(plan) == [
        Layer("blocks.0", ("blocks.0.w", "blocks.0.b")),
        Layer("blocks.1", ("blocks.1.w", "blocks.1.b")),
        Layer("blocks.2", ("blocks.2.w", "blocks.2.b")),
        Layer("head", ("head.weight",)),
    ]
    names = [layer.name for layer in layers_of(shard_plan(TINY))]
    assert names == ["embed", "pos", "blocks.0", "blocks.1", "blocks.2", "norm"]


@pytest.mark.parametrize("lookahead", [0, 1, 2, 4])
def test_layers_arrive_in_order_and_the_bound_holds(lookahead: int) -> None:
    plan, tensors = _plan(8)
    fetch = Recorder(plan.split(tensors))
    loader = PrefetchLoader(fetch, plan, lookahead=lookahead)
    seen = []
    for layer, got in loader:
        seen.append(layer.name)
        for name in layer.tensors:
            np.testing.assert_array_equal(got[name], tensors[name])
        # a slow consumer: give the loader time (up to 2 s) to run as far ahead as it may
        deadline = time.monotonic() + 2
        while (
            loader.resident < lookahead + 1
            and len(loader.fetch_order) < len(loader.layers)
            and time.monotonic() < deadline
        ):
            time.sleep(0.001)
        time.sleep(0.002)
        assert loader.resident <= lookahead + 1
    expected = [layer.name for layer in layers_of(plan)]
    assert seen == expected and loader.fetch_order == expected
    assert fetch.calls == plan.shard_ids  # shards fetched in forward order, each once
    assert loader.peak_resident == lookahead + 1  # reached, never exceeded
    layer_bytes = max(sum(tensors[n].nbytes for n in layer.tensors) for layer in layers_of(plan))
    assert loader.peak_bytes <= (lookahead + 1) * layer_bytes
    assert loader.resident == 0 and loader.resident_bytes == 0
    assert (fetch.threads == {"MainThread"}) == (lookahead == 0)


def test_prefetch_overlaps_with_the_consumer() -> None:
    """While the consumer holds layer i, the thread fetches the next layers' shards (no prefetch: it never does)."""
    plan, tensors = _plan(6)
    layers = layers_of(plan)
    through = np.cumsum([sum(plan.shard(sid).tensor in layer.tensors for sid in plan.shard_ids) for layer in layers])

    def prefetched(lookahead: int) -> list[bool]:
        fetch = Recorder(plan.split(tensors))
        out = []
        for i, _ in enumerate(PrefetchLoader(fetch, plan, lookahead=lookahead)):
            if i + 1 < len(layers):  # wait (up to 2 s) for the next layer's shards to be fetched
                deadline = time.monotonic() + (2.0 if lookahead else 0.2)
                while len(fetch.calls) < through[i + 1] and time.monotonic() < deadline:
                    time.sleep(0.001)
                out.append(len(fetch.calls) >= through[i + 1])
        return out

    assert all(prefetched(2))
    assert not any(prefetched(0))


def test_errors_reach_the_consumer_and_early_exit_stops_the_thread() -> None:
    plan, tensors = _plan(5)
    shards = plan.split(tensors)

    def failing(shard_id: str) -> np.ndarray:
        if shard_id.startswith("blocks.3."):
            raise ShardIntegrityError(shard_id, f"shard {shard_id}: bad")
        return shards[shard_id]

    got = []
    with pytest.raises(ShardIntegrityError, match=r"blocks\.3"):
        for layer, _ in PrefetchLoader(failing, plan, lookahead=2):
            got.append(layer.name)
    assert got == ["blocks.0", "blocks.1", "blocks.2"]

    loader = PrefetchLoader(Recorder(shards), plan, lookahead=3)
    for layer, _ in loader:
        if layer.name == "blocks.1":
            break
    assert loader.resident == 0 and loader.resident_bytes == 0
    assert not any(t.name == "fedshard-prefetch" for t in threading.enumerate())
    with pytest.raises(StoreError, match="lookahead"):
        PrefetchLoader(Recorder(shards), plan, lookahead=-1)


# models in the store ------------------------------------------------------------------------------
def test_large_transformer_is_large_and_deterministic() -> None:
    assert num_parameters() >= 100_000_000
    assert all(p.is_meta for p in build_model().parameters())  # built lazily: no memory
    a, b = dict(init_tensors(TINY, seed=3)), dict(init_tensors(TINY, seed=3))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.qkv.weight"], dict(init_tensors(TINY, seed=4))["blocks.0.qkv.weight"])
    logits = materialise(TINY, seed=3)(torch.zeros(2, 5, dtype=torch.long))
    assert logits.shape == (2, 5, TINY.vocab)


@pytest.mark.parametrize("lookahead", [0, 2])
def test_model_written_by_the_plan_loads_back_exactly(tmp_path: Path, lookahead: int) -> None:
    store = SealedShardStore.create(tmp_path / "s", Kek.generate())
    record = write_to_store(store, TINY, seed=5, tile=(16, 16))
    assert record.plan == shard_plan(TINY, (16, 16)) and model_record(store) == record
    assert record.version == genesis_version(record.plan.digest, record.root)
    assert store.list() == sorted(record.plan.shard_ids)

    model = build_model(TINY)
    report = load_module(model, store, lookahead=lookahead)
    reference = materialise(TINY, seed=5)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert report.layers == 6 and report.tensors == len(reference.state_dict())
    assert report.peak_resident_layers <= lookahead + 1
    tokens = torch.randint(0, TINY.vocab, (2, 7))
    assert torch.equal(model(tokens), reference(tokens))
    assert set(read_tensors(store)) == set(reference.state_dict())


def test_verify_checks_shards_root_and_version(tmp_path: Path) -> None:
    store = SealedShardStore.create(tmp_path / "s", Kek.generate())
    assert check_store(store).ok and "no model version" in check_store(store).notes[0]
    assert not check_store(store, expected_version="ab" * 32).ok
    plan = ShardPlan.from_state_dict({"w": np.zeros((8, 8), np.float32), "b": np.zeros(8, np.float32)}, (4, 4))
    record = write_tensors(
        store, plan, [("w", np.arange(64, dtype=np.float32).reshape(8, 8)), ("b", np.ones(8, np.float32))]
    )
    report = check_store(store, expected_version=record.version)
    assert report.ok and report.root == record.root and report.shards == len(plan)

    store.tier(-1, ColdFormat.INT8)  # everything cold: the root still covers the full-precision values
    assert check_store(store, expected_version=record.version).ok

    store.put("w#r0c0", np.zeros((4, 4), np.float32))  # trained again, model version not updated
    report = check_store(store, expected_version=record.version)
    assert [p.shard_id for p in report.problems] == [None] and "Merkle root" in report.problems[0].message
    doc = dict(store.get_meta("model"))
    store.set_meta("model", {**doc, "root": "00" * 32})  # a root that the version does not follow from
    assert any("is not the genesis" in p.message for p in check_store(store).problems)
    record2 = record_model(store, plan, version="cd" * 32)
    assert not record2.genesis
    assert check_store(store, expected_version="cd" * 32).ok
    assert "expected abababab" in check_store(store, expected_version="ab" * 32).problems[0].message

    store.backend.delete(blob_name("w#r1c1", store.stat("w#r1c1").version))
    store.delete("b#r0c0")
    report = check_store(store)
    messages = sorted(p.message for p in report.problems)
    assert any("w#r1c1: its stored file" in m for m in messages)
    assert any("b#r0c0 of the model's plan is not in the store" in m for m in messages)
    assert record2.root != record.root
