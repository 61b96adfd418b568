"""The federation each candidate runs: the user's config with the candidate's settings, a held-out
validation split, and every site's training share of its budget spread over all candidates' rounds.

Every candidate calibrates σ as if its rounds were the candidates' rounds together
(``privacy.record_level.calibration_rounds``), under each site's budget times
``1 − selection_share``. The candidates share one round shape (:data:`~fedshard.config.tuning.FIXED`),
so they calibrate the same σ, and their rounds together are that many steps at that σ: they
spend the training share, all of them together, as one run of that many rounds would.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fedshard.config import BudgetConfig, FederationConfig
from fedshard.config.tuning import TunedCandidate, TuningConfig
from fedshard.errors import ConfigError, TaskError
from fedshard.task import load_task

__all__ = ["CandidateRun", "candidate_runs", "check_tunable"]


@dataclass(frozen=True)
class CandidateRun:
    """One candidate's federation: ``config`` is what its sites and coordinator run."""

    name: str
    settings: dict[str, Any]
    config: FederationConfig


def check_tunable(base: FederationConfig) -> None:
    """Refuse, in one line, a federation whose candidates could not share its budgets as calibrated.

    Raises
    ------
    ConfigError
        Record-level DP is off, its σ fixed, update-level DP on, or a site without a budget.
    """
    privacy = base.privacy
    if not privacy.record_level.enabled:
        raise ConfigError(
            "fedshard tune spends each site's privacy budget on record-level DP-SGD and its noisy validation "
            "scores: turn privacy.record_level on (without DP, score the candidates on a validation split directly)"
        )
    if privacy.record_level.noise_multiplier is not None:
        raise ConfigError(
            "privacy.record_level.noise_multiplier is fixed: leave it empty so every candidate calibrates σ to its "
            "share of the budget"
        )
    if privacy.update_level.enabled:
        raise ConfigError("fedshard tune supports record-level DP only: turn privacy.update_level off")
    missing = [s.id for s in base.sites if base.listed_budget(s.id) is None]
    if missing:
        raise ConfigError(f"site(s) {', '.join(missing[:3])} have no privacy budget: set privacy.budget")


def candidate_runs(base: FederationConfig, tuning: TuningConfig) -> list[CandidateRun]:
    """Each candidate's federation config (see the module docstring); nothing runs.

    Raises
    ------
    ConfigError
        A candidate's settings make an invalid config, or the task has no validation split
        (one line naming the candidate).
    """
    check_tunable(base)
    plain = base.model_dump(mode="json")
    drafts = [(c, _with_settings(plain, c, tuning.validation_fraction)) for c in tuning.candidates]
    rounds = sum(_validated(c.name, d).planned_rounds for c, d in drafts)
    keep = 1.0 - tuning.selection_share
    runs = []
    for candidate, draft in drafts:
        draft["privacy"]["record_level"]["calibration_rounds"] = rounds
        for site in draft["sites"]:
            budget = base.listed_budget(site["id"])
            assert budget is not None  # check_tunable
            site["budget"] = _scaled(budget, keep)
            site["cap"] = None
        draft["privacy"]["budget"] = _scaled(base.privacy.budget, keep) if base.privacy.budget else None
        config = _validated(candidate.name, draft)
        _check_task(candidate.name, config)
        runs.append(CandidateRun(candidate.name, dict(candidate.set), config))
    return runs


def _with_settings(plain: dict[str, Any], candidate: TunedCandidate, validation_fraction: float) -> dict[str, Any]:
    draft = copy.deepcopy(plain)
    for path, value in candidate.set.items():
        *parents, leaf = path.split(".")
        node = draft
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"candidate {candidate.name}: {path}: {part} is not a section")
            node = child
        node[leaf] = copy.deepcopy(value)
    draft["task"].setdefault("options", {})["validation_fraction"] = validation_fraction
    return draft


def _validated(name: str, draft: dict[str, Any]) -> FederationConfig:
    try:
        return FederationConfig.model_validate(draft)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ConfigError(f"candidate {name}: {where}: {error['msg']}") from None


def _check_task(name: str, config: FederationConfig) -> None:
    try:
        load_task(config.task.target, dict(config.task.options))
    except (TaskError, TypeError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        needs = (
            " (fedshard tune needs a task that holds out task.options.validation_fraction of its training records)"
            if "validation_fraction" in detail
            else ""
        )
        raise ConfigError(f"candidate {name}: task.options: {detail}{needs}") from None


def _scaled(budget: BudgetConfig, share: float) -> dict[str, float]:
    return {"epsilon": budget.epsilon * share, "delta": budget.delta * share}
