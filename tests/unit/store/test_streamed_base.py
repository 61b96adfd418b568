"""The frozen base streamed from the sealed store (fedshard/store/streamed.py, weight_stream.py)."""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("peft")

import torch
from torch import nn

from clients.tasks.llm.model import SIZES, AdapterScheme, add_lora, build_classifier
from fedshard.crypto.at_rest import Kek
from fedshard.errors import ShardIntegrityError, StoreError
from fedshard.store._shard_io import blob_name
from fedshard.store.quantize import ColdFormat
from fedshard.store.sealed_store import SealedShardStore
from fedshard.store.streamed import (
    AbsentWeight,
    Codes,
    StreamedBase,
    StreamedEmbedding,
    StreamedLinear,
    base_name,
    seal_base,
)
from fedshard.store.weight_stream import WeightStream

CFG = SIZES["tiny"]
CLASSES = 4


def lora_model(seed: int = 0) -> nn.Module:
    """The tiny classifier with LoRA on its projections; B is random, so the adapters matter."""
    torch.manual_seed(seed)
    model = add_lora(build_classifier(CFG, CLASSES), rank=4, alpha=8, scheme=AdapterScheme.FEDAVG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def dequantised(model: nn.Module, store: SealedShardStore, plan: object) -> nn.Module:
    """A copy of ``model`` holding the base as the store returns it (resident, plain nn.Linear)."""
    ref = copy.deepcopy(model)
    values = {spec.name: spec for spec in plan.tensors}  # type: ignore[attr-defined]
    joined = plan.join({sid: store.get(sid) for sid in plan.shard_ids})  # type: ignore[attr-defined]
    with torch.no_grad():
        for name, p in ref.state_dict(keep_vars=True).items():
            if base_name(name) in values:
                p.copy_(torch.from_numpy(joined[base_name(name)]))
    return ref


@pytest.fixture
def sealed(tmp_path: Path) -> tuple[nn.Module, SealedShardStore, object]:
    model = lora_model()
    store = SealedShardStore.create(tmp_path / "base", Kek.generate())
    plan = seal_base(model, store, ColdFormat.INT8)
    return model, store, plan


def tokens(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, CFG.vocab, (6, CFG.max_len), generator=g)


def step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(x)
    (out**2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return out.detach(), grads


@pytest.mark.parametrize("codes", list(Codes))
def test_outputs_and_lora_grads_equal_the_dequantised_resident_base(sealed, codes: Codes) -> None:  # type: ignore[no-untyped-def]
    model, store, plan = sealed
    ref = dequantised(model, store, plan)
    streamed = copy.deepcopy(model)
    base = StreamedBase(streamed, store, lookahead=2, codes=codes)
    for seed in (1, 2, 3):  # the first step records the schedule, the next ones prefetch
        x = tokens(seed)
        out_ref, g_ref = step(ref, x)
        out, g = step(streamed, x)
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
        assert g.keys() == g_ref.keys() and len(g) == 4 * 2 * CFG.layers
        for name in g_ref:
            torch.testing.assert_close(g[name], g_ref[name], rtol=1e-4, atol=1e-6)
    if codes is Codes.STORE:
        assert base.stats.misses == 0 and base.stats.fetches > 0 and base.held_stats.bands == 0
    else:  # every weight computed from its held codes, a band at a time; the stream never used
        assert base.held_stats.bands > 0 and base.stats.fetches == 0 and base.held_bytes > 0
    # the cold base is not the fp32 one: the comparison is with what the store returns
    assert not torch.equal(ref.blocks[0].ff1.base_layer.weight, model.blocks[0].ff1.base_layer.weight)


def test_input_gradients_equal_through_the_blocks(sealed) -> None:  # type: ignore[no-untyped-def]
    model, store, plan = sealed
    ref = dequantised(model, store, plan)
    streamed = copy.deepcopy(model)
    StreamedBase(streamed, store)
    for _ in range(2):
        grads = []
        for net in (ref, streamed):
            x = torch.randn(3, CFG.max_len, CFG.d_model, generator=torch.Generator().manual_seed(5), requires_grad=True)
            h = x
            for block in net.blocks:  # type: ignore[attr-defined]
                h = block(h)
            h.pow(2).sum().backward()
            grads.append((h.detach(), x.grad))
        torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-4, atol=1e-6)


def test_no_fp32_base_weight_stays_on_the_module(sealed) -> None:  # type: ignore[no-untyped-def]
    model, store, _ = sealed
    base = StreamedBase(model, store)
    state = {base_name(n) for n in model.state_dict()}
    assert set(base.streamed).isdisjoint(state)
    assert len(base.streamed) == 4 * CFG.layers + 3  # the projections, the head, both embeddings
    for m in model.modules():
        if isinstance(m, (StreamedLinear, StreamedEmbedding)):
            assert isinstance(m.weight, AbsentWeight) and m.weight.dtype == torch.float32
            with pytest.raises(StoreError, match="streamed from the sealed store"):
                m.weight + 1
        assert not (type(m) is nn.Linear and not m.weight.requires_grad)  # only adapters stay nn.Linear
        assert not isinstance(m, nn.Embedding)
    held = sum(t.numel() for n, t in model.state_dict().items() if "lora_" not in n)
    assert held * 4 == base.resident_bytes < base.streamed_bytes / 20  # biases and LayerNorms only


@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_at_most_lookahead_plus_one_weights_are_resident(sealed, lookahead: int) -> None:  # type: ignore[no-untyped-def]
    model, store, _ = sealed
    base = StreamedBase(model, store, lookahead=lookahead, codes=Codes.STORE)
    for seed in range(4):
        step(model, tokens(seed))
        with torch.no_grad():
            model(tokens(seed))
    assert base.peak_resident == lookahead + 1
    largest = max(4 * int(np.prod(t.shape)) for t in base.plan.tensors if t.name in base.streamed)
    assert base.stream.peak_bytes <= (lookahead + 1) * largest
    assert base.stream.resident <= lookahead  # between steps only fetched-ahead weights are alive
    base.close()
    assert base.stream.resident == 0


def _tamper(store: SealedShardStore, shard: str) -> None:
    path = Path(store.location) / blob_name(shard, store.stat(shard).version)
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_tampered_blob_raises_the_integrity_error_in_forward(sealed) -> None:  # type: ignore[no-untyped-def]
    model, store, _ = sealed
    StreamedBase(model, store, lookahead=2, codes=Codes.STORE)
    step(model, tokens())  # the schedule is learned: the bad shard comes from the prefetch thread
    _tamper(store, "blocks.1.ff1.weight#r0c0")
    with pytest.raises(ShardIntegrityError, match=r"blocks\.1\.ff1\.weight"):
        model(tokens())


def test_held_codes_are_checked_when_the_store_is_attached(sealed) -> None:  # type: ignore[no-untyped-def]
    model, store, _ = sealed
    _tamper(store, "blocks.1.ff1.weight#r0c0")
    with pytest.raises(ShardIntegrityError, match=r"blocks\.1\.ff1\.weight"):
        StreamedBase(model, store)


@pytest.mark.parametrize("fmt", list(ColdFormat))
def test_held_codes_and_store_reads_give_the_same_bits(tmp_path: Path, fmt: ColdFormat) -> None:
    """Held codes dequantised band by band by torch (int8, fp8) or NumPy (int4) give the bits a
    store read gives, through a forward and a backward."""
    runs = []
    for codes in Codes:
        torch.manual_seed(0)
        model = lora_model()
        store = SealedShardStore.create(tmp_path / codes.value, Kek.generate())
        seal_base(model, store, fmt, tile=(64, 128))  # rows of whole blocks: one multiplication a tile
        base = StreamedBase(model, store, codes=codes)
        assert (base.held_bytes > 0) == (codes is Codes.MEMORY)
        out, grads = step(model, tokens(3))
        runs.append((out.detach(), {k: g.clone() for k, g in grads.items()}))
        base.close()
    (out_m, grads_m), (out_s, grads_s) = runs
    assert torch.equal(out_m, out_s)
    assert grads_m.keys() == grads_s.keys() and all(torch.equal(grads_m[k], grads_s[k]) for k in grads_m)


@pytest.mark.parametrize("codes", list(Codes))
def test_eval_under_no_grad_and_back_to_training(sealed, codes: Codes) -> None:  # type: ignore[no-untyped-def]
    model, store, plan = sealed
    ref = dequantised(model, store, plan)
    base = StreamedBase(model, store, codes=codes)
    model.eval()
    ref.eval()
    with torch.no_grad():
        for seed in range(3):
            torch.testing.assert_close(model(tokens(seed)), ref(tokens(seed)), rtol=1e-5, atol=1e-6)
    model.train()
    ref.train()
    out, _ = step(model, tokens(7))
    torch.testing.assert_close(out, ref(tokens(7)).detach(), rtol=1e-5, atol=1e-6)
    if codes is Codes.STORE:
        assert base.stream.schedule("eval") and base.stream.schedule("train")
        assert all(phase == "fwd" for _, phase, _ in base.stream.schedule("eval"))


def test_a_meta_skeleton_attaches_and_takes_adapters_after(sealed) -> None:  # type: ignore[no-untyped-def]
    model, store, plan = sealed
    with torch.device("meta"):
        skeleton = build_classifier(CFG, CLASSES)
    skeleton.requires_grad_(False)
    StreamedBase(skeleton, store)
    assert isinstance(skeleton.embed, StreamedEmbedding)
    adapted = add_lora(skeleton, rank=4, alpha=8, scheme=AdapterScheme.FEDAVG)
    assert all(p.device.type == "cpu" for p in adapted.parameters())
    # same adapters as the fixture's model: the outputs must match its dequantised twin
    adapted.load_state_dict({k: v for k, v in model.state_dict().items() if "lora_" in k}, strict=False)
    ref = dequantised(model, store, plan)
    with torch.no_grad():
        torch.testing.assert_close(adapted(tokens()), ref(tokens()), rtol=1e-5, atol=1e-6)


def test_frozen_adapters_are_not_sealed_as_base(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = add_lora(build_classifier(CFG, CLASSES), rank=4, alpha=8, scheme=AdapterScheme.FFA)  # A frozen
    store = SealedShardStore.create(tmp_path / "ffa", Kek.generate())
    plan = seal_base(model, store)
    assert not [t.name for t in plan.tensors if "lora_" in t.name]
    StreamedBase(model, store)
    assert isinstance(model.blocks[0].qkv.lora_A["default"], nn.Linear)  # the adapter stays as it is
    step(model, tokens())


def test_fp8_base_streams_too(tmp_path: Path) -> None:
    model = lora_model(seed=3)
    store = SealedShardStore.create(tmp_path / "fp8", Kek.generate())
    plan = seal_base(model, store, ColdFormat.FP8)
    assert store.stat("blocks.0.qkv.weight#r0c0").encoding == "fp8"
    assert store.stat("blocks.0.qkv.bias#r0c0").encoding == "full"
    ref = dequantised(model, store, plan)
    StreamedBase(model, store)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), ref(tokens()), rtol=1e-5, atol=1e-6)


