"""Parts of a task's own, as a task would register them (one class each), shared by the tests
that show a new server optimiser, accountant or DP mechanism is one file and one registration."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from fedshard.aggregation.server_rules import Hyper, Slots
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms import RoundShape, Sharing
from fedshard.privacy.mechanisms.gaussian_update import update_event
from fedshard.privacy.secure_noise import SecureGaussian

__all__ = ["PerTensorGaussian", "PerTensorNoise", "SignMomentum", "ZeroConcentrated"]


class SignMomentum:
    """A toy rule of a task's own: m ← β₁ m + Δ; θ ← θ + η sign(m)."""

    name = "sign-momentum"

    def step(self, delta: np.ndarray, slots: Slots, hyper: Hyper) -> np.ndarray:
        m = slots.get("m") * hyper.beta1 + delta
        slots.set("m", m)
        step: np.ndarray = np.sign(m) * hyper.learning_rate
        return step


class ZeroConcentrated:
    """A toy accountant of a test's own: Gaussian zCDP without subsampling amplification
    (ρ = Σ steps / 2σ², ε = ρ + 2√(ρ ln 1/δ)): a valid, loose bound, and one class."""

    name = "zcdp"
    opacus_name: str | None = None  # Opacus cannot calibrate for it: fedshard bisects

    def epsilon(self, merged: tuple[tuple[float, float, int], ...], delta: float) -> float:
        import math

        rho = sum(steps / (2 * sigma**2) for sigma, _, steps in merged)
        return rho + 2 * math.sqrt(rho * math.log(1 / delta))


class PerTensorNoise:
    """One round of :class:`PerTensorGaussian`."""

    training = None
    released: ClassVar[list[float]] = []  # what each release's norm was before the noise, for tests

    def __init__(self, clip: float, added: float) -> None:
        self.clip, self.added = clip, added

    def verify(self) -> None:
        """Nothing to check before release."""

    def release(self, update: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each of the ``k`` tensors clipped to ``clip/√k`` (so the whole update stays within
        ``clip``), then Gaussian noise of ``added × clip``."""
        bound = self.clip / math.sqrt(len(update))
        out, clipped = {}, 0.0
        for name, values in update.items():
            norm = float(np.linalg.norm(values.astype(np.float64)))
            scaled = values * (min(1.0, bound / norm) if norm > 0 else 1.0)
            clipped += float(np.square(scaled, dtype=np.float64).sum())
            noise = SecureGaussian().normal(self.added * self.clip, values.size).reshape(values.shape)
            out[name] = (scaled + noise).astype(values.dtype)
        PerTensorNoise.released.append(math.sqrt(clipped))
        return out


class PerTensorGaussian:
    """A task's own update-level mechanism: per-tensor clipping, the Gaussian mechanism's cost."""

    name = "per-tensor"
    guarantee = Guarantee.UPDATE

    def event(self, shape: RoundShape, noise_multiplier: float) -> DPEvent:
        return update_event(noise_multiplier)

    def start(self, planned: DPEvent, clip: float, sharing: Sharing) -> PerTensorNoise:
        return PerTensorNoise(clip, planned.noise_multiplier * sharing.share())
