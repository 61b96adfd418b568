"""A small DP federation of the toy task (``tests.toy_task``), shared by the privacy tests: three
sites in three jurisdictions, one EU zone, DP-SGD at record level; ``small`` has a lower budget
of its own (ε 3) than the federation's (ε 8), so it runs out partway through six rounds."""

from __future__ import annotations

from typing import Any

from fedshard.config import FederationConfig

__all__ = ["SITES", "dp_toy"]

SITES = ("big-a", "big-b", "small")


def dp_toy(name: str, *, rounds: int = 6, **privacy: Any) -> FederationConfig:
    """The federation, named ``name``, of ``rounds`` rounds; ``privacy`` overrides keys of its ``privacy`` section."""
    data: dict[str, Any] = {
        "federation": {"name": name, "seed": 5, "rounds": rounds, "min_sites": 2},
        "task": {"target": "tests.toy_task:task", "options": {"examples": 50}},
        "training": {"local_epochs": 1, "batch_size": 10, "learning_rate": 0.05},
        "sharding": {"tile": [4, 4]},
        "privacy": {
            "record_level": {"enabled": True, "noise_multiplier": 1.5, "max_grad_norm": 1.0, "accountant": "rdp"},
            "budget": {"epsilon": 8.0, "delta": 1e-3},
            **privacy,
        },
        "zones": [{"name": "z1", "region": "EU"}],
        "sites": [
            {"id": "big-a", "jurisdiction": "EU"},
            {"id": "big-b", "jurisdiction": "US"},
            {"id": "small", "jurisdiction": "SG", "budget": {"epsilon": 3.0, "delta": 1e-3}},
        ],
    }
    return FederationConfig.model_validate(data)