def test_a_store_without_a_base_and_an_unfrozen_module_are_refused(tmp_path: Path) -> None:
    store = SealedShardStore.create(tmp_path / "empty", Kek.generate())
    with pytest.raises(StoreError, match="records no frozen base"):
        StreamedBase(lora_model(), store)
    torch.manual_seed(0)
    with pytest.raises(StoreError, match="freeze the base"):
        seal_base(build_classifier(CFG, CLASSES), store)


def test_put_cold_refuses_non_finite_values_and_stores_nothing(tmp_path: Path) -> None:
    store = SealedShardStore.create(tmp_path / "s", Kek.generate())
    bad = {"a": np.ones((2, 2), np.float32), "b": np.array([[np.inf]], np.float32)}
    with pytest.raises(StoreError, match="shard b"):
        store.put_cold(bad, ColdFormat.INT8)
    assert len(store) == 0
    values = np.linspace(-1, 1, 4, dtype=np.float32).reshape(2, 2)
    (stat,) = store.put_cold({"a": values}, ColdFormat.INT8)
    assert stat.encoding == "int8" and stat.source_digest != stat.digest  # the source is the fp32 values


def test_the_stream_follows_a_changed_order_and_counts_misses() -> None:
    fetched: list[str] = []

    def fetch(name: str) -> np.ndarray:
        fetched.append(name)
        return np.zeros(4, np.float32)

    stream = WeightStream(fetch, lookahead=1)
    order = [("m", "fwd", n) for n in "abcd"]
    for _ in range(3):
        for key in order:
            stream.take(key)
    assert stream.stats.misses == 0 and stream.schedule("m") == order
    stream.take(("m", "fwd", "c"))  # skips ahead: what was fetched for b is dropped
    stream.take(("m", "fwd", "z"))  # not in the schedule: fetched on the spot
    assert stream.stats.misses == 1 and stream.stats.dropped >= 1
    assert fetched[-1] == "z" or fetched[-2] == "z"
    stream.close()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priorities here")
