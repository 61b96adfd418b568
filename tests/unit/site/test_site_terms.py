"""A site's own config is the authority for its privacy: a coordinator's plan may only tighten it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedshard.config import BudgetConfig, PrivacyConfig
from fedshard.errors import PrivacyError, RefusalCode
from fedshard.privacy.accountant import AccountantKind
from fedshard.protocol.messages import PrivacyPlan, RecordPlan, UpdatePlan
from fedshard.site.privacy import SitePrivacy
from fedshard.site.terms import PrivacyTerms

OWN_BUDGET = BudgetConfig(epsilon=3.0, delta=1e-5)


def _terms(*, sigma: float | None = 1.5, clip: float = 1.0, update: bool = True, rounds: int = 10) -> PrivacyTerms:
    config = PrivacyConfig(
        record_level={"enabled": True, "noise_multiplier": sigma, "max_grad_norm": clip, "accountant": "rdp"},
        update_level={"enabled": update, "clip_norm": 0.5, "noise_multiplier": 2.0},
        budget=OWN_BUDGET,
    )
    return PrivacyTerms(config, OWN_BUDGET, rounds)


def _plan(
    *,
    sigma: float | None = 1.5,
    clip: float = 1.0,
    record: bool = True,
    update: UpdatePlan | None = None,
    epsilon: float = 3.0,
    rounds: int = 10,
) -> PrivacyPlan:
    return PrivacyPlan(
        accountant=AccountantKind.PRV,
        epsilon=epsilon,
        delta=1e-5,
        batch_size=16,
        epochs=1,
        record=RecordPlan(noise_multiplier=sigma, max_grad_norm=clip, planned_rounds=rounds) if record else None,
        update=update if update is not None else UpdatePlan(clip_norm=0.5, noise_multiplier=2.0),
    )


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (None, "sent no privacy plan but its own config turns on privacy.record_level and privacy.update_level"),
        (_plan(record=False), "no record-level DP but its own config turns it on"),
        (_plan(sigma=0.1), "record-level σ=0.1, below its own privacy.record_level.noise_multiplier 1.5"),
        (_plan(clip=100.0), "record-level clipping at 100, above its own privacy.record_level.max_grad_norm 1"),
        (_plan(update=UpdatePlan(clip_norm=5.0, noise_multiplier=2.0)), "update-level clipping at 5, above"),
        (_plan(update=UpdatePlan(clip_norm=0.5, noise_multiplier=0.0001)), "update-level σ=0.0001, below"),
    ],
)
def test_a_missing_or_weaker_plan_is_refused_in_one_line(plan: PrivacyPlan | None, says: str) -> None:
    with pytest.raises(PrivacyError, match="a coordinator may only tighten") as info:
        _terms().admit(plan, "charite-berlin")
    message = str(info.value)
    assert says in message and "\n" not in message and message.startswith("site charite-berlin: ")
    assert info.value.code is RefusalCode.PRIVACY


def test_a_stricter_plan_runs_as_asked_with_the_sites_accountant_and_horizon() -> None:
    asked = _plan(sigma=4.0, clip=0.3, update=UpdatePlan(clip_norm=0.1, noise_multiplier=9.0), epsilon=1.0, rounds=3)
    plan = _terms().admit(asked, "s")
    assert plan is not None and plan.record is not None and plan.update is not None
    assert (plan.record.noise_multiplier, plan.record.max_grad_norm) == (4.0, 0.3)
    assert (plan.update.clip_norm, plan.update.noise_multiplier) == (0.1, 9.0)
    assert plan.record.planned_rounds == 10  # never fewer than its own: fewer would calibrate less noise
    assert plan.accountant == AccountantKind.RDP  # its own accountant
    assert plan.epsilon == 1.0  # a smaller budget tightens


def test_training_settings_other_than_the_plan_accounts_are_refused() -> None:
    with pytest.raises(PrivacyError, match=r"trains with batch size 512 for 1 epoch.* accounts batch size 16"):
        _terms().admit(_plan(), "s", batch_size=512, epochs=1)
    assert _terms().admit(_plan(), "s", batch_size=16, epochs=1) is not None


def test_a_site_without_dp_takes_a_plan_that_adds_it_and_none_without() -> None:
    off = PrivacyTerms()
    assert off.admit(None, "s") is None
    plan = off.admit(_plan(), "s")
    assert plan is not None and plan.accountant == AccountantKind.PRV  # nothing of its own to keep


def test_the_coordinator_cannot_raise_a_budget_the_ledger_is_created_with(tmp_path: Path) -> None:
    """Issue 32, item 2: a site whose config sets ε = 3 and no cap kept ε = 1000 from the coordinator."""
    site = SitePrivacy("s", tmp_path, _terms())
    plan = site.admit(_plan(epsilon=1000.0))
    assert plan is not None
    ledger, note = site.open_ledger(plan, num_examples=1000)
    with ledger:
        assert ledger.budget.epsilon == 3.0
    assert "aggregator asked ε=1000; s keeps its cap ε=3" in note


def test_sigma_is_the_largest_of_the_plans_the_sites_and_the_calibrated_one(tmp_path: Path) -> None:
    fixed_own = SitePrivacy("a", tmp_path / "a", _terms(sigma=2.5, update=False))
    plan = fixed_own.admit(_plan(sigma=None, update=None, rounds=1))  # calibrate over 10 rounds (its own)
    assert plan is not None
    ledger, _ = fixed_own.open_ledger(plan, num_examples=64)
    with ledger:
        event = fixed_own.round_events(plan, ledger, 64)[0]  # record level first
    assert event.noise_multiplier >= 2.5

    calibrating = SitePrivacy("b", tmp_path / "b", _terms(sigma=None, update=False))
    plan = calibrating.admit(_plan(sigma=0.01, update=None))  # a fixed σ far below what the budget needs
    assert plan is not None
    ledger, _ = calibrating.open_ledger(plan, num_examples=64)
    with ledger:
        event = calibrating.round_events(plan, ledger, 64)[0]
    assert event.noise_multiplier > 0.5  # calibrated to ε = 3 over 10 rounds, not the 0.01 asked


def test_calibration_rounds_lengthen_the_horizon_on_both_sides_and_never_shorten_it() -> None:
    """``privacy.record_level.calibration_rounds``: a run stopped early on validation (or resumed one
    round at a time) calibrates σ for the rounds it may take, not the ones it has asked for so far."""
    from fedshard.config import FederationConfig
    from fedshard.coordinator._plans import privacy_plan

    def config(rounds: int, calibration: int | None) -> FederationConfig:
        return FederationConfig.model_validate(
            {
                "federation": {"name": "h", "rounds": rounds, "min_sites": 1},
                "task": {"target": "tests.toy_task:task"},
                "privacy": {
                    "record_level": {"enabled": True, "calibration_rounds": calibration},
                    "budget": {"epsilon": 3.0, "delta": 1e-5},
                },
                "zones": [{"name": "eu", "region": "EU", "endpoint": "127.0.0.1:0"}],
                "sites": [{"id": "s", "jurisdiction": "EU"}],
            }
        )

    for rounds, calibration, planned in ((2, 20, 20), (30, 20, 30), (5, None, 5)):
        both = config(rounds, calibration)
        asked = privacy_plan(both, "s")
        assert asked is not None and asked.record is not None and asked.record.planned_rounds == planned
        assert PrivacyTerms.of(both, "s").planned_rounds == planned
    own = PrivacyTerms.of(config(2, 20), "s")  # the coordinator's config plans 2 rounds: the site keeps 20
    shorter = privacy_plan(config(2, None), "s")
    admitted = own.admit(shorter, "s")
    assert admitted is not None and admitted.record is not None and admitted.record.planned_rounds == 20


def test_a_sampled_step_needs_every_record_for_one_epoch_and_the_sites_own_rate() -> None:
    sampled = _plan().model_copy(
        update={"record": RecordPlan(noise_multiplier=1.5, max_grad_norm=1.0, planned_rounds=10, sample_rate=0.25)}
    )
    with pytest.raises(PrivacyError, match=r"sample rate 0.25 but its plan trains batch size 16 for 1 epoch"):
        _terms().admit(sampled, "s")
    whole = sampled.model_copy(update={"batch_size": 0})
    admitted = _terms().admit(whole, "s")
    assert admitted is not None and admitted.record is not None and admitted.record.sample_rate == 0.25
    own = PrivacyConfig(record_level={"enabled": True, "noise_multiplier": 1.5, "sample_rate": 0.5}, budget=OWN_BUDGET)
    with pytest.raises(
        PrivacyError, match=r"sample rate 0.25; its own config's privacy.record_level.sample_rate is 0.5"
    ):
        PrivacyTerms(own, OWN_BUDGET, 10).admit(whole.model_copy(update={"update": None}), "s")
