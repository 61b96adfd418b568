"""``fedshard tune`` end to end: real federations (HE, shared DP noise), every site's noisy scores
charged to its tuning ledger, the choice made by those scores alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedshard.assembly.sites import STORE_KEYS_DIR, site_ledger_events
from fedshard.config import load_federation
from fedshard.config.loader import parse_model
from fedshard.config.tuning import TuningConfig
from fedshard.errors import ConfigError
from fedshard.privacy.events import Guarantee
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.tuning import TUNE_FILE, tune
from fedshard.tuning.selection import validation_count

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_tune_runs_each_candidate_and_charges_training_and_scores_to_every_site(tmp_path: Path) -> None:
    base = load_federation(ROOT / "configs" / "demo-dp-he.yaml")
    tuning = parse_model(
        TuningConfig,
        {
            "candidates": [
                {"name": "adam-0.05", "set": {"federation.rounds": 2}},
                {"name": "adam-0.2", "set": {"federation.rounds": 3, "training.server_optimizer.learning_rate": 0.2}},
            ]
        },
        "candidates.yaml",
    )
    planned: list[float] = []
    out = tmp_path / "tune"
    summary = tune(base, tuning, out, on_start=planned.append)

    assert json.loads((out / TUNE_FILE).read_text()) == summary
    first, second = summary["candidates"]
    assert (first["rounds"], second["rounds"]) == (2, 3)
    assert first["sigma"] == second["sigma"]  # one σ, calibrated over both candidates' 5 rounds
    assert first["noise_std"] == second["noise_std"] == planned[0]
    best = max(summary["candidates"], key=lambda c: c["noisy_validation_accuracy"])
    assert summary["chosen"] == best["name"]
    assert Path(summary["chosen_run"]) == out / "candidates" / best["name"]

    # the scores are the validation counts plus noise of the planned size (6 standard deviations)
    for candidate in summary["candidates"]:
        run_dir = out / "candidates" / candidate["name"]
        run = load_federation(run_dir / "federation.yaml")
        assert run.task.options["validation_fraction"] == 0.2  # scored on held-out training records
        counts = [validation_count(run, run_dir, s.id) for s in run.sites]
        exact = sum(c for c, _ in counts) / sum(n for _, n in counts)
        assert abs(candidate["noisy_validation_accuracy"] - exact) < 6 * candidate["noise_std"]
        assert candidate["noisy_validation_accuracy"] != exact

    # every site's tuning ledger: each candidate's training (the events its own ledger holds), then its score
    for site in base.sites:
        with PrivacyLedger(out / "ledgers" / f"{site.id}.sqlite", None) as ledger:
            entries = ledger.entries()
            spent = ledger.spent(Guarantee.RECORD)
        for index, candidate in enumerate(summary["candidates"]):
            run_dir = out / "candidates" / candidate["name"]
            run = load_federation(run_dir / "federation.yaml")
            trained = site_ledger_events(run, run_dir / "sites" / site.id, run_dir / STORE_KEYS_DIR / f"{site.id}.kek")
            assert [e.event for e in entries if e.round == 2 * index] == trained
            assert len(trained) == candidate["rounds"]
            (score,) = [e.event for e in entries if e.round == 2 * index + 1]
            assert (score.sample_rate, score.steps) == (1.0, 1)
        assert all(e.committed for e in entries)
        assert spent == pytest.approx(summary["sites"][site.id]["epsilon_spent"])
        assert 0.9 * 3.0 < spent <= 3.0  # the training had nearly all of it

    with pytest.raises(ConfigError, match="is not empty"):
        tune(base, tuning, out)
