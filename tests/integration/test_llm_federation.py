"""The LLM task end to end: LoRA adapters over a frozen, centrally pretrained base.

Only the adapters are federated: the shard plan holds them alone, sites release
adapter bytes only (the base's released bytes are 0), the detectors classify them
``personal`` (EU sites' adapters reduced in the EU as a regional aggregate), and the
genesis version binds the frozen base (sites on another base would start elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedshard.assembly.routing import explain_routes, model_classes
from fedshard.config import FederationConfig
from fedshard.simulate.run import simulate
from fedshard.task import build_initial_model, frozen_state, load_task, trained_state
from tests.llm_helpers import SITES, llm_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm-base")


def _config(cache: Path, **task: Any) -> FederationConfig:
    return llm_config(cache, task)


def test_only_adapters_are_federated_and_they_are_personal(base_cache: Path) -> None:
    config = _config(base_cache)
    plan, classes = model_classes(config)
    assert plan.tensors and all("lora_B" in t.name for t in plan.tensors)  # FFA: A frozen with the base
    assert {c.shard_class for c in classes.values()} == {"personal"}
    routes = explain_routes(config, "charite-berlin")
    assert {(r.shard_class, r.zone, r.aggregate.group) for r in routes} == {("personal", "eu-central", "regional/EU")}


@pytest.fixture(scope="module")
def two_rounds(base_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of the tiny LLM federation's two rounds."""
    return simulate(_config(base_cache), tmp_path_factory.mktemp("two-rounds"))


def test_a_federated_round_releases_adapter_bytes_only(base_cache: Path, two_rounds: dict[str, Any]) -> None:
    config = _config(base_cache)
    task = load_task(config.task.target, dict(config.task.options))
    model = build_initial_model(task, config.federation.seed)
    adapter_bytes = sum(t.numel() * t.element_size() for t in trained_state(model).values())
    base_bytes = sum(t.numel() * t.element_size() for t in frozen_state(model).values())
    assert base_bytes > 10 * adapter_bytes > 0

    summary = two_rounds
    assert summary["rounds"] == 2 and not summary["stopped_reason"]
    for entry in summary["history"]:
        assert entry["bytes_up"] == len(SITES) * adapter_bytes  # base bytes released: 0
    assert 0.4 < summary["final_accuracy"] <= 1.0
    zones = {z["name"]: z for z in summary["zones"]}
    shards = len(model_classes(config)[0])
    assert zones["eu-central"]["shards_by_class"] == {"personal from EU": 2 * 2 * shards}  # 2 EU sites, 2 rounds
    assert zones["us-east"]["shards_by_class"] == {"personal from US": 2 * shards}


def test_another_base_starts_from_another_version(base_cache: Path, two_rounds: dict[str, Any], tmp_path: Path) -> None:
    """The genesis version binds the frozen base. (That the Flower engine runs the same rounds as
    the in-process one is shown once, for every task alike, by tests/integration/test_flower_simulation.py.)"""
    other = _config(base_cache, pretrain_lr=2e-3).model_copy(update={"federation": _rounds(1)})
    assert simulate(other, tmp_path / "other")["genesis_version"] != two_rounds["genesis_version"]


def _rounds(n: int) -> Any:
    from fedshard.config._models import FederationSettings

    return FederationSettings(name="llm", seed=7, rounds=n, min_sites=3)
