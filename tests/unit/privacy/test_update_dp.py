"""Update-level DP: clipping the whole update and adding Gaussian noise."""

from __future__ import annotations

import numpy as np
import pytest

from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms.gaussian_update import clip_and_noise, update_event


def _norm(update: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.square(v.astype(np.float64)).sum() for v in update.values())))


def test_large_updates_are_clipped_jointly_to_the_bound() -> None:
    update = {"a": np.full((10, 10), 3.0, np.float32), "b": np.full(5, -4.0, np.float32)}
    noised, norm = clip_and_noise(update, clip_norm=2.0, noise_multiplier=1e-9, rng=np.random.default_rng(0))
    assert norm == pytest.approx(_norm(update))
    assert _norm(noised) == pytest.approx(2.0, rel=1e-5)
    # direction kept
    assert noised["a"][0, 0] / noised["b"][0] == pytest.approx(3.0 / -4.0, rel=1e-4)
    assert noised["a"].dtype == np.float32


def test_small_updates_are_not_scaled() -> None:
    update = {"a": np.full(4, 0.1, np.float32)}
    noised, _ = clip_and_noise(update, clip_norm=10.0, noise_multiplier=1e-9, rng=np.random.default_rng(0))
    np.testing.assert_allclose(noised["a"], update["a"], rtol=1e-6)


def test_noise_has_std_sigma_times_clip() -> None:
    update = {"a": np.zeros(200_000, np.float32)}
    noised, _ = clip_and_noise(update, clip_norm=2.0, noise_multiplier=1.5, rng=np.random.default_rng(1))
    assert float(noised["a"].std()) == pytest.approx(3.0, rel=0.02)
    assert abs(float(noised["a"].mean())) < 0.05


def test_default_noise_is_fresh_each_call() -> None:
    update = {"a": np.zeros(8, np.float32)}
    first, _ = clip_and_noise(update, 1.0, 1.0)
    second, _ = clip_and_noise(update, 1.0, 1.0)
    assert not np.array_equal(first["a"], second["a"])


def test_update_event() -> None:
    assert update_event(0.8) == DPEvent(Guarantee.UPDATE, 0.8, 1.0, 1)
