"""A site's side of differential privacy: which events a round costs, the ledger,
and what the site reports.

The site decides, not the aggregator: the aggregator's budget counts only where it is
stricter than the site's own cap, and the site checks its ledger before anything is
released, whatever the coordinator asked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from fedshard.config import BudgetConfig
from fedshard.errors import ConfigError
from fedshard.privacy.accountant import calibrate_noise
from fedshard.privacy.dpsgd import planned_record_event
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import Budget, PrivacyLedger
from fedshard.privacy.update_dp import update_event
from fedshard.protocol.messages import PrivacyPlan, PrivacyReport, PrivacyStatus

__all__ = ["LEDGER_FILE", "SitePrivacy"]

LEDGER_FILE = "ledger.sqlite"
_CALIBRATION_FILE = "privacy-calibration.json"


class SitePrivacy:
    """Privacy bookkeeping of one site.

    Parameters
    ----------
    site_id:
        For messages.
    state_dir:
        The site's on-prem folder; the ledger lives there.
    cap:
        The site's own budget cap, if its local config sets one.
    """

    def __init__(self, site_id: str, state_dir: Path, cap: BudgetConfig | None = None) -> None:
        self.site_id = site_id
        self.state_dir = state_dir
        self.cap = cap

    @property
    def ledger_path(self) -> Path:
        """Where the ledger file is."""
        return self.state_dir / LEDGER_FILE

    def effective_budget(self, plan: PrivacyPlan) -> tuple[Budget, str]:
        """The stricter of the aggregator's budget and the site's cap, and a note when
        the site kept its own."""
        epsilon, delta, note = plan.epsilon, plan.delta, ""
        if self.cap is not None:
            if plan.epsilon > self.cap.epsilon:
                note = f"aggregator asked ε={plan.epsilon:g}; {self.site_id} keeps its cap ε={self.cap.epsilon:g}"
            epsilon, delta = min(epsilon, self.cap.epsilon), min(delta, self.cap.delta)
        return Budget(epsilon, delta), note

    def open_ledger(self, plan: PrivacyPlan, num_examples: int) -> tuple[PrivacyLedger, str]:
        """Open (or create) the ledger under the effective budget; checks δ ≤ 1/records."""
        budget, note = self.effective_budget(plan)
        if budget.delta > 1.0 / num_examples:
            raise ConfigError(
                f"site {self.site_id}: δ={budget.delta:g} is larger than 1/(its {num_examples} records) = "
                f"{1.0 / num_examples:.3g}; choose δ ≤ {1.0 / num_examples:.3g}"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ledger = PrivacyLedger(self.ledger_path, budget, accountant=plan.accountant)
        kept = ledger.budget
        if kept.epsilon < budget.epsilon and not note:
            note = f"site {self.site_id} keeps its earlier, lower budget ε={kept.epsilon:g}"
        return ledger, note

    def round_events(self, plan: PrivacyPlan, ledger: PrivacyLedger, num_examples: int) -> list[DPEvent]:
        """What one round costs under ``plan``."""
        events: list[DPEvent] = []
        if plan.record is not None:
            sigma = plan.record.noise_multiplier
            if sigma is None:
                sigma = self._calibrated_sigma(plan, ledger, num_examples)
            events.append(planned_record_event(num_examples, plan.batch_size, plan.epochs, sigma))
        if plan.update is not None:
            events.append(update_event(plan.update.noise_multiplier))
        return events

    def _calibrated_sigma(self, plan: PrivacyPlan, ledger: PrivacyLedger, num_examples: int) -> float:
        """σ such that the planned rounds spend exactly the budget (cached on disk:
        calibration takes seconds and every message may start a fresh process)."""
        assert plan.record is not None
        budget = ledger.budget
        one = planned_record_event(num_examples, plan.batch_size, plan.epochs, 1.0)
        steps = one.steps * plan.record.planned_rounds
        key = f"{plan.accountant.value}|{budget.epsilon!r}|{budget.delta!r}|{one.sample_rate!r}|{steps}"
        path = self.state_dir / _CALIBRATION_FILE
        cache: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
        if key not in cache:
            cache[key] = calibrate_noise(budget.epsilon, budget.delta, one.sample_rate, steps, plan.accountant)
            path.write_text(json.dumps(cache, indent=1, sort_keys=True))
        return cache[key]

    @staticmethod
    def report(
        ledger: PrivacyLedger, next_events: list[DPEvent], *, status: PrivacyStatus | None = None, note: str = ""
    ) -> PrivacyReport:
        """The site's privacy report for the coordinator."""
        st = ledger.status(next_events)
        record = st.spent.get(Guarantee.RECORD, 0.0)
        update = st.spent.get(Guarantee.UPDATE, 0.0)
        binding = Guarantee.RECORD if any(e.guarantee is Guarantee.RECORD for e in next_events) else Guarantee.UPDATE
        if status is None:
            status = PrivacyStatus.ACTIVE if st.can_afford_next else PrivacyStatus.EXHAUSTED
        left = st.projected_rounds_left
        return PrivacyReport(
            epsilon_budget=st.budget.epsilon,
            delta=st.budget.delta,
            epsilon_spent=st.spent.get(binding, 0.0),
            epsilon_record=record,
            epsilon_update=update,
            rounds_participated=st.rounds_participated,
            status=status,
            can_afford_next=st.can_afford_next,
            projected_rounds_left=None if left is None or not math.isfinite(left) else int(left),
            note=note,
        )
