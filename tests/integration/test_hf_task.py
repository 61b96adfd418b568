"""The Hugging Face task (fedshard.tasks.hf) end to end: a model folder federated on both
engines, its adapters exported in PEFT's format and loaded back by ``peft`` as users load them.

One tiny BERT folder (made and saved by ``transformers``, with the MiniLM's real tokenizer)
serves every test; each run is the smallest that proves its claim.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedshard.assembly.sites import STORE_KEYS_DIR, site_model
from fedshard.config import FederationConfig
from fedshard.simulate.run import Engine, simulate
from fedshard.task import Partition, build_initial_model, load_task, trained_state
from fedshard.tasks.hf.training import score
from tests.hf_helpers import LABELS, SITES, hf_config, tiny_model_folder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FederationConfig, Path, dict[str, Any]]:
    config = hf_config(folder)
    out = tmp_path_factory.mktemp("hf-run")
    return config, out, simulate(config, out)


def _adapter_bytes(config: FederationConfig) -> int:
    task = load_task(config.task.target, dict(config.task.options))
    model = build_initial_model(task, config.federation.seed, config.privacy.layer_policy)
    return sum(t.numel() * t.element_size() for t in trained_state(model).values())


def test_only_the_adapters_and_the_head_leave_a_site(run: tuple[FederationConfig, Path, dict[str, Any]]) -> None:
    config, _, summary = run
    assert summary["rounds"] == 2 and not summary["stopped_reason"]
    for entry in summary["history"]:
        assert entry["bytes_up"] == len(SITES) * _adapter_bytes(config)
    zones = {z["name"]: z for z in summary["zones"]}
    assert set(zones["eu-central"]["shards_by_class"]) == {"personal from EU"}  # EU adapters stay in the EU
    assert set(zones["us-east"]["shards_by_class"]) == {"personal from US"}


def test_exported_adapters_load_in_peft_and_reproduce_the_federated_accuracy(
    run: tuple[FederationConfig, Path, dict[str, Any]], folder: Path, tmp_path: Path
) -> None:
    """Every site's adapters, exported (one by the CLI), loaded by PeftModel.from_pretrained on the
    folder's base, give the site's logits bit for bit and score its test slice as it did: weighted
    as the coordinator weighs sites (their training examples), the run's accuracy exactly."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    config, out, summary = run
    export = [sys.executable, "-m", "fedshard.cli.main", "export", "adapter", str(out), "--site", "charite-berlin"]
    cli = subprocess.run([*export, "--out", str(tmp_path / "charite-berlin")], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "adapter_config.json, adapter_model.safetensors" in cli.stdout
    again = subprocess.run(
        [*export, "--out", str(tmp_path / "charite-berlin")], capture_output=True, text=True
    )  # refused
    assert again.returncode == 2 and "exists and is not empty" in again.stderr.strip().splitlines()[-1]

    from fedshard.tasks.hf.adapter import write_adapter

    task = load_task(config.task.target, dict(config.task.options))
    examples = {s["id"]: s["examples"] for s in summary["sites"]}
    median = float(statistics.median_low(examples.values()))
    weighted, total = 0.0, 0.0
    for index, site in enumerate(s["id"] for s in SITES):
        held, _ = site_model(config, out / "sites" / site, out / STORE_KEYS_DIR / f"{site}.kek")
        if site != "charite-berlin":
            write_adapter(held, tmp_path / site)
        adapter = json.loads((tmp_path / site / "adapter_config.json").read_text())
        assert adapter["r"] == 4 and adapter["task_type"] == "SEQ_CLS" and "classifier" in adapter["modules_to_save"]
        base = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=len(LABELS))
        loaded = PeftModel.from_pretrained(base, tmp_path / site)
        data = task.load_data(Partition(index, len(SITES), config.federation.seed)).test
        ids, mask = torch.from_numpy(data.input_ids[:8]), torch.from_numpy(data.attention_mask[:8])
        held.eval(), loaded.eval()
        with torch.no_grad():
            assert torch.equal(
                held(input_ids=ids, attention_mask=mask).logits, loaded(input_ids=ids, attention_mask=mask).logits
            )
        _, accuracy = score(loaded, data)
        weight = config.aggregation.fixed_weight(examples[site], median)
        weighted, total = weighted + accuracy * weight, total + weight
    assert np.isclose(weighted / total, summary["final_accuracy"], rtol=0, atol=1e-12)


def test_the_flower_engine_runs_it_over_a_sealed_streamed_base(folder: Path, tmp_path: Path) -> None:
    """Flower's simulation engine, each site sealing the frozen BERT int8 in its store and streaming it."""
    config = hf_config(folder, rounds=1, store={"base": "int8"})
    summary = simulate(config, tmp_path / "run", engine=Engine.FLOWER)
    assert summary["engine"] == "flower" and summary["rounds"] == 1 and not summary["stopped_reason"]
    assert summary["history"][0]["bytes_up"] == len(SITES) * _adapter_bytes(config)
    for site in SITES:
        assert (tmp_path / "run" / "sites" / site["id"] / "base").is_dir()  # the sealed base
