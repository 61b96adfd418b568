"""Distributed record-level DP: each site adds its share of the DP-SGD noise, and what
protects one site's records in the decrypted aggregate is σ (real Opacus steps)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedshard.config import FULL_BATCH, local_batch
from fedshard.errors import PrivacyError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.mechanisms import noise_share
from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy, planned_record_event
from fedshard.protocol.messages import PrivacyPlan, RecordPlan, UpdatePlan
from fedshard.site.privacy import RoundDP

RECORDS, INPUTS, OUTPUTS = 40, 100, 100  # 10,000 noisy coordinates per release
SIGMA, CLIP, LR = 2.0, 0.5, 1.0


def _release(privacy: RecordPrivacy, optimiser: type[torch.optim.Optimizer] = torch.optim.SGD) -> np.ndarray:
    """One site's released update after one DP-SGD step on records whose gradients are all zero
    (zero inputs): what is left is the site's own noise, −lr · N(0, (σ_added·C)²) / records."""
    model = nn.Linear(INPUTS, OUTPUTS, bias=False)
    before = model.weight.detach().clone()
    loader = DataLoader(TensorDataset(torch.zeros(RECORDS, INPUTS), torch.zeros(RECORDS, OUTPUTS)), batch_size=64)
    net, opt, dl = privacy.make_private(model, optimiser(model.parameters(), lr=LR), loader)
    for xb, yb in dl:
        opt.zero_grad()
        nn.functional.mse_loss(net(xb), yb).backward()
        opt.step()
    privacy.verify()
    return (model.weight.detach() - before).numpy().astype(np.float64).ravel()


def _plan(record_n: int | None = None, update_n: int | None = None, *, update: bool = True) -> PrivacyPlan:
    """A round's privacy plan: DP-SGD at σ (shared over ``record_n``), update-level DP unless ``update`` is off."""
    return PrivacyPlan(
        accountant=AccountantKind.PRV,
        epsilon=3.0,
        delta=1e-5,
        batch_size=64,
        epochs=1,
        record=RecordPlan(noise_multiplier=SIGMA, max_grad_norm=CLIP, planned_rounds=10, distributed_over=record_n),
        update=UpdatePlan(clip_norm=1.0, noise_multiplier=1.0, distributed_over=update_n) if update else None,
    )


def _site(n: int) -> RecordPrivacy:
    planned = planned_record_event(RECORDS, 64, 1, SIGMA)
    return RecordPrivacy(planned, CLIP, noise_share(n), distributed=True)


@pytest.mark.parametrize("n", [2, 5])
def test_each_site_adds_its_share_and_any_one_sites_view_of_the_aggregate_carries_sigma(n: int) -> None:
    unit = LR * CLIP / RECORDS  # one unit of σ in the released update
    releases = [_release(_site(n)) for _ in range(n)]
    tolerance = 0.05  # 10,000 coordinates: the std of a sample std is ≈ 0.7 %
    for release in releases:  # each site's own release: σ/√(n−1)
        assert np.std(release) / unit == pytest.approx(SIGMA / math.sqrt(n - 1), rel=tolerance)
    total = np.sum(releases, axis=0)  # the decrypted sum of n shares: σ·√(n/(n−1))
    assert np.std(total) / unit == pytest.approx(SIGMA * math.sqrt(n / (n - 1)), rel=tolerance)
    for own in releases:  # what a decrypting site cannot subtract (the others' shares): σ, as its ledger accounts
        assert np.std(total - own) / unit == pytest.approx(SIGMA, rel=tolerance)


def test_without_distribution_a_site_adds_all_of_sigma() -> None:
    planned = planned_record_event(RECORDS, 64, 1, SIGMA)
    release = _release(RecordPrivacy(planned, CLIP))
    assert np.std(release) / (LR * CLIP / RECORDS) == pytest.approx(SIGMA, rel=0.05)


def test_distributed_noise_needs_one_sgd_step_per_round() -> None:
    with pytest.raises(PrivacyError, match="one DP-SGD step per round, but this round plans 5") as info:
        RecordPrivacy(planned_record_event(RECORDS, 8, 1, SIGMA), CLIP, 0.5, distributed=True)
    assert "training.batch_size" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(PrivacyError, match=r"needs the task.s optimiser to be torch\.optim\.SGD .*, got Adam"):
        _release(_site(5), torch.optim.Adam)


def test_a_capped_site_adds_its_share_scaled_to_its_records_over_its_weight() -> None:
    """DP-SGD divides by the site's records, the weighted sum multiplies by its weight: a site
    weighted below its records scales its share up so that its noise counts fully in the sum."""
    plan = _plan(record_n=5, update=False)
    events = [planned_record_event(RECORDS, 64, 1, SIGMA)]
    uncapped = RoundDP.of(plan, events, RECORDS, RECORDS, RECORDS).training
    capped = RoundDP.of(plan, events, RECORDS, RECORDS / 4, RECORDS).training
    assert uncapped is not None and capped is not None
    assert uncapped.added_noise_multiplier == pytest.approx(1.0)
    assert capped.added_noise_multiplier == pytest.approx(4.0)
    assert capped.noise_multiplier == SIGMA  # what the ledger accounts is unchanged
    with pytest.raises(PrivacyError, match=r"weighs this site above its number of records"):
        RoundDP.of(
            plan, events, RECORDS, RECORDS * 2, RECORDS * 2
        )  # a weight above the records: its records would be under-protected


