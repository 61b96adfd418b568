"""Record-level DP through Opacus: planned events, verification, incompatible layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedshard.errors import PrivacyError
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy, check_model, fix_model, planned_record_event


def _train(privacy: RecordPrivacy | None, epochs: int, n: int = 40, batch: int = 8) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    loader = DataLoader(TensorDataset(torch.randn(n, 3), torch.randn(n)), batch_size=batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    net, o, dl = (model, opt, loader) if privacy is None else privacy.make_private(model, opt, loader)
    for _ in range(epochs):
        for xb, yb in dl:
            o.zero_grad()
            nn.functional.mse_loss(net(xb).squeeze(1), yb).backward()
            o.step()
    return model


def test_planned_event_follows_opacus_poisson_loader() -> None:
    event = planned_record_event(num_examples=114, batch_size=16, epochs=2, noise_multiplier=1.3)
    assert event == DPEvent(Guarantee.RECORD, 1.3, 1 / 8, 16)
    with pytest.raises(PrivacyError):
        planned_record_event(0, 16, 1, 1.0)


def test_training_through_make_private_spends_exactly_the_plan() -> None:
    planned = planned_record_event(40, 8, 3, 1.1)
    privacy = RecordPrivacy(planned, max_grad_norm=1.0)
    _train(privacy, epochs=3)
    privacy.verify()
    assert privacy.spent() == planned


def test_training_without_make_private_is_refused() -> None:
    privacy = RecordPrivacy(planned_record_event(40, 8, 1, 1.1), max_grad_norm=1.0)
    _train(None, epochs=1)
    with pytest.raises(PrivacyError, match=r"did not train through RecordPrivacy\.make_private"):
        privacy.verify()


def test_more_steps_than_reserved_are_refused() -> None:
    privacy = RecordPrivacy(planned_record_event(40, 8, 1, 1.1), max_grad_norm=1.0)
    _train(privacy, epochs=2)
    with pytest.raises(PrivacyError, match="the ledger reserved 5 steps"):
        privacy.verify()


def test_dp_noise_is_not_reproducible_from_seeds() -> None:
    """Two identically seeded runs differ: the noise comes from OS entropy."""
    a = _train(RecordPrivacy(planned_record_event(40, 8, 1, 1.0), 1.0), epochs=1)
    b = _train(RecordPrivacy(planned_record_event(40, 8, 1, 1.0), 1.0), epochs=1)
    assert not torch.equal(a[0].weight, b[0].weight)


def test_batchnorm_is_refused_or_fixed() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with pytest.raises(PrivacyError, match="fix_incompatible_layers") as info:
        check_model(model)
    assert "\n" not in str(info.value)
    fixed = fix_model(model)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in fixed.modules())
    check_model(fixed)


def test_a_model_with_nothing_to_fix_is_returned_as_it_is() -> None:
    class Local(nn.Module):  # defined in a function: pickle cannot name it (Opacus's fix pickles a clone)
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 1)

    model = Local()
    assert fix_model(model) is model


def test_make_private_twice_in_a_round_is_refused() -> None:
    privacy = RecordPrivacy(planned_record_event(40, 8, 1, 1.0), 1.0)
    _train(privacy, epochs=1)
    with pytest.raises(PrivacyError, match="called twice"):
        _train(privacy, epochs=1)
