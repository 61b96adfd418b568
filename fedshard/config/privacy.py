"""Privacy configuration: DP mechanisms and (ε, δ) budgets. Every default lives here."""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["BudgetConfig", "LayerPolicy", "PrivacyConfig", "RecordDPConfig", "UpdateDPConfig", "stricter"]


_DISTRIBUTED_HELP = (
    "distributed noise under HE: each site adds σ/√(n−1), so any one site's view of an aggregate of ≥ n "
    "sites (its own share subtracted) carries σ; needs residency.encrypt: all and n ≤ federation.min_sites"
)


class LayerPolicy(StrEnum):
    """What building the model does with layers DP-SGD cannot train (BatchNorm, …)."""

    KEEP = "keep"
    """Leave the model as the task builds it (record-level DP off)."""
    CHECK = "check"
    """Refuse such layers."""
    FIX = "fix"
    """Replace them (BatchNorm → GroupNorm)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetConfig(_Model):
    """A privacy budget: the (ε, δ) a site may spend over the whole federation."""

    epsilon: float = Field(gt=0, description="total ε; must be positive")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ; must be below 1/(records at the site)")

    @field_validator("epsilon")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("epsilon must be a finite number")
        return v


def stricter(a: BudgetConfig | None, b: BudgetConfig | None) -> BudgetConfig | None:
    """The stricter of two budgets (each of ε and δ the smaller); either alone when the other is None."""
    if a is None or b is None:
        return a or b
    return BudgetConfig(epsilon=min(a.epsilon, b.epsilon), delta=min(a.delta, b.delta))


class RecordDPConfig(_Model):
    """Record-level DP: DP-SGD at each site (Opacus), protecting every patient's record."""

    enabled: bool = False
    mechanism: str = Field(
        "dpsgd",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
        description="a registered record-level mechanism (fedshard.privacy.mechanisms): dpsgd (flat clipping), "
        "dpsgd-normalized (each record's gradient scaled to the clip), or one of the task's",
    )
    noise_multiplier: float | None = Field(
        None, gt=0, description="fixed σ; leave empty to calibrate σ so the planned rounds spend the budget"
    )
    calibration_rounds: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="the rounds a calibrated σ spends the budget over, when more than the run plans (to stop "
        "early on validation, or to go on later without raising σ); never fewer than the planned rounds",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="per-sample gradient clipping bound")
    accountant: str = Field(
        "prv",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
        description="a registered accountant (fedshard.privacy.accountants): prv, rdp, or one of the task's",
    )
    fix_incompatible_layers: bool = Field(
        True, description="replace layers DP-SGD cannot handle (BatchNorm → GroupNorm) instead of refusing"
    )
    distributed_over: int | None = Field(
        None,
        ge=2,
        description=_DISTRIBUTED_HELP + "; one DP-SGD step per round (training.local_epochs: 1, "
        "training.batch_size: all) so the released update is linear in the noise",
    )
    sample_rate: float | None = Field(
        None,
        gt=0,
        le=1,
        description="each round one DP-SGD step over a Poisson sample of every site's records at this rate "
        "(training.batch_size: all, training.local_epochs: 1): with distributed_over, the rounds are the "
        "pooled data's DP-SGD steps at one rate; leave empty for a round of whole local epochs",
    )


class UpdateDPConfig(_Model):
    """Update-level DP: clip each site's released update and add Gaussian noise,
    protecting the site's whole contribution in a round."""

    enabled: bool = False
    mechanism: str = Field(
        "gaussian",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
        description="a registered update-level mechanism (fedshard.privacy.mechanisms): gaussian, or one of the task's",
    )
    clip_norm: float = Field(1.0, gt=0, description="L2 bound of a site's update")
    noise_multiplier: float = Field(1.0, gt=0, description="σ: noise std is σ × clip_norm")
    distributed_over: int | None = Field(None, ge=2, description=_DISTRIBUTED_HELP)


class PrivacyConfig(_Model):
    """The federation's privacy settings (aggregator side)."""

    record_level: RecordDPConfig = Field(default_factory=RecordDPConfig)
    update_level: UpdateDPConfig = Field(default_factory=UpdateDPConfig)
    budget: BudgetConfig | None = Field(None, description="default budget of every site")

    @property
    def enabled(self) -> bool:
        """True if any DP mechanism is on."""
        return self.record_level.enabled or self.update_level.enabled

    @property
    def shared_noise(self) -> dict[str, int]:
        """``distributed_over`` of each enabled mechanism that shares its noise, by config name
        (``record_level``, ``update_level``)."""
        mechanisms: dict[str, RecordDPConfig | UpdateDPConfig] = {
            "record_level": self.record_level,
            "update_level": self.update_level,
        }
        return {name: m.distributed_over for name, m in mechanisms.items() if m.enabled and m.distributed_over}

    @property
    def shares_needed(self) -> int:
        """How many sites' noise shares every aggregate must hold (1: no distributed noise)."""
        return max(self.shared_noise.values(), default=1)

    @property
    def layer_policy(self) -> LayerPolicy:
        """How the initial model treats layers DP-SGD cannot train (see ``build_initial_model``)."""
        if not self.record_level.enabled:
            return LayerPolicy.KEEP
        return LayerPolicy.FIX if self.record_level.fix_incompatible_layers else LayerPolicy.CHECK

    @model_validator(mode="after")
    def _budget_when_enabled(self) -> PrivacyConfig:
        if self.enabled and self.budget is None:
            raise ValueError("privacy.budget (epsilon, delta) is required when record- or update-level DP is on")
        return self