def test_the_prefetch_thread_can_yield_to_the_compute_threads() -> None:
    seen: list[int] = []

    def fetch(name: str) -> np.ndarray:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return np.zeros(1, np.float32)

    stream = WeightStream(fetch, lookahead=1, niceness=5)
    for _ in range(3):
        for name in "ab":
            stream.take(("m", "fwd", name))
    stream.close()
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen[0] == mine  # recorded in the caller's thread
    assert min(mine + 5, 19) in seen[2:]  # fetched ahead in the lowered thread


def test_reread_checks_a_shard_s_digest_on_its_first_read_only(tmp_path: Path) -> None:
    store = SealedShardStore.create(tmp_path / "s", Kek.generate())
    for sid in ("a", "b"):
        store.put(sid, np.arange(6, dtype=np.float32))
        # a catalog digest that does not match the values (as if the values had changed)
        store._cat.entries[sid] = store._cat.entries[sid]._replace(digest="0" * 64)
    with pytest.raises(ShardIntegrityError, match="digest"):
        store.reread("a")  # a first read checks it

    store._digested.add(("b", store.stat("b").version))  # as if a first read had checked it
    assert np.array_equal(store.reread("b"), np.arange(6))  # later ones: the GCM tag alone
    with pytest.raises(ShardIntegrityError, match="digest"):
        store.get("b")  # a plain read checks it every time


