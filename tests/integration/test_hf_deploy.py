"""The Hugging Face task deployed: ``fedshard aggregator up`` and three ``fedshard site up``
processes (TLS, SuperNode authentication, mutual-TLS zones on loopback) fine-tune a model folder,
each site streaming its sealed int8 base; a site then exports its adapters from its own state
with its own key (``fedshard export adapter --site-config``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedshard.config import load_federation
from tests.deploy_helpers import adapter_layout, run_deployed
from tests.hf_helpers import hf_options, tiny_model_folder

pytestmark = pytest.mark.slow

SITES = ["charite-berlin", "ap-hp-paris", "mayo-rochester"]
_FEDSHARD = (sys.executable, "-m", "fedshard.cli.main")


def test_a_deployed_hf_federation_trains_adapters_a_site_exports_for_peft(tmp_path: Path) -> None:
    folder = tiny_model_folder((tmp_path / "tiny-bert").resolve())

    options = {"target": "fedshard.tasks.hf:sequence_classification", "options": hf_options(folder)}
    training = {"local_epochs": 1, "batch_size": 16, "learning_rate": 0.005}
    paths = adapter_layout(tmp_path, options, training, SITES, rounds=1)
    config = load_federation(paths["aggregator"])
    run_deployed(tmp_path, paths, SITES)
    summary = json.loads(next((tmp_path / "runs" / "aggregator").glob("run-*/summary.json")).read_text())
    assert summary["engine"] == "deployment" and summary["rounds"] == 1 and not summary["stopped_reason"]
    assert sorted(summary["history"][0]["sites"]) == sorted(SITES)
    for site in SITES:
        assert (tmp_path / "runs" / "sites" / site / "base").is_dir()  # each streamed its sealed base

    out = tmp_path / "adapters"
    export = subprocess.run(
        [*_FEDSHARD, "export", "adapter", "--site-config", str(paths["mayo-rochester"]), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert export.returncode == 0, export.stderr
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from fedshard.assembly.sites import site_model
    from fedshard.task import trained_state

    base = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3)
    loaded = PeftModel.from_pretrained(base, out)
    held, _ = site_model(
        config,
        tmp_path / "runs" / "sites" / "mayo-rochester",
        tmp_path / "keys" / "sites" / "mayo-rochester" / "store.kek",
    )
    trained = trained_state(held)
    exported = dict(loaded.named_parameters())
    assert trained and all(torch.equal(exported[name], value) for name, value in trained.items())  # the site's values
