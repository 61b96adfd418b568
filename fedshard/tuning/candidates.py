"""The federation each candidate runs: the user's config with the candidate's settings, a held-out
validation split, and every site's training share of its budget spread over all candidates' rounds.

Every candidate calibrates σ as if its rounds were the candidates' rounds together
(``privacy.record_level.calibration_rounds``), under each site's training budget
(:mod:`fedshard.tuning.budget`). The candidates share one round shape
(:data:`~fedshard.config.tuning.FIXED`), so they calibrate the same σ, and their rounds
together are that many steps at that σ: they spend the training budget, all of them together,
as one run of that many rounds would.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fedshard.config import FederationConfig
from fedshard.config.tuning import TunedCandidate, TuningConfig
from fedshard.errors import ConfigError, TaskError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import Guarantee
from fedshard.privacy.mechanisms import RoundShape, mechanism
from fedshard.task import Partition, Task, load_task
from fedshard.tuning.budget import BudgetSplit, split_budget

__all__ = ["CandidateRun", "TuningPlan", "candidate_runs", "check_tunable"]


@dataclass(frozen=True)
class CandidateRun:
    """One candidate's federation: ``config`` is what its sites and coordinator run."""

    name: str
    settings: dict[str, Any]
    config: FederationConfig


@dataclass(frozen=True)
class TuningPlan:
    """Every candidate's federation, every site's budget split (by site id), and how many
    validation records the sites hold in all (every candidate scores the same ones)."""

    runs: list[CandidateRun]
    splits: dict[str, BudgetSplit]
    validation_records: int

    @property
    def score_noise(self) -> float:
        """The standard deviation of a candidate's noisy validation accuracy: the sites' score
        noise over the validation records of all of them (known before anything runs)."""
        total = math.sqrt(sum(split.score_sigma**2 for split in self.splits.values()))
        return total / max(self.validation_records, 1)


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


def candidate_runs(base: FederationConfig, tuning: TuningConfig) -> TuningPlan:
    """Each candidate's federation config and every site's budget split (see the module
    docstring); nothing runs.

    Raises
    ------
    ConfigError
        A candidate's settings make an invalid config, or the task has no validation split
        (one line naming the candidate).
    PrivacyError
        A site's budget cannot pay for the candidates' rounds and scores (one line).
    """
    check_tunable(base)
    plain = base.model_dump(mode="json")
    drafts = [(c, _with_settings(plain, c, tuning.validation_fraction)) for c in tuning.candidates]
    # the task as each candidate builds it (its options are final here: only the budgets change below)
    tasks = [_loaded_task(c.name, _validated(c.name, d)) for c, d in drafts]
    rounds = sum(task.config.planned_rounds for task in tasks)
    splits, validation_records = _splits(tasks[0], base, tuning, rounds)
    runs = []
    for candidate, draft in drafts:
        draft["privacy"]["record_level"]["calibration_rounds"] = rounds
        for site in draft["sites"]:
            site["budget"] = splits[site["id"]].training.model_dump()
            site["cap"] = None
        draft["privacy"]["budget"] = None if base.privacy.budget is None else draft["sites"][0]["budget"]
        runs.append(CandidateRun(candidate.name, dict(candidate.set), _validated(candidate.name, draft)))
    return TuningPlan(runs, splits, validation_records)


@dataclass(frozen=True)
class _Built:
    """A candidate's config before its budgets are set, and its task."""

    config: FederationConfig
    task: Task


def _splits(
    built: _Built, base: FederationConfig, tuning: TuningConfig, rounds: int
) -> tuple[dict[str, BudgetSplit], int]:
    """Every site's :func:`~fedshard.tuning.budget.split_budget`, by the round shape its records give
    it, and the validation records of all sites (read from the same data)."""
    config = built.config
    record = config.privacy.record_level
    accountant = AccountantKind(record.accountant)
    made: dict[tuple[float, float, float, int], BudgetSplit] = {}
    splits = {}
    validation_records = 0
    for site in config.sites:
        budget = base.listed_budget(site.id)
        assert budget is not None  # check_tunable
        partition = Partition(config.partition_of(site.id), config.num_partitions, config.federation.seed)
        data = built.task.load_data(partition)
        validation_records += data.num_test
        shape = RoundShape(
            data.num_train, config.training.sent_batch_size, config.training.local_epochs, record.sample_rate
        )
        event = mechanism(record.mechanism, Guarantee.RECORD).event(shape, 1.0)
        key = (budget.epsilon, budget.delta, event.sample_rate, event.steps)
        if key not in made:
            made[key] = split_budget(budget, tuning.selection_share, len(tuning.candidates), event, rounds, accountant)
        splits[site.id] = made[key]
    return splits, validation_records


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


def _loaded_task(name: str, config: FederationConfig) -> _Built:
    try:
        return _Built(config, load_task(config.task.target, dict(config.task.options)))
    except (TaskError, TypeError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        needs = (
            " (fedshard tune needs a task that holds out task.options.validation_fraction of its training records)"
            if "validation_fraction" in detail
            else ""
        )
        raise ConfigError(f"candidate {name}: task.options: {detail}{needs}") from None
