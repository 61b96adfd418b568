"""``fedshard tune``'s candidates file: the settings to choose among on a private validation split.

A candidate names the settings it changes in the federation config, by dotted path
(``training.server_optimizer.learning_rate: 0.1``). Only what shapes the model and its
optimisation may differ between candidates; what decides who holds which records, where
shards go, which sites take part, their budgets or the DP arithmetic of a round may not
(:data:`TUNABLE`, :data:`FIXED`), so every candidate is the same federation on the same
records, and the candidates' DP-SGD steps compose to the share of every budget they were
given (:mod:`fedshard.tuning`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["FIXED", "TUNABLE", "TunedCandidate", "TuningConfig"]

TUNABLE: tuple[str, ...] = (
    "training.",
    "federation.rounds",
    "task.options.",
    "privacy.record_level.max_grad_norm",
    "privacy.record_level.mechanism",
)
"""Dotted paths (or prefixes ending in ``.``) a candidate may set."""

FIXED: tuple[str, ...] = (
    "training.batch_size",
    "training.local_epochs",
    "task.options.validation_fraction",
    "task.options.fold",
    "task.options.folds",
    "task.options.split_seed",
    "task.options.data",
    "task.options.dirichlet_alpha",
    "task.options.sort_feature",
)
"""Paths under :data:`TUNABLE` a candidate may still not set: a round's DP shape (every
candidate's σ must compose with the others' as calibrated) and which records each site holds
and scores (every candidate is scored on the same validation records)."""

_PATH = r"^[a-z_][a-z0-9_]*(\.[A-Za-z0-9_-]+)+$"


class TunedCandidate(BaseModel):
    """One candidate: a name and the settings it changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,39}$", description="a short name: its run folder's")
    set: dict[Annotated[str, Field(pattern=_PATH)], Any] = Field(
        default_factory=dict, description="dotted config path → value, e.g. training.learning_rate: 0.1"
    )

    @field_validator("set")
    @classmethod
    def _tunable(cls, settings: dict[str, Any]) -> dict[str, Any]:
        for path in settings:
            if not any(path == t or (t.endswith(".") and path.startswith(t)) for t in TUNABLE):
                raise ValueError(
                    f"{path} may not differ between candidates: only {', '.join(t.rstrip('.') for t in TUNABLE)} "
                    "may (the sites, zones, budgets and residency rules are the federation's)"
                )
            if any(path == f or path.startswith(f + ".") for f in FIXED):
                raise ValueError(
                    f"{path} may not differ between candidates: every candidate trains with the same round shape "
                    "(so their DP-SGD steps compose as calibrated) on the same records"
                )
        return settings


class TuningConfig(BaseModel):
    """The file ``fedshard tune --candidates`` reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    validation_fraction: float = Field(
        0.2,
        gt=0,
        lt=0.5,
        description="the share of every site's training records held out and scored (the test data never is)",
    )
    selection_share: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="how noisy the validation scores are: as noisy as this share of every site's ε and δ "
        "would make them alone; the candidates' training, all candidates together, gets the largest ε the "
        "scores leave (composed with them, a little less than the rest)",
    )
    candidates: list[TunedCandidate] = Field(min_length=2, max_length=16)

    @model_validator(mode="after")
    def _distinct(self) -> TuningConfig:
        names = [c.name for c in self.candidates]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"candidate names must differ: {', '.join(twice)} appears more than once")
        return self
