"""DP-SGD with each record's gradient normalised to the clip (fedshard.privacy.clipping,
mechanism ``dpsgd-normalized``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedshard.errors import PrivacyError
from fedshard.privacy.clipping import STABILITY, install
from fedshard.privacy.events import Guarantee
from fedshard.privacy.mechanisms import Sharing, mechanism
from fedshard.privacy.mechanisms.dpsgd import planned_record_event


def _one_step(name: str, scales: list[float], clip: float) -> torch.Tensor:
    """The summed gradient of one noiseless full batch whose records' gradients have norms ``scales``."""
    n = len(scales)
    privacy = mechanism(name, Guarantee.RECORD).start(
        planned_record_event(n, n, 1, 1e-9), clip, Sharing(None, n, float(n), float(n))
    )
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    # loss = -w·x: record i's gradient is -x_i, norm |x_i|
    x = torch.tensor(scales).reshape(n, 1)
    loader = DataLoader(TensorDataset(x), batch_size=n)
    net, optimiser, dl = privacy.training.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0), loader)
    for (xb,) in dl:
        optimiser.zero_grad()
        (-net(xb)).mean().backward()  # Opacus takes the loss as a mean: record i's gradient is -x_i
        optimiser.step()  # w = 0 - (the summed clipped gradients -x_i, noise ~0) / batch
    privacy.verify()
    return model.weight.detach()[0, 0] * optimiser.expected_batch_size


def test_normalised_records_all_count_at_the_clip_where_flat_clipping_keeps_them_small() -> None:
    scales, clip = [0.01, 0.1, 1.0, 10.0], 2.0
    flat = _one_step("dpsgd", scales, clip)
    normed = _one_step("dpsgd-normalized", scales, clip)
    assert flat.item() == pytest.approx(0.01 + 0.1 + 1.0 + 2.0, rel=1e-4)  # min(|g|, C) each
    expected = sum(clip * s / (s + STABILITY) for s in scales)  # C·|g|/(|g|+γ) each, every one below C
    assert normed.item() == pytest.approx(expected, rel=1e-4)
    assert normed.item() < len(scales) * clip  # no record counts for more than the clip


def test_a_coordinator_cannot_switch_a_site_between_flat_and_normalised_clipping() -> None:
    from fedshard.config import BudgetConfig, PrivacyConfig
    from fedshard.privacy.accountant import AccountantKind
    from fedshard.protocol.messages import PrivacyPlan, RecordPlan
    from fedshard.site.terms import PrivacyTerms

    budget = BudgetConfig(epsilon=3.0)
    own = PrivacyConfig(record_level={"enabled": True, "mechanism": "dpsgd-normalized"}, budget=budget)
    terms = PrivacyTerms(own, budget)

    def plan(name: str) -> PrivacyPlan:
        record = RecordPlan(mechanism=name, noise_multiplier=1.0, max_grad_norm=1.0, planned_rounds=3)
        return PrivacyPlan(
            accountant=AccountantKind.RDP, epsilon=3.0, delta=1e-5, batch_size=8, epochs=1, record=record
        )

    assert terms.admit(plan("dpsgd-normalized"), "h1") is not None
    with pytest.raises(PrivacyError, match=r"h1: .*mechanism 'dpsgd'; its own config names 'dpsgd-normalized'"):
        terms.admit(plan("dpsgd"), "h1")


def test_an_optimiser_that_is_not_opacus_is_refused() -> None:
    with pytest.raises(PrivacyError, match="dpsgd-normalized"):
        install(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0))
