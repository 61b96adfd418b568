"""The tiny LLM federation the LLM task's integration tests share (clients/tasks/llm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshard.config import FederationConfig
from fedshard.task import build_initial_model, load_task, trained_state

SITES = [
    {"id": "charite-berlin", "jurisdiction": "EU"},
    {"id": "ap-hp-paris", "jurisdiction": "EU"},
    {"id": "mayo-rochester", "jurisdiction": "US"},
]
"""Two EU sites (a regional EU adapter) and one US site."""


SMALL = {"private_examples": 600, "test_fraction": 0.03}
"""A few hundred private examples to train on, about a thousand to score: what the tests need."""


def llm_config(cache: Path, options: dict[str, Any] | None = None, **sections: Any) -> FederationConfig:
    """The tiny LLM task (base pretrained 1 epoch, cached in ``cache``) over :data:`SITES` and two
    zones, 2 rounds, on :data:`SMALL` data; ``options`` add task options, ``sections`` replace
    top-level sections."""
    task_options = {"size": "tiny", "cache_dir": str(cache), "pretrain_epochs": 1, **SMALL, **(options or {})}
    return FederationConfig.model_validate(
        {
            "federation": {"name": "llm", "seed": 7, "rounds": 2, "min_sites": 3},
            "task": {"target": "clients.tasks.llm:task", "options": task_options},
            "training": {"local_epochs": 1, "batch_size": 64, "learning_rate": 0.003},
            "sharding": {"tile": [64, 64]},
            "zones": [
                {"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:0"},
                {"name": "us-east", "region": "US", "endpoint": "127.0.0.1:0"},
            ],
            "reducing_zone": "eu-central",
            "sites": SITES,
            **sections,
        }
    )


def adapter_bytes(config: FederationConfig) -> int:
    """Bytes of the tensors the federation trains (the adapters): what a site releases per round."""
    task = load_task(config.task.target, dict(config.task.options))
    model = build_initial_model(task, config.federation.seed, config.privacy.layer_policy)
    return sum(t.numel() * t.element_size() for t in trained_state(model).values())