def test_a_site_refuses_to_add_less_noise_than_its_own_config_allows() -> None:
    """Whoever sends the plan (a breached coordinator included) cannot shrink a site's noise share."""
    from fedshard.config import BudgetConfig, PrivacyConfig
    from fedshard.site.terms import PrivacyTerms

    budget = BudgetConfig(epsilon=3.0)
    record = {"enabled": True, "max_grad_norm": 1.0}
    update = {"enabled": True, "clip_norm": 1.0, "noise_multiplier": 1.0}
    alone = PrivacyTerms(PrivacyConfig(record_level=record, update_level=update, budget=budget), budget)
    alone.admit(_plan(), "h1")
    with pytest.raises(PrivacyError, match=r"h1: .* over 5 sites; its own config allows no sharing .*record_level"):
        alone.admit(_plan(record_n=5), "h1")
    with pytest.raises(PrivacyError, match=r"update_level\.distributed_over"):
        alone.admit(_plan(update_n=2), "h1")
    shared_config = PrivacyConfig(record_level={**record, "distributed_over": 3}, update_level=update, budget=budget)
    shared = PrivacyTerms(shared_config, budget)
    shared.admit(_plan(record_n=3), "h2")
    shared.admit(_plan(record_n=2), "h2")  # fewer shares: each site adds more noise
    with pytest.raises(PrivacyError, match="its own config allows 3"):
        shared.admit(_plan(record_n=4), "h2")


def test_update_level_shares_scale_to_the_rounds_largest_weight() -> None:
    """Update level: a site's update moves the weighted sum by its weight × clip, so every share is
    scaled to the largest weight of the round (weight_scale / weight ≥ 1)."""
    from fedshard.privacy.mechanisms import Sharing
    from fedshard.privacy.mechanisms.gaussian_update import GaussianUpdate, update_event

    def noised(distributed_over: int | None, weight_ratio: float) -> np.ndarray:
        sharing = Sharing(distributed_over, RECORDS, weight=1.0, largest_weight=weight_ratio)
        run = GaussianUpdate().start(update_event(2.0), 1.0, sharing)
        return run.release({"s": np.zeros(20_000, dtype=np.float32)})["s"]

    assert np.std(noised(5, 1.0)) == pytest.approx(2.0 / 2, rel=0.05)
    assert np.std(noised(5, 3.0)) == pytest.approx(3 * 2.0 / 2, rel=0.05)
    assert np.std(noised(None, 3.0)) == pytest.approx(2.0, rel=0.05)  # alone: all of σ, whatever the weights


def test_a_full_batch_is_one_step_whatever_a_sites_record_count() -> None:
    """``training.batch_size: all`` (FULL_BATCH in the plan): every record in one step, sample rate 1,
    for 40 records or for 1,260, where a fixed batch of 512 would plan three steps and be refused."""
    for records in (RECORDS, 1260):
        event = planned_record_event(records, FULL_BATCH, 1, SIGMA)
        assert (event.steps, event.sample_rate) == (1, 1.0)
        RecordPrivacy(event, CLIP, noise_share(5), distributed=True)  # accepted: one step per round
    with pytest.raises(PrivacyError, match="this round plans 3"):
        RecordPrivacy(planned_record_event(1260, 512, 1, SIGMA), CLIP, noise_share(5), distributed=True)
    assert local_batch(FULL_BATCH, 1260) == 1260 and local_batch(64, 1260) == 64


def test_sites_under_the_same_terms_name_the_same_noise_terms_whatever_their_records_or_weight() -> None:
    events = [planned_record_event(RECORDS, 64, 1, SIGMA)]
    plan = _plan(record_n=3, update=False)
    small = RoundDP.of(plan, events, RECORDS, weight=RECORDS, largest_weight=100.0)
    large = RoundDP.of(plan, events, 100, weight=100.0, largest_weight=100.0)
    terms = small.noise_terms(LR)
    assert terms == large.noise_terms(LR) == f"record dpsgd sigma={SIGMA!r} clip={CLIP!r} n=3 q=1.0 lr={LR!r}"
    # another σ, rate or learning rate is other terms; noise not shared names none
    louder = RoundDP.of(plan, [planned_record_event(RECORDS, 64, 1, 2 * SIGMA)], RECORDS, RECORDS, 100.0)
    assert louder.noise_terms(LR) != terms and small.noise_terms(LR / 2) != terms
    assert RoundDP.of(_plan(update=False), events, RECORDS, RECORDS, 100.0).noise_terms(LR) == ""
