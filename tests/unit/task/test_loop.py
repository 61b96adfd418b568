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