def test_held_codes_compute_in_bands_and_look_up_only_the_rows_asked_for(tmp_path: Path) -> None:
    """With codes in memory no full-precision weight is made: a layer computes band by band
    (here bands of 32 rows, so every weight spans several), and a lookup dequantises only the
    bands holding its ids."""
    from fedshard.store.held_codes import HeldStats

    torch.manual_seed(0)
    model = lora_model()
    ref = copy.deepcopy(model)
    store = SealedShardStore.create(tmp_path / "base", Kek.generate())
    plan = seal_base(model, store, ColdFormat.INT8, tile=(32, 64))
    ref = dequantised(ref, store, plan)
    base = StreamedBase(model, store, band_values=32 * 64)
    x = tokens(4)
    out, grads = step(model, x)
    out_ref, grads_ref = step(ref, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-4, atol=1e-6)
    widest = max(t.shape[1] for t in plan.tensors if t.name in base.streamed)
    largest = max(int(np.prod(t.shape)) for t in plan.tensors if t.name in base.streamed)
    assert base._band._array is not None and base._band._array.numel() == 32 * widest < largest

    embedding = next(m for m in model.modules() if isinstance(m, StreamedEmbedding))
    base.held_stats = HeldStats()
    ids = torch.tensor([[0, 1, 2], [31, 5, 0]])  # all in the first band of 32 rows
    with torch.no_grad():
        rows = embedding(ids)
    assert base.held_stats.bands == 1 and rows.shape == (2, 3, embedding.embedding_dim)
    with pytest.raises(IndexError, match="out of range"):
        embedding(torch.tensor([embedding.num_embeddings]))
