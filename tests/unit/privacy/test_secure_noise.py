"""DP-SGD noise from a cryptographically secure source (fedshard.privacy.secure_noise)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy, planned_record_event
from fedshard.privacy.secure_noise import SecureGaussian


def test_the_noise_is_gaussian_with_the_asked_deviation_and_never_repeats() -> None:
    draws = SecureGaussian().normal(2.0, 400_000)
    assert abs(draws.mean()) < 0.02 and draws.std() == pytest.approx(2.0, rel=0.01)
    z = draws / draws.std()
    assert np.mean(z**4) == pytest.approx(3.0, rel=0.03)  # a normal's kurtosis: not a uniform's or a sum's tails
    assert np.mean(np.abs(z) > 3) == pytest.approx(0.0027, rel=0.15)
    # a fresh key per source: two sources (two rounds) share no draw, whatever torch's seed
    torch.manual_seed(0)
    a = SecureGaussian().normal(1.0, 1000)
    torch.manual_seed(0)
    b = SecureGaussian().normal(1.0, 1000)
    assert not np.intersect1d(a, b).size


def test_the_source_never_runs_out_whatever_the_os_hands_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """ChaCha20's block counter starts at 0, whatever os.urandom returns (a random start once let the
    32-bit counter overflow mid-training in a long DP run: cryptography refuses to wrap it), and a
    source that has used up a key's keystream takes a fresh key and goes on."""
    monkeypatch.setattr("fedshard.privacy.secure_noise.os.urandom", lambda n: b"\xff" * n)
    assert SecureGaussian().normal(1.0, 10_000).shape == (10_000,)  # counter 0xffffffff: one block, then refused
    monkeypatch.undo()

    fresh = SecureGaussian._fresh
    keys: list[object] = []
    monkeypatch.setattr(SecureGaussian, "_fresh", staticmethod(lambda: keys.append(fresh()) or keys[-1]))
    source = SecureGaussian()
    source.keystream_bytes = source._left = 1000  # a key's stream, made small
    for _ in range(5):
        draws = source.normal(1.0, 300)  # 4 normals of 300, each 2 × 150 uniforms of 8 bytes: 9,600 bytes
        assert draws.shape == (300,) and np.isfinite(draws).all()
    assert len(keys) == 5 * 9_600 // 1000  # a key per 1,000 bytes drawn
    assert np.unique(source.normal(1.0, 5000)).size == 5000


def test_dp_sgd_adds_the_secure_noise_at_sigma_times_the_clip_and_says_nothing_about_pilots(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The optimiser make_private returns adds fedshard's noise; the 'not for production' warning is gone."""
    sigma, clip = 4.0, 0.5
    privacy = RecordPrivacy(planned_record_event(64, 64, 1, sigma), max_grad_norm=clip)
    model = nn.Linear(2_000, 1, bias=False)
    nn.init.zeros_(model.weight)
    loader = DataLoader(TensorDataset(torch.zeros(64, 2_000), torch.zeros(64)), batch_size=64)
    with caplog.at_level(logging.WARNING):
        net, optimiser, dl = privacy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0), loader)
    assert getattr(optimiser, "fedshard_secure_noise", False) is True
    assert not [r for r in caplog.records if "production" in r.getMessage() or "generator" in r.getMessage()]
    for xb, yb in dl:  # zero inputs: zero gradients, so the step moves the weights by the noise alone
        optimiser.zero_grad()
        nn.functional.mse_loss(net(xb).squeeze(1), yb).backward()
        optimiser.step()
    moved = model.weight.detach().numpy().ravel()
    batch = optimiser.expected_batch_size  # the noise is divided by it (loss reduction "mean")
    assert moved.std() == pytest.approx(sigma * clip / batch, rel=0.1)
    privacy.verify()
    assert privacy.planned.noise_multiplier == sigma
