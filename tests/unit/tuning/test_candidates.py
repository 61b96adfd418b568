"""What a candidate may change, and the federation each one runs (nothing is run here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshard.config import BudgetConfig, FederationConfig, load_federation
from fedshard.config.loader import parse_model
from fedshard.config.tuning import TuningConfig
from fedshard.errors import ConfigError
from fedshard.privacy.accountant import AccountantKind, calibrate_noise, epsilon
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.tuning import candidate_runs
from fedshard.tuning.budget import split_budget

ROOT = Path(__file__).resolve().parents[3]
DP_HE = ROOT / "configs" / "demo-dp-he.yaml"


def _tuning(*candidates: dict[str, object], **top: object) -> TuningConfig:
    return parse_model(TuningConfig, {"candidates": list(candidates), **top}, "candidates.yaml")


def test_every_candidate_runs_the_same_federation_on_its_share_of_every_budget() -> None:
    base = load_federation(DP_HE)
    tuning = _tuning(
        {"name": "slow", "set": {"training.server_optimizer.learning_rate": 0.02, "federation.rounds": 12}},
        {"name": "fast", "set": {"training.server_optimizer.learning_rate": 0.1, "federation.rounds": 8}},
        selection_share=0.25,
    )
    plan = candidate_runs(base, tuning)
    slow, fast = plan.runs
    assert (slow.config.federation.rounds, fast.config.federation.rounds) == (12, 8)
    assert slow.config.training.server_optimizer.learning_rate == 0.02
    (split,) = set(plan.splits.values())  # five sites of one budget and one round shape
    assert 0.75 * 3.0 < split.training.epsilon < 3.0 and split.training.delta == 1e-5
    for run in (slow, fast):
        config = run.config
        # σ is calibrated over every candidate's rounds, so the candidates together spend the training budget
        assert config.privacy.record_level.calibration_rounds == 20
        assert config.task.options["validation_fraction"] == 0.2
        assert all(config.listed_budget(site.id) == split.training for site in config.sites)
        # what is not the candidate's is the federation's
        assert config.sites == [s.model_copy(update={"budget": split.training}) for s in base.sites]
        assert config.residency == base.residency and config.zones == base.zones


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        ({"residency.encrypt": "none"}, "residency.encrypt may not differ between candidates"),
        ({"privacy.budget.epsilon": 30}, "privacy.budget.epsilon may not differ"),
        ({"sites": []}, "String should match pattern"),
        ({"training.batch_size": 32}, "the same round shape"),
        ({"training.local_epochs": 2}, "the same round shape"),
        ({"task.options.validation_fraction": 0.5}, "on the same records"),
        ({"task.options.fold": 3}, "on the same records"),
        ({"privacy.record_level.noise_multiplier": 0.5}, "may not differ"),
    ],
)
def test_a_candidate_may_not_change_the_federation_its_records_or_its_dp_arithmetic(
    setting: dict[str, object], refusal: str
) -> None:
    with pytest.raises(ConfigError, match=refusal) as caught:
        _tuning({"name": "a", "set": setting}, {"name": "b"})
    assert "\n" not in str(caught.value)


def test_candidates_need_distinct_names_and_there_are_at_least_two() -> None:
    with pytest.raises(ConfigError, match="a appears more than once"):
        _tuning({"name": "a"}, {"name": "a"})
    with pytest.raises(ConfigError, match="at least 2"):
        _tuning({"name": "a"})


def test_a_candidate_that_makes_an_invalid_config_is_named_in_one_line() -> None:
    base = load_federation(DP_HE)
    with pytest.raises(ConfigError, match=r"^candidate b: training\.learning_rate: Input should be greater than 0$"):
        candidate_runs(base, _tuning({"name": "a"}, {"name": "b", "set": {"training.learning_rate": -1}}))
    with pytest.raises(ConfigError, match=r"^candidate a: task\.options: .*hiddn"):
        candidate_runs(base, _tuning({"name": "a", "set": {"task.options.hiddn": [4]}}, {"name": "b"}))


def _record_level(base: FederationConfig, **changes: object) -> FederationConfig:
    record = base.privacy.record_level.model_copy(update=changes)
    return base.model_copy(update={"privacy": base.privacy.model_copy(update={"record_level": record})})


def test_tuning_needs_record_level_dp_with_a_calibrated_sigma() -> None:
    base = load_federation(DP_HE)
    two = _tuning({"name": "a"}, {"name": "b"})
    with pytest.raises(ConfigError, match=r"turn privacy\.record_level on"):
        candidate_runs(_record_level(base, enabled=False), two)
    with pytest.raises(ConfigError, match="noise_multiplier is fixed"):
        candidate_runs(_record_level(base, noise_multiplier=2.0), two)


def test_the_scores_are_as_precise_as_their_share_says_and_the_training_gets_the_rest() -> None:
    budget = BudgetConfig(epsilon=3.0, delta=1e-5)
    one_step = DPEvent(Guarantee.RECORD, 1.0, 1.0, 1)  # a full-batch round
    split = split_budget(budget, 0.1, 4, one_step, 40, AccountantKind.PRV)
    # the scores alone would spend the share, at its share of δ
    scores = DPEvent(Guarantee.RECORD, split.score_sigma, 1.0, 4)
    assert 0.29 < epsilon([scores], 1e-6, AccountantKind.PRV) <= 0.3
    # the training calibrates to nearly all of ε, and everything planned composes within it
    sigma = calibrate_noise(split.training.epsilon, 1e-5, 1.0, 40)
    planned = epsilon([DPEvent(Guarantee.RECORD, sigma, 1.0, 40), scores], 1e-5, AccountantKind.PRV)
    assert planned == pytest.approx(split.planned) and planned <= 3.0
    assert split.training.epsilon > 0.95 * 3.0
