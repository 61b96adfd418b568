"""Private selection: each site's noisy validation score and the ledger that charges it.

What a site releases per candidate is the number of its validation records the candidate's
final model (the site's own, on-premise parameters included) classifies correctly, plus
Gaussian noise of standard deviation σ_s drawn from a secure source at the site. Adding or
removing one record changes that count by at most 1, so the release is the Gaussian
mechanism at noise multiplier σ_s: the ledger stores it as an event like any DP-SGD step
(``poisson_subsampled_gaussian``, sample rate 1, one step, record-level). σ_s is calibrated
so that the scores of all candidates would spend ``selection_share`` of the site's ε and δ on
their own (:mod:`fedshard.tuning.budget`).

Each site's tuning ledger (``<out>/ledgers/<site>.sqlite``, :mod:`fedshard.run_folder.tune_folder`)
holds the site's whole budget. It is charged every candidate's training (the events the
candidate's run recorded in the site's own ledger) and, before each score is released, the
score's event: a score the budget cannot pay for is not released. The split was made so that
the candidates' planned steps and the scores, composed at the site's δ, fit its ε; the ledger
checks the events actually recorded. A record is either a training or a validation record; the
ledger charges every event to every record, as if it were both (parallel composition would allow
less): the count it keeps is an upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from fedshard.assembly.sites import STORE_KEYS_DIR, site_model
from fedshard.config import FederationConfig
from fedshard.errors import TaskError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import Budget, PrivacyLedger
from fedshard.privacy.secure_noise import SecureGaussian
from fedshard.run_folder.tune_folder import tuning_ledger
from fedshard.task import Partition, load_task
from fedshard.tuning.budget import BudgetSplit

__all__ = ["SiteScore", "TuningLedgers", "score_std", "validation_count"]

_TRAINING, _SCORE = 0, 1
"""A candidate k's rounds in a tuning ledger: 2k (its training) and 2k + 1 (its score)."""


@dataclass(frozen=True)
class SiteScore:
    """One site's released score of one candidate: ``noisy`` (what leaves the site) and the
    noise's standard deviation ``std``; ``records``: how many validation records it scored."""

    site_id: str
    noisy: float
    std: float
    records: int


def validation_count(config: FederationConfig, run_dir: Path, site_id: str) -> tuple[int, int]:
    """(validation records the site's final model classifies correctly, validation records) in a
    candidate's run folder; the count never leaves the site without noise (:class:`TuningLedgers`).

    Raises
    ------
    TaskError
        The task reports no accuracy.
    StoreError
        The site holds no model (it never ran a round).
    """
    model, _ = site_model(config, run_dir / "sites" / site_id, run_dir / STORE_KEYS_DIR / f"{site_id}.kek")
    task = load_task(config.task.target, dict(config.task.options))
    partition = Partition(config.partition_of(site_id), config.num_partitions, config.federation.seed)
    data = task.load_data(partition)
    metrics = task.evaluate(model, data)
    if metrics.accuracy is None:
        raise TaskError(f"{config.task.target} reports no accuracy: fedshard tune scores candidates by accuracy")
    return round(metrics.accuracy * metrics.num_examples), metrics.num_examples


class TuningLedgers:
    """Every site's tuning ledger in the tune folder ``folder`` (see the module docstring), its noise σ_s from
    the site's split (:mod:`fedshard.tuning.budget`)."""

    def __init__(self, folder: Path, base: FederationConfig, splits: Mapping[str, BudgetSplit]) -> None:
        accountant = AccountantKind(base.privacy.record_level.accountant)
        self._ledgers: dict[str, PrivacyLedger] = {}
        self._sigmas = {site: split.score_sigma for site, split in splits.items()}
        self._stack = ExitStack()
        for site in base.sites:
            listed = base.listed_budget(site.id)
            assert listed is not None  # check_tunable
            path = tuning_ledger(folder, site.id)
            path.parent.mkdir(parents=True, exist_ok=True)
            ledger = PrivacyLedger(path, Budget(listed.epsilon, listed.delta), accountant=accountant)
            self._ledgers[site.id] = self._stack.enter_context(ledger)

    def close(self) -> None:
        """Close every ledger."""
        self._stack.close()

    def charge_training(self, site_id: str, candidate: int, events: list[DPEvent]) -> None:
        """Charge candidate ``candidate``'s training: the events its run recorded at the site.

        Raises
        ------
        BudgetExhaustedError
            They would take the site over its budget (the split forbids it: a defect).
        """
        if events:
            ledger = self._ledgers[site_id]
            ledger.commit(ledger.reserve(2 * candidate + _TRAINING, events))

    def release_score(self, site_id: str, candidate: int, correct: int, records: int) -> SiteScore:
        """The site's noisy count of ``correct``, after its ledger reserved the release.

        Raises
        ------
        BudgetExhaustedError
            The budget cannot pay for it: nothing is released.
        """
        sigma = self._sigmas[site_id]
        ledger = self._ledgers[site_id]
        reservation = ledger.reserve(2 * candidate + _SCORE, [DPEvent(Guarantee.RECORD, sigma, 1.0, 1)])
        noisy = float(correct + SecureGaussian().normal(sigma, 1)[0])
        ledger.commit(reservation)
        return SiteScore(site_id, noisy, sigma, records)

    def spent(self) -> dict[str, tuple[float, Budget]]:
        """By site: (record-level ε spent over all its candidates and scores, its budget)."""
        return {s: (ledger.spent(Guarantee.RECORD), ledger.budget) for s, ledger in self._ledgers.items()}


def score_std(scores: list[SiteScore]) -> float:
    """Standard deviation of the summed noisy counts."""
    return math.sqrt(sum(s.std**2 for s in scores))
