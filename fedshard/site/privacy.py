"""A site's side of differential privacy: which events a round costs, the ledger,
and what the site reports.

The site decides, not the aggregator: its own terms (:mod:`fedshard.site.terms`, from the
copy of the config its operator holds) fix its mechanisms and budget, a coordinator's plan
may only tighten them, and the site checks its ledger before anything is released,
whatever the coordinator asked.

A site with a key (every simulated and deployed one) authenticates its ledger's rows
with a key derived from its store key and anchors the ledger's head after every write
(:mod:`fedshard.site.ledger_anchor`), before anything is released. Opening the ledger
checks it against that anchor and against the head the coordinator last saw: a ledger
deleted, rolled back, replaced or edited makes the site refuse, in one line that says
how to recover (:meth:`SitePrivacy.recover`, ``fedshard budget recover``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard import faults
from fedshard.errors import ConfigError, PrivacyError, StoreError
from fedshard.privacy.accountant import SIGMA_DIGITS, AccountantKind, calibrate_noise
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import Budget, LedgerHead, PrivacyLedger
from fedshard.privacy.ledger.chain import LedgerKey
from fedshard.privacy.ledger.legacy import read_format1
from fedshard.privacy.ledger.spend import Snapshot
from fedshard.privacy.mechanisms import MechanismRound, RecordPrivacy, RoundShape, Sharing, mechanism, shared_terms
from fedshard.protocol.messages import LedgerHeadReport, PrivacyPlan, PrivacyReport, PrivacyStatus
from fedshard.site._epsilon_memo import EpsilonMemo
from fedshard.site._kept_ledger import KeptLedger
from fedshard.site.ledger_anchor import Anchor, AnchorStore, anchor_of
from fedshard.site.terms import PrivacyTerms

if TYPE_CHECKING:
    import numpy as np

    from fedshard.crypto.at_rest import Kek

__all__ = ["LEDGER_FILE", "RoundDP", "SitePrivacy", "ledger_key"]

LEDGER_FILE = "ledger.sqlite"
_CALIBRATION_FILE = "privacy-calibration.json"


@dataclass(frozen=True)
class RoundDP:
    """The DP mechanisms of one round, each started on the event its ledger reserved:
    record-level ones inside training, update-level ones at release; ``shared`` names the
    terms of each one whose noise is shared over several sites (see :meth:`noise_terms`)."""

    runs: tuple[MechanismRound, ...]
    shared: tuple[tuple[Guarantee, str], ...] = ()

    @classmethod
    def of(
        cls, plan: PrivacyPlan, events: Sequence[DPEvent], examples: int, weight: float, largest_weight: float
    ) -> RoundDP:
        """Start each mechanism of ``plan`` on its event of ``events`` (the reserved ones);
        ``weight`` is the site's aggregation weight in the round, ``largest_weight`` the
        round's largest (a mechanism sharing its noise scales its share by them, see
        :class:`~fedshard.privacy.mechanisms.Sharing`). Raises :class:`PrivacyError` if the
        round cannot be run that way (before anything is reserved)."""
        slots = _slots(plan)
        runs = []
        shared = []
        for event in events:
            name, clip, distributed_over = slots[event.guarantee]
            sharing = Sharing(distributed_over, examples, weight, largest_weight)
            runs.append(mechanism(name, event.guarantee).start(event, clip, sharing))
            if distributed_over is not None:
                terms = shared_terms(
                    event.guarantee.value, name, event.noise_multiplier, clip, distributed_over, event.sample_rate
                )
                shared.append((event.guarantee, terms))
        return cls(tuple(runs), tuple(shared))

    def noise_terms(self, learning_rate: float) -> str:
        """What the round's shared noise was made under, as the site's manifests name it ("":
        no noise shared): every shared mechanism's terms, the record level's with the round's
        ``learning_rate`` (its noise goes in before the SGD step). A zone puts only shares of
        the same terms in one aggregate: a site sent other terms than the others would
        account a σ their shares do not add up to."""
        return "; ".join(
            f"{terms} lr={learning_rate!r}" if guarantee is Guarantee.RECORD else terms
            for guarantee, terms in self.shared
        )

    @property
    def training(self) -> RecordPrivacy | None:
        """What the task trains through (None: training is untouched)."""
        return next((run.training for run in self.runs if run.training is not None), None)

    def verify(self) -> None:
        """Raise :class:`PrivacyError` if training spent other than was reserved."""
        for run in self.runs:
            run.verify()

    def release(self, update: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``update`` as the site may release it, every mechanism applied."""
        for run in self.runs:
            update = run.release(update)
        return update


