"""The LLM task deployed: ``fedshard aggregator up`` and three ``fedshard site up`` processes
(TLS, SuperNode authentication, mutual-TLS zones on loopback), each site sealing its frozen
base in ``<state_dir>/base`` and streaming it through training (``store.base: int8``).

The base is pretrained once, in the test's process, into a cache folder every process
shares (an absolute ``cache_dir``): the site processes and the aggregator only load it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedshard.config import load_federation
from fedshard.task import build_initial_model, load_task, trained_state
from tests.deploy_helpers import adapter_layout, run_deployed
from tests.llm_helpers import SMALL

pytestmark = pytest.mark.slow

SITES = ["charite-berlin", "ap-hp-paris", "mayo-rochester"]
ROUNDS = 2


@pytest.fixture(scope="module")
def base_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An absolute cache folder holding the pretrained tiny base."""
    cache = tmp_path_factory.mktemp("llm-base").resolve()
    task = load_task("clients.tasks.llm:task", _options(cache))
    task.base()  # type: ignore[attr-defined]
    assert list(cache.glob("llm-base-*.safetensors"))
    return cache


def _options(cache: Path) -> dict[str, Any]:
    return {"size": "tiny", "cache_dir": str(cache), "pretrain_epochs": 1, **SMALL}


def test_deployed_sites_stream_their_sealed_base_and_release_adapters_only(tmp_path: Path, base_cache: Path) -> None:
    task_section = {"target": "clients.tasks.llm:task", "options": _options(base_cache)}
    training = {"local_epochs": 1, "batch_size": 64, "learning_rate": 0.003}
    paths = adapter_layout(tmp_path, task_section, training, SITES, ROUNDS)
    config = load_federation(paths["aggregator"])
    assert config.store.base == "int8" and not config.privacy.enabled and not config.residency.encrypting
    task = load_task(config.task.target, dict(config.task.options))
    adapter_bytes = sum(
        t.numel() * t.element_size() for t in trained_state(build_initial_model(task, config.federation.seed)).values()
    )
    run_deployed(tmp_path, paths, SITES)

    run_dir = next((tmp_path / "runs" / "aggregator").glob("run-*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["engine"] == "deployment" and summary["rounds"] == ROUNDS, summary
    assert not summary["stopped_reason"]
    for entry in summary["history"]:
        assert sorted(entry["sites"]) == sorted(SITES) and not entry["refused"], entry
        assert entry["bytes_up"] == len(SITES) * adapter_bytes  # adapters only: the base never leaves a site
    assert 0.4 < summary["final_accuracy"] <= 1.0
    zones = {z["name"]: z for z in summary["zones"]}
    shards = len(_plan(config))
    assert zones["eu-central"]["shards_by_class"] == {"personal from EU": 2 * ROUNDS * shards}
    assert zones["us-east"]["shards_by_class"] == {"personal from US": ROUNDS * shards}
    for site in SITES:
        state = tmp_path / "runs" / "sites" / site
        _assert_sealed_base(state / "base", tmp_path / "keys" / "sites" / site / "store.kek")
        assert (state / "shards").is_dir()


def _plan(config: Any) -> Any:
    from fedshard.assembly.routing import model_classes

    return model_classes(config)[0]


def _assert_sealed_base(root: Path, kek_file: Path) -> None:
    """``root`` is a sealed store holding the site's frozen base, its Linear and Embedding weights int8."""
    from fedshard.crypto.at_rest import load_kek
    from fedshard.store.sealed_store import SealedShardStore
    from fedshard.store.streamed import BASE_META

    assert root.is_dir() and any(root.iterdir())
    store = SealedShardStore.open(root, load_kek(kek_file, store_root=root))
    try:
        doc = store.get_meta(BASE_META)
    finally:
        store.close()
    assert doc is not None and doc["format"] == "int8"
    assert any(name.endswith("qkv.weight") for name in doc["streamed"]) and "embed.weight" in doc["streamed"]
