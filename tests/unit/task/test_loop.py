"""The shared training loop: a batch larger than ``physical_batch`` is computed in pieces and
stepped once, as the whole batch would be (plainly, and under DP-SGD through Opacus)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedshard.config import FULL_BATCH
from fedshard.privacy.mechanisms import noise_share
from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy, planned_record_event
from fedshard.tasks.loop import fit, sgd

RECORDS, INPUTS, CLASSES = 40, 50, 20


def _logits(net: nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
    return net(inputs[0])  # type: ignore[no-any-return]


def _trained(
    x: torch.Tensor, y: torch.Tensor, physical: int | None, privacy: RecordPrivacy | None = None
) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(INPUTS, CLASSES, bias=False)
    before = model.weight.detach().clone()
    make_private = privacy.make_private if privacy is not None else None
    _, seen = fit(model, [x, y], _logits, 2, RECORDS, 0.5, 3, make_private, optimiser=sgd(), physical_batch=physical)
    assert seen == 2 * RECORDS
    return model.weight.detach() - before


def test_a_batch_in_pieces_steps_as_the_whole_batch() -> None:
    x, y = torch.randn(RECORDS, INPUTS), torch.randint(0, CLASSES, (RECORDS,))
    whole, pieces = _trained(x, y, None), _trained(x, y, 7)
    assert whole.abs().max() > 0
    torch.testing.assert_close(pieces, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share_over", [None, 5])
def test_a_dp_batch_in_pieces_is_one_noisy_step_a_round_of_the_planned_noise(share_over: int | None) -> None:
    """Zero inputs: every gradient is zero, so what moves the weights is the noise alone, added once
    per batch (one step an epoch: the plan's), at the site's share of σ."""
    sigma, clip = 2.0, 1.0
    planned = planned_record_event(RECORDS, FULL_BATCH, 2, sigma)
    assert (planned.steps, planned.sample_rate) == (2, 1.0)
    share = noise_share(share_over)
    privacy = RecordPrivacy(planned, clip, share)
    moved = _trained(torch.zeros(RECORDS, INPUTS), torch.zeros(RECORDS, dtype=torch.int64), 8, privacy)
    privacy.verify()  # exactly the planned steps at the planned rate and σ: nothing else was spent
    unit = 0.5 * clip / RECORDS  # one unit of σ in one step's update; two steps add √2 of it
    assert np.std(moved.numpy()) / unit == pytest.approx(sigma * share * np.sqrt(2), rel=0.15)


def _one_step(x: torch.Tensor, y: torch.Tensor, privacy: RecordPrivacy) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(INPUTS, CLASSES, bias=False)
    before = model.weight.detach().clone()
    fit(model, [x, y], _logits, 1, RECORDS, 0.5, 3, privacy.make_private, optimiser=sgd(), physical_batch=8)
    privacy.verify()  # one step at the planned rate and σ: nothing else was spent
    return model.weight.detach() - before


def test_a_sampled_round_is_one_noisy_step_at_the_planned_rate() -> None:
    """``privacy.record_level.sample_rate``: the round's one step draws a Poisson sample of the records at
    the planned rate (not Opacus's one over the loader's batches, here 1) and averages it over the
    expected sample, rate × records, so its noise is σ·C over that."""
    sigma, clip, rate = 2.0, 1.0, 0.25
    planned = planned_record_event(RECORDS, FULL_BATCH, 1, sigma, rate)
    assert (planned.steps, planned.sample_rate) == (1, rate)
    moved = _one_step(
        torch.zeros(RECORDS, INPUTS), torch.zeros(RECORDS, dtype=torch.int64), RecordPrivacy(planned, clip)
    )
    assert np.std(moved.numpy()) / (0.5 * clip / (rate * RECORDS)) == pytest.approx(sigma, rel=0.15)


def test_a_sampled_step_weighs_its_sample_as_its_share_of_every_record() -> None:
    """At a rate just under 1 every record is drawn (but for one chance in about 10⁵): the step is the
    full batch's over the rate, with no noise to speak of."""
    x, y = torch.randn(RECORDS, INPUTS), torch.randint(0, CLASSES, (RECORDS,))
    rate, clip = 1 - 1e-7, 100.0  # nothing clipped (each record's gradient is about 7 long), σ·C about 1e-7
    full = _one_step(x, y, RecordPrivacy(planned_record_event(RECORDS, FULL_BATCH, 1, 1e-9), clip))
    sampled = _one_step(x, y, RecordPrivacy(planned_record_event(RECORDS, FULL_BATCH, 1, 1e-9, rate), clip))
    torch.testing.assert_close(sampled, full / rate, rtol=1e-4, atol=1e-6)