def _slots(plan: PrivacyPlan) -> dict[Guarantee, tuple[str, float, int | None]]:
    """The mechanism, clip and noise sharing ``plan`` names for each guarantee it turns on."""
    slots: dict[Guarantee, tuple[str, float, int | None]] = {}
    if plan.record is not None:
        slots[Guarantee.RECORD] = (plan.record.mechanism, plan.record.max_grad_norm, plan.record.distributed_over)
    if plan.update is not None:
        slots[Guarantee.UPDATE] = (plan.update.mechanism, plan.update.clip_norm, plan.update.distributed_over)
    return slots


class SitePrivacy:
    """Privacy bookkeeping of one site.

    Parameters
    ----------
    site_id:
        For messages.
    state_dir:
        The site's on-prem folder; the ledger lives there.
    terms:
        The site's own mechanisms and budget (default: none, for bare library use: every
        plan is taken as asked); plans are checked against them with
        :meth:`admit` before anything else.
    key:
        Authenticates the ledger's rows (see :func:`ledger_key`); None for bare library
        use (an unauthenticated ledger).
    anchor:
        Where the ledger's head is anchored outside its file; None: nowhere.
    """

    def __init__(
        self,
        site_id: str,
        state_dir: Path,
        terms: PrivacyTerms | None = None,
        *,
        key: LedgerKey | None = None,
        anchor: AnchorStore | None = None,
    ) -> None:
        self.site_id = site_id
        self.state_dir = state_dir
        self.terms = terms if terms is not None else PrivacyTerms()
        self.key = key
        self.anchor = anchor
        self._last_anchor: Anchor | None = None
        self._accountant = AccountantKind.PRV  # the open ledger's, recorded in its anchor
        self._kept = KeptLedger(self.ledger_path)
        self._memo = EpsilonMemo(state_dir, key) if key is not None and key.keyed else None

    @property
    def ledger_path(self) -> Path:
        """Where the ledger file is."""
        return self.state_dir / LEDGER_FILE

    def admit(
        self, asked: PrivacyPlan | None, *, batch_size: int | None = None, epochs: int | None = None
    ) -> PrivacyPlan | None:
        """The plan the site runs for ``asked`` (see :meth:`PrivacyTerms.admit`); raises
        :class:`PrivacyError` for a missing or weaker plan."""
        return self.terms.admit(asked, self.site_id, batch_size=batch_size, epochs=epochs)

    def effective_budget(self, plan: PrivacyPlan | None) -> tuple[Budget, str]:
        """The stricter of the aggregator's budget and the site's own, and a note when
        the site kept its own (``plan`` None: the site's own)."""
        own = self.terms.budget
        if plan is None:
            if own is None:
                raise PrivacyError(f"site {self.site_id}: no privacy budget (neither its config nor a plan sets one)")
            return Budget(own.epsilon, own.delta), ""
        epsilon, delta, note = plan.epsilon, plan.delta, ""
        if own is not None:
            if plan.epsilon > own.epsilon:
                note = f"aggregator asked ε={plan.epsilon:g}; {self.site_id} keeps its cap ε={own.epsilon:g}"
            epsilon, delta = min(epsilon, own.epsilon), min(delta, own.delta)
        return Budget(epsilon, delta), note

    def open_ledger(
        self, plan: PrivacyPlan, num_examples: int, expected: LedgerHeadReport | None = None
    ) -> tuple[PrivacyLedger, str]:
        """Open (or create) the ledger under the effective budget, after checking it.

        Checks δ ≤ 1/records, that the ledger holds its anchored head (it was not deleted,
        rolled back or replaced) and ``expected``, the head the coordinator last saw.

        Raises
        ------
        StoreError
            If the ledger fails a check (one line saying how to recover); nothing was written.
        ConfigError
            If δ is too large for the site's records.
        """
        budget, note = self.effective_budget(plan)
        if budget.delta > 1.0 / num_examples:
            raise ConfigError(
                f"site {self.site_id}: δ={budget.delta:g} is larger than 1/(its {num_examples} records) = "
                f"{1.0 / num_examples:.3g}; choose δ ≤ {1.0 / num_examples:.3g}"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self._memo is not None:
            self._memo.load()
        anchor = self.anchor.read() if self.anchor is not None else None
        self._last_anchor = anchor
        exists = self.ledger_path.exists()
        if not exists and anchor is not None:
            raise StoreError(
                f"site {self.site_id}: {LEDGER_FILE} is missing but the site's store anchors {anchor.describe()}: "
                f"restore it from a backup, or run {self._recover_command} to start a ledger that carries "
                f"ε {max(anchor.spent.values(), default=0.0):.3g} forward"
            )
        if not exists and expected is not None:
            raise StoreError(
                f"site {self.site_id}: {LEDGER_FILE} is missing but the coordinator last saw a ledger of "
                f"{expected.length} rows: restore it from a backup"
            )
        ledger = self._kept.take() if exists else None  # as this site left it: no file check again
        if ledger is not None and ledger.accountant != plan.accountant:
            ledger.close()
            ledger = None
        if ledger is None:
            ledger = PrivacyLedger(
                self.ledger_path,
                None if exists else budget,
                accountant=plan.accountant,
                key=self.key,
                on_grow=self._anchor_head,
            )
        try:
            self._check(ledger, anchor, expected)
            if exists:
                ledger.lower_budget(budget)
            self._catch_up_anchor(ledger, anchor)
        except BaseException:
            self._kept.drop(ledger)
            raise
        kept = ledger.budget
        if kept.epsilon < budget.epsilon and not note:
            note = f"site {self.site_id} keeps its earlier, lower budget ε={kept.epsilon:g}"
        return ledger, note

    def put_back(self, ledger: PrivacyLedger) -> None:
        """The message is done with ``ledger`` (from :meth:`open_ledger`): kept open for the next
        one while its files stay as they are (:mod:`fedshard.site._kept_ledger`), or closed."""
        self._kept.put_back(ledger)
        if self._memo is not None:
            self._memo.save()

    def discard(self, ledger: PrivacyLedger | None = None) -> None:
        """Close ``ledger`` (a message that failed with it) and the kept one; the next message opens
        the file afresh. The site's close calls it (a stopped site leaves its ledger in one file)."""
        self._kept.drop(ledger)
        if self._memo is not None and ledger is not None:
            self._memo.save()

    @property
    def _recover_command(self) -> str:
        return "`fedshard budget recover --site-config FILE`"

    def _check(self, ledger: PrivacyLedger, anchor: Anchor | None, expected: LedgerHeadReport | None) -> None:
        """Refuse a ledger that lacks its anchored head or the coordinator's."""
        if anchor is not None and not ledger.contains(anchor.head):
            what = (
                f"was rolled back or edited (the site's store anchors {anchor.describe()})"
                if anchor.head.ledger_id == ledger.ledger_id
                else f"was replaced (the site's store anchors another ledger: {anchor.describe()})"
            )
            raise StoreError(
                f"site {self.site_id}: {LEDGER_FILE} {what}: restore it from a backup, or move it aside and run "
                f"{self._recover_command}"
            )
        if expected is not None:
            head = LedgerHead(expected.ledger_id, expected.length, expected.mac)
            if not ledger.contains(head):
                raise StoreError(
                    f"site {self.site_id}: {LEDGER_FILE} does not contain the ledger the coordinator last saw "
                    f"({expected.length} rows): it was rolled back or replaced; restore it from a backup"
                )

    def _catch_up_anchor(self, ledger: PrivacyLedger, anchor: Anchor | None) -> None:
        """Anchor the ledger's head if the anchor is behind what it spent or allows (a crash after a
        write, or a new ledger); an anchor behind by commit rows only is kept (they change neither)."""
        if self.anchor is None:
            return
        self._accountant = ledger.accountant
        head = ledger.head()
        snapshot = Snapshot(ledger.budget, tuple(ledger.entries()))
        if anchor is None or not anchor.same_spend(anchor_of(head, snapshot, ledger.accountant)):
            self._anchor_head(head, snapshot)

    def _anchor_head(self, head: LedgerHead, snapshot: Snapshot) -> None:
        """Anchor ``head`` (the ledger's ``on_grow``: after a write is durable, before any release)."""
        if self.anchor is None:
            return
        anchor = anchor_of(head, snapshot, self._accountant)
        faults.point("site.ledger.anchor")
        self.anchor.write(anchor)
        self._last_anchor = anchor

    def recover(self) -> str:
        """Replace a missing, rolled-back, replaced or edited ledger by one carrying the anchored spend.

        The old file (if any) is moved aside, never deleted. The new ledger's first events
        are the anchored events (per mechanism, steps summed), committed, so ε spent is
        what the anchor recorded and never less.

        Returns
        -------
        str
            One line saying what was done.

        Raises
        ------
        StoreError
            If nothing anchors the ledger and it is not a format-1 ledger (nothing to carry forward).
        """
        self._kept.drop()  # the file is about to be moved aside
        anchor = self.anchor.read() if self.anchor is not None else None
        legacy = read_format1(self.ledger_path) if anchor is None and self.ledger_path.exists() else None
        if anchor is None and legacy is None:
            raise StoreError(
                f"site {self.site_id}: nothing anchors its privacy ledger, so there is no spend to carry forward; "
                "restore the ledger from a backup"
            )
        if anchor is None:  # a format-1 ledger: its events, taken on trust once
            assert legacy is not None
            budget, accountant, carried, replaces = legacy
            anchor = Anchor(replaces, _spent_of(carried), tuple(carried), budget, accountant)
        path = self.ledger_path
        if path.exists():
            try:
                with PrivacyLedger(path, None, key=self.key) as current:
                    if current.contains(anchor.head):
                        return f"site {self.site_id}: {path} holds its anchored head; nothing to recover"
            except StoreError:
                pass
            aside = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
            path.rename(aside)
            for suffix in ("-wal", "-shm"):
                extra = path.with_name(path.name + suffix)
                if extra.exists():
                    extra.rename(aside.with_name(aside.name + suffix))
            moved = f"moved {path.name} to {aside.name}; "
        else:
            moved = ""
        with PrivacyLedger.recover(
            path, anchor.budget, anchor.carried, anchor.head, key=self.key, accountant=anchor.accountant
        ) as ledger:
            self._catch_up_anchor(ledger, None)
        return (
            f"site {self.site_id}: {moved}started a new ledger carrying {anchor.describe()} forward "
            f"(ε spent {max(anchor.spent.values(), default=0.0):.3g})"
        )

    def round_events(self, plan: PrivacyPlan, ledger: PrivacyLedger, num_examples: int) -> list[DPEvent]:
        """What one round costs under ``plan`` (one :meth:`admit` returned).

        Record-level σ is the largest of the plan's and the site's own fixed σ, and, where
        either calibrates, of σ calibrated to the ledger's budget over the plan's (already
        at least the site's own) planned rounds."""
        events: list[DPEvent] = []
        rate = plan.record.sample_rate if plan.record is not None else None
        shape = RoundShape(num_examples, plan.batch_size, plan.epochs, rate)
        if plan.record is not None:
            fixed = [s for s in (plan.record.noise_multiplier, self.terms.noise_floor()) if s is not None]
            if plan.record.noise_multiplier is None or self.terms.calibrates():
                fixed.append(self._calibrated_sigma(plan, ledger, shape))
            events.append(mechanism(plan.record.mechanism, Guarantee.RECORD).event(shape, max(fixed)))
        if plan.update is not None:
            events.append(mechanism(plan.update.mechanism, Guarantee.UPDATE).event(shape, plan.update.noise_multiplier))
        return events

    def _calibrated_sigma(self, plan: PrivacyPlan, ledger: PrivacyLedger, shape: RoundShape) -> float:
        """σ such that the planned rounds spend exactly the budget (cached on disk:
        calibration takes seconds and every message may start a fresh process)."""
        assert plan.record is not None
        budget = ledger.budget
        one = mechanism(plan.record.mechanism, Guarantee.RECORD).event(shape, 1.0)
        steps = one.steps * plan.record.planned_rounds
        # σ on its grid (calibrate_noise); entries from before the grid are not taken
        terms = (plan.accountant.value, repr(budget.epsilon), repr(budget.delta), repr(one.sample_rate), str(steps))
        key = "|".join((f"grid{SIGMA_DIGITS}", *terms))
        path = self.state_dir / _CALIBRATION_FILE
        try:
            cache: dict[str, float] = json.loads(path.read_text())
        except (OSError, ValueError):  # none yet, or torn by a crash mid-write before writes were atomic
            cache = {}
        if key not in cache:
            cache[key] = calibrate_noise(budget.epsilon, budget.delta, one.sample_rate, steps, plan.accountant)
            tmp = path.with_name(f".{path.name}.new")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
            os.replace(tmp, path)  # a site killed here keeps the old cache or the new one, never half of one
        return float(cache[key])

    @staticmethod
    def report(
        ledger: PrivacyLedger,
        next_events: list[DPEvent],
        *,
        status: PrivacyStatus | None = None,
        note: str = "",
        hint: int | None = None,
    ) -> PrivacyReport:
        """The site's privacy report for the coordinator (``hint``: where the rounds-left search starts).

        A next round the accountant cannot bound (a σ far too small) cannot be afforded."""
        try:
            st = ledger.status(next_events, hint)
        except PrivacyError:
            st = dataclasses.replace(ledger.status([], hint), can_afford_next=False, projected_rounds_left=0)
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
            ledger_head=LedgerHeadReport(**ledger.head().to_dict()),
        )

    def refusal_report(self, plan: PrivacyPlan | None, reason: str) -> PrivacyReport:
        """The report of a site whose ledger cannot be used, or that refused the plan: it takes
        part in no round (``plan`` None: the aggregator sent none).

        The spend is the anchored one when there is an anchor (else 0: unknown).
        """
        try:
            budget, _ = self.effective_budget(plan)
            epsilon, delta = budget.epsilon, budget.delta
        except PrivacyError:  # neither side set a budget: nothing to show
            epsilon, delta = 0.0, 0.0
        anchor = self._last_anchor
        spent = dict(anchor.spent) if anchor is not None else {}
        record, update = spent.get(Guarantee.RECORD, 0.0), spent.get(Guarantee.UPDATE, 0.0)
        record_level = plan.record is not None if plan is not None else self.terms.config.record_level.enabled
        return PrivacyReport(
            epsilon_budget=epsilon,
            delta=delta,
            epsilon_spent=record if record_level else update,
            epsilon_record=record,
            epsilon_update=update,
            status=PrivacyStatus.REFUSED,
            can_afford_next=False,
            projected_rounds_left=0,
            note=reason,
        )


def _spent_of(carried: list[tuple[DPEvent, float]]) -> dict[Guarantee, float]:
    spent: dict[Guarantee, float] = {}
    for event, eps in carried:
        spent[event.guarantee] = max(spent.get(event.guarantee, 0.0), eps)
    return spent


def ledger_key(kek: Kek) -> LedgerKey:
    """The key that authenticates a site's ledger, derived (HKDF) from its store key.

    The store key is the site's secret kept away from its state folder (a key file
    inside the store is refused), and it already authenticates the store catalog that
    anchors the ledger; the manifest-signing key, by contrast, sits in a simulated
    site's state folder, beside the ledger.
    """
    return LedgerKey(bytes.fromhex(kek.to_text()))
