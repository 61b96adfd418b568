"""What accountants compose: the canonical form of a sequence of DP events."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Merged", "quiet"]

Merged = tuple[tuple[float, float, int], ...]
"""Canonical composition: sorted ``(noise_multiplier, sample_rate, steps)`` with distinct ``(σ, q)``."""


@contextmanager
def quiet() -> Iterator[None]:
    """Silence Opacus's expected noise: the RDP "Optimal order" hint and numpy's log(0) at q=1."""
    import numpy as np

    with warnings.catch_warnings(), np.errstate(divide="ignore"):
        warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
        yield
