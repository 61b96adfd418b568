"""The noise a private federation's aggregate really carries, end to end: five sites each
add their share of DP-SGD's noise, encrypt under BFV, a zone sums the ciphertexts with the
coordinator's weights, every site decrypts and applies the mean. With records whose
gradients are exactly zero (``tests.toy_task:silent``) the applied update is that noise
alone, so its spread can be checked against the design: √(n/(n−1)) · σ · C · lr / Σ w per
value (each site adds σ/√(n−1) of it, scaled to its records over its weight)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedshard.aggregation._server_optimizer import ServerOptimizer
from fedshard.config import FederationConfig
from fedshard.simulate.run import simulate

SITES, RECORDS, WIDTH, ROUNDS = 5, 30, 16, 4
SIGMA, CLIP, LR = 5.0, 1.0, 1.0


def _config() -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "shared-noise", "seed": 3, "rounds": ROUNDS, "min_sites": SITES},
            "task": {"target": "tests.toy_task:silent", "options": {"examples": RECORDS, "width": WIDTH}},
            "training": {"local_epochs": 1, "batch_size": "all", "learning_rate": LR},
            "privacy": {
                "record_level": {
                    "enabled": True,
                    "noise_multiplier": SIGMA,
                    "max_grad_norm": CLIP,
                    "distributed_over": SITES,
                },
                "budget": {"epsilon": 10.0, "delta": 1e-5},
            },
            "residency": {"encrypt": "all"},
            "he": {"value_range": 1.0},
            "sharding": {"tile": [8, 8]},
            "zones": [{"name": "eu-central", "region": "EU"}],
            "sites": [{"id": f"site-{i}", "jurisdiction": "EU"} for i in range(SITES)],
        }
    )


def test_the_decrypted_aggregate_carries_the_planned_noise_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied: list[np.ndarray] = []
    apply = ServerOptimizer.apply

    def spy(self: ServerOptimizer, params: dict, delta: dict, state: dict) -> None:
        applied.append(np.concatenate([np.asarray(delta[k], np.float64).ravel() for k in sorted(delta)]))
        apply(self, params, delta, state)

    monkeypatch.setattr(ServerOptimizer, "apply", spy)
    summary = simulate(_config(), tmp_path / "run")

    assert summary["rounds"] == ROUNDS and not summary["stopped_reason"]
    assert len(applied) == SITES * ROUNDS  # every site applies every round's aggregate
    rounds = [applied[r * SITES] for r in range(ROUNDS)]
    for r, update in enumerate(rounds):  # every site applied the same aggregate
        for other in applied[r * SITES + 1 : (r + 1) * SITES]:
            np.testing.assert_array_equal(other, update)
    noise = np.concatenate(rounds)  # ROUNDS × WIDTH² values, each the sites' summed shares
    designed = math.sqrt(SITES / (SITES - 1)) * SIGMA * CLIP * LR / (SITES * RECORDS)
    # 1,024 values: the sample std's relative error is about 2 %; its mean's standard error 3 %
    # of the std. More noise than planned costs accuracy, less would break the guarantee.
    assert np.std(noise) / designed == pytest.approx(1.0, abs=0.1)
    assert abs(np.mean(noise)) < 5 * designed / math.sqrt(noise.size)
