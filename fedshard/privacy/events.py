"""Immutable DP events: what a site released, in a form an accountant can compose.

A :class:`DPEvent` says "a Poisson-subsampled Gaussian mechanism with noise
multiplier σ and sample rate q ran ``steps`` times", with the unit it protects
(:class:`Guarantee`). It is the row the privacy ledger stores and the history entry
an Opacus accountant composes: ``(noise_multiplier, sample_rate, steps)``.

Stability contract
------------------
Events outlive the code that wrote them (a site's ledger is kept for years), so,
as in Google's ``dp_accounting``:

* **A stored event never changes meaning.** The fields of the mechanism named
  ``"poisson_subsampled_gaussian"`` mean, for as long as fedshard exists: each of
  ``steps`` steps includes every unit (record or update, see :class:`Guarantee`)
  independently with probability ``sample_rate``, clips each unit's contribution to
  L2 norm ``C`` and adds Gaussian noise of standard deviation ``noise_multiplier * C``
  to the sum (add/remove-one-unit adjacency).
* **New mechanisms get new names.** Fixed-size sampling, Laplace noise or a different
  adjacency will be a new ``mechanism`` value (and, if needed, new fields); the meaning
  of an existing name or field is never widened or reinterpreted.
* **Readers refuse what they do not know.** :meth:`DPEvent.from_dict` rejects an unknown
  mechanism, guarantee or key with :class:`~fedshard.errors.PrivacyError` instead of
  guessing, so an old fedshard never under-counts an event written by a newer one.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fedshard.errors import PrivacyError

__all__ = ["MECHANISM", "DPEvent", "Guarantee"]

MECHANISM = "poisson_subsampled_gaussian"
"""Name of the only mechanism a :class:`DPEvent` describes (see the stability contract)."""

_KEYS = frozenset({"mechanism", "guarantee", "noise_multiplier", "sample_rate", "steps"})


class Guarantee(StrEnum):
    """The unit a DP event protects; ε of different guarantees never add up."""

    RECORD = "record"
    """Record-level DP-SGD: protects each patient (one training example) at a site."""

    UPDATE = "update"
    """Update-level DP: protects the site's whole contribution to a round."""


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PrivacyError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class DPEvent:
    """A Poisson-subsampled Gaussian mechanism composed ``steps`` times.

    Parameters
    ----------
    guarantee:
        What one unit of the mechanism is: a record (DP-SGD) or a site's update.
    noise_multiplier:
        σ, the noise standard deviation divided by the clipping norm; finite, > 0.
    sample_rate:
        q, the probability each unit is included in a step; 0 < q <= 1.
    steps:
        How many times the mechanism ran; >= 1.

    Raises
    ------
    PrivacyError
        If a value is out of range (one line naming it).
    """

    guarantee: Guarantee
    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        # Coerce once here so equal events compare (and cache) equal: DPEvent("record", 1, ...)
        # and DPEvent(Guarantee.RECORD, 1.0, ...) are the same event.
        try:
            guarantee = Guarantee(self.guarantee)
        except ValueError:
            known = ", ".join(g.value for g in Guarantee)
            raise PrivacyError(f"unknown DP guarantee {self.guarantee!r}: use one of {known}") from None
        sigma = _number("noise_multiplier", self.noise_multiplier)
        if not (math.isfinite(sigma) and sigma > 0):
            raise PrivacyError(f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}")
        q = _number("sample_rate", self.sample_rate)
        if not (0 < q <= 1):
            raise PrivacyError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, numbers.Integral) or self.steps < 1:
            raise PrivacyError(f"steps must be an integer >= 1, got {self.steps!r}")
        object.__setattr__(self, "guarantee", guarantee)
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "sample_rate", q)
        object.__setattr__(self, "steps", int(self.steps))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, tagged with the mechanism name.

        Returns
        -------
        dict
            ``{"mechanism", "guarantee", "noise_multiplier", "sample_rate", "steps"}``.
        """
        return {
            "mechanism": MECHANISM,
            "guarantee": self.guarantee.value,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DPEvent:
        """Read an event written by :meth:`to_dict`.

        Parameters
        ----------
        data:
            The mapping; ``mechanism`` must be present and known, no other keys allowed.

        Returns
        -------
        DPEvent

        Raises
        ------
        PrivacyError
            If the mechanism, a key or a value is unknown or invalid: an event this
            version cannot read is refused, never guessed at.
        """
        if not isinstance(data, dict):
            raise PrivacyError(f"a DP event must be a mapping, got {type(data).__name__}")
        mechanism = data.get("mechanism")
        if mechanism != MECHANISM:
            raise PrivacyError(
                f"unknown DP event mechanism {mechanism!r}: this fedshard reads only {MECHANISM!r}; upgrade fedshard"
            )
        unknown = sorted(set(data) - _KEYS)
        missing = sorted(_KEYS - set(data))
        if unknown or missing:
            raise PrivacyError(f"DP event has unknown keys {unknown} / missing keys {missing}; upgrade fedshard")
        return cls(
            guarantee=data["guarantee"],
            noise_multiplier=data["noise_multiplier"],
            sample_rate=data["sample_rate"],
            steps=data["steps"],
        )
