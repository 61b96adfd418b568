"""One round of a site with DP on: open the ledger, reserve the round's cost (then the site
releases), commit.

The site's own terms and its ledger decide before anything leaves the site: a plan weaker
than the site's own config (:mod:`fedshard.site.terms`), a round its DP cannot run as
planned, or one the budget cannot afford, is refused before the reservation; a
reservation that is never committed (crash, push refused) stays counted as spent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fedshard import faults
from fedshard.errors import BudgetExhaustedError, FedshardError, PrivacyError, StoreError
from fedshard.privacy.events import DPEvent
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.privacy.ledger.records import Reservation
from fedshard.protocol.messages import PrivacyPlan, PrivacyReport, PrivacyStatus, TrainInstruction, TrainReport
from fedshard.site.privacy import RoundDP, SitePrivacy
from fedshard.site.routes import SiteRouting

__all__ = ["Admitted", "Refusal", "ReservedRound", "refused", "reserve_round"]

log = logging.getLogger(__name__)


def refused(
    site_id: str, round: int, error: FedshardError, privacy: PrivacyReport | None, applied: int | None
) -> TrainReport:
    """The report of a round the site refuses (logged): why, its refusal code, its privacy report."""
    code = f" [{error.code}]" if error.code is not None else ""
    log.warning("site %s refuses round %d%s: %s", site_id, round, code, error)
    return TrainReport(
        site_id=site_id,
        round=round,
        ok=False,
        reason=str(error),
        code=error.code,
        privacy=privacy,
        applied_round=applied,
    )


@dataclass(frozen=True)
class Refusal:
    """A round the site refuses before anything is released: ``error`` says why, ``privacy``
    is the privacy report to send with it."""

    error: FedshardError
    privacy: PrivacyReport | None


@dataclass(frozen=True)
class Admitted:
    """A site's decision on a train message before it trains: ``refusal`` (the report to send), or
    the round's ``routing`` and, with DP on, its ``reserved`` cost."""

    routing: SiteRouting | None = None
    reserved: ReservedRound | None = None
    refusal: TrainReport | None = None


@dataclass
class ReservedRound:
    """A round whose cost is reserved, durably and anchored, in the site's open ledger:
    train and push under :attr:`dp`, then :meth:`commit` (or send :meth:`refusal`). A
    reservation that is never committed (crash, push refused) stays counted as spent.
    Use it as a context manager: the ledger goes back to the site's privacy with it."""

    privacy: SitePrivacy
    message: TrainInstruction
    plan: PrivacyPlan
    ledger: PrivacyLedger
    events: list[DPEvent]
    reservation: Reservation
    note: str
    dp: RoundDP

    def __enter__(self) -> ReservedRound:
        return self

    def __exit__(self, *exc: object) -> None:
        self.privacy.put_back(self.ledger)

    def refusal(self) -> PrivacyReport:
        """The privacy report of a round that released nothing after all (its cost stays spent)."""
        return self.privacy.report(self.ledger, self.events, status=PrivacyStatus.REFUSED, note=self.note)

    def commit(self, report: TrainReport) -> TrainReport:
        """``report`` (of the released round) with the site's privacy report, once the reservation is
        committed; a commit that fails leaves the round counted and says so in the report."""
        faults.point("site.ledger.commit")
        try:
            self.ledger.commit(self.reservation)
        except StoreError as exc:  # released and counted; the reservation stays spent
            log.warning("site %s: round %d: %s", self.privacy.site_id, self.message.round, exc)
            return report.model_copy(update={"privacy": self.privacy.refusal_report(self.plan, str(exc))})
        faults.point("site.ledger.committed")
        shown = self.privacy.report(self.ledger, self.events, note=self.note, hint=self.message.projection_hint)
        return report.model_copy(update={"privacy": shown})


def reserve_round(
    privacy: SitePrivacy, message: TrainInstruction, plan: PrivacyPlan, num_train: int
) -> ReservedRound | Refusal:
    """Open the ledger for ``message``'s round under ``plan`` (what :meth:`SitePrivacy.admit`
    made of the message's plan), start its DP mechanisms and reserve their cost; or the
    :class:`Refusal` when the ledger fails its checks, the round's DP cannot run as planned,
    or the budget cannot afford it (then nothing was reserved, or, for a reservation an
    earlier attempt made, nothing more)."""
    faults.point("site.ledger.open")
    try:  # checks the ledger against its anchor and the head the coordinator last saw
        ledger, note = privacy.open_ledger(plan, num_train, message.ledger_head)
    except StoreError as exc:
        return Refusal(exc, privacy.refusal_report(plan, str(exc)))
    try:
        reserved = _reserve(privacy, message, plan, num_train, ledger, note)
    except BaseException:
        privacy.discard(ledger)
        raise
    if isinstance(reserved, Refusal):
        privacy.put_back(ledger)
    return reserved


def _reserve(
    privacy: SitePrivacy, message: TrainInstruction, plan: PrivacyPlan, num_train: int, ledger: PrivacyLedger, note: str
) -> ReservedRound | Refusal:
    """:func:`reserve_round` once the ledger is open (the refusal's report read while it is)."""
    try:  # a round the site's DP cannot run as planned is refused before anything is reserved
        events = privacy.round_events(plan, ledger, num_train)
        dp = RoundDP.of(plan, events, num_train, message.weight, message.weight_scale or message.weight)
    except PrivacyError as exc:
        return Refusal(exc, privacy.report(ledger, [], status=PrivacyStatus.REFUSED, note=note))
    faults.point("site.ledger.reserve")
    try:
        reservation = ledger.reserve(message.round, events)  # durable and anchored, or raises
    except PrivacyError as exc:  # over budget, or reserved by an earlier attempt (released at most once)
        status = PrivacyStatus.EXHAUSTED if isinstance(exc, BudgetExhaustedError) else PrivacyStatus.REFUSED
        return Refusal(exc, privacy.report(ledger, events, status=status, note=note))
    except StoreError as exc:
        return Refusal(exc, privacy.refusal_report(plan, str(exc)))
    faults.point("site.ledger.reserved")
    return ReservedRound(privacy, message, plan, ledger, events, reservation, note, dp)
