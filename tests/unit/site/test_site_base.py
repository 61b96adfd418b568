"""A site's frozen base sealed in <state_dir>/base and streamed (``store.base``; fedshard/site/base.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("peft")

import torch
from torch import nn

from clients.tasks.llm.model import SIZES, AdapterScheme, add_lora, build_classifier
from fedshard.config import FederationConfig
from fedshard.crypto.at_rest import Kek
from fedshard.errors import ShardIntegrityError, StoreError
from fedshard.site._model import HeldModel
from fedshard.site.base import SealedBase
from fedshard.store._shard_io import blob_name
from fedshard.store.sealed_store import SealedShardStore
from fedshard.store.streamed import BASE_META, StreamedLinear

TILE = (64, 64)
IDS = torch.tensor([[5, 9, 13, 2, 0, 0], [7, 7, 1, 0, 0, 0]])


def _build(base_seed: int = 0) -> nn.Module:
    torch.manual_seed(base_seed)
    model = build_classifier(SIZES["tiny"], 3)
    torch.manual_seed(1)
    return add_lora(model, rank=4, alpha=8, scheme=AdapterScheme.FFA)


def _held(root: Path, kek: Kek, fmt: str = "int8", base_seed: int = 0, codes: str = "memory") -> HeldModel:
    return HeldModel(lambda: _build(base_seed), TILE, SealedBase(root, kek, fmt, TILE, codes=codes))


def _logits(model: nn.Module) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out: torch.Tensor = model(IDS)
    return out


def test_the_base_is_sealed_once_and_streamed_with_the_same_genesis(tmp_path: Path) -> None:
    kek = Kek.generate()
    resident = HeldModel(_build, TILE)
    held = _held(tmp_path / "base", kek)

    module = held.module()

    streamed = [m for m in module.modules() if isinstance(m, StreamedLinear)]
    assert streamed and all("weight" not in dict(m.named_parameters(recurse=False)) for m in streamed)
    assert held.root() == resident.root()  # the genesis binds the built base, streamed or not
    assert held.plan.digest == resident.plan.digest  # only the adapters are federated
    assert torch.allclose(_logits(module), _logits(resident.module()), atol=0.05)  # int8, not fp32
    with SealedShardStore.open(tmp_path / "base", kek) as store:
        generation = store.generation
        assert store.get_meta(BASE_META)["format"] == "int8"
    held.close()

    again = _held(tmp_path / "base", kek)  # another process of the same site: attaches, no reseal
    assert torch.equal(_logits(again.module()), _logits(module))
    again.close()
    with SealedShardStore.open(tmp_path / "base", kek) as store:
        assert store.generation == generation


def test_training_through_the_streamed_base_moves_only_the_adapters(tmp_path: Path) -> None:
    held = _held(tmp_path / "base", Kek.generate())
    module = held.module()
    before = held.split()
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.5)
    module.train()
    loss = nn.functional.cross_entropy(module(IDS), torch.tensor([0, 2]))
    loss.backward()
    optimizer.step()
    after = held.split()
    assert before.keys() == after.keys() and all("lora_B" in sid for sid in after)
    assert any(not torch.equal(torch.from_numpy(before[s]), torch.from_numpy(after[s])) for s in after)
    held.close()


def test_a_store_holding_another_base_is_refused_with_one_line(tmp_path: Path) -> None:
    kek = Kek.generate()
    _held(tmp_path / "base", kek).module()
    other = _held(tmp_path / "base", kek, base_seed=3)
    with pytest.raises(StoreError, match=r"holds another frozen base than the task builds.*delete that folder"):
        other.module()


def test_a_new_format_reseals_the_base(tmp_path: Path) -> None:
    kek = Kek.generate()
    _held(tmp_path / "base", kek, "int8").module()
    held = _held(tmp_path / "base", kek, "fp8")
    held.module()
    with SealedShardStore.open(tmp_path / "base", kek) as store:
        assert store.get_meta(BASE_META)["format"] == "fp8"
    held.close()


@pytest.mark.parametrize("codes", ["memory", "store"])
def test_a_tampered_base_blob_stops_the_site_before_it_computes_with_it(tmp_path: Path, codes: str) -> None:
    """Held codes are checked when the process attaches the base; codes read from the store, in the
    forward that needs them. Either way no logit comes from the tampered weight."""
    kek = Kek.generate()
    _held(tmp_path / "base", kek).module()
    with SealedShardStore.open(tmp_path / "base", kek) as store:
        victim = next(sid for sid in store.list() if "ff1.weight" in sid)  # streamed, not resident
        path = Path(store.location) / blob_name(victim, store.stat(victim).version)
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 1
    path.write_bytes(bytes(blob))

    held = _held(tmp_path / "base", kek, codes=codes)
    if codes == "store":
        model = held.module()  # attaches: the weights are read later
        with pytest.raises(ShardIntegrityError):
            _logits(model)
    else:
        with pytest.raises(ShardIntegrityError):
            held.module()
    held.close()


def test_a_streamed_base_needs_the_sealed_store() -> None:
    doc = {
        "task": {"target": "clients.tasks.llm:task"},
        "store": {"encrypt": False, "base": "int8"},
        "zones": [{"name": "z", "region": "EU"}],
        "sites": [{"id": "s", "jurisdiction": "EU"}],
    }
    with pytest.raises(ValueError, match=r"store\.base: int8 keeps the base in the sealed store"):
        FederationConfig.model_validate(doc)
