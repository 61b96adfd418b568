"""One round of a site with DP on: admit the plan, open the ledger, reserve the round's cost,
release, commit.

The site's own terms and its ledger decide before anything leaves the site: a plan weaker
than the site's own config (:mod:`fedshard.site.terms`), a round its DP cannot run as
planned, or one the budget cannot afford, is refused before the reservation; a
reservation that is never committed (crash, push refused) stays counted as spent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fedshard import faults
from fedshard.errors import BudgetExhaustedError, FedshardError, PrivacyError, RoundError, StoreError
from fedshard.protocol.messages import PrivacyPlan, PrivacyReport, PrivacyStatus, TrainInstruction, TrainReport
from fedshard.site.privacy import RoundDP, SitePrivacy

__all__ = ["Refuse", "private_round", "refused"]

log = logging.getLogger(__name__)

Refuse = Callable[[FedshardError, PrivacyReport | None], TrainReport]
"""Builds the report of a refused round (the error, and the privacy report to send with it)."""


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


def private_round(
    privacy: SitePrivacy,
    message: TrainInstruction,
    plan: PrivacyPlan,
    num_train: int,
    release: Callable[[RoundDP], TrainReport],
    refuse: Refuse,
) -> TrainReport:
    """Run ``message``'s round under the site's ledger with ``plan`` (what :meth:`SitePrivacy.admit`
    made of the message's plan): ``release`` trains and pushes under the round's DP (raising
    :class:`PrivacyError` or :class:`RoundError` when it cannot); the returned report carries
    the site's privacy report."""
    faults.point("site.ledger.open")
    try:  # checks the ledger against its anchor and the head the coordinator last saw
        ledger, note = privacy.open_ledger(plan, num_train, message.ledger_head)
    except StoreError as exc:
        return refuse(exc, privacy.refusal_report(plan, str(exc)))
    with ledger:
        try:  # a round the site's DP cannot run as planned is refused before anything is reserved
            events = privacy.round_events(plan, ledger, num_train)
            dp = RoundDP.of(plan, events, num_train / message.weight)
        except PrivacyError as exc:
            return refuse(exc, privacy.report(ledger, [], status=PrivacyStatus.REFUSED, note=note))
        faults.point("site.ledger.reserve")
        try:
            reservation = ledger.reserve(message.round, events)  # durable and anchored, or raises
        except PrivacyError as exc:  # over budget, or reserved by an earlier attempt (released at most once)
            status = PrivacyStatus.EXHAUSTED if isinstance(exc, BudgetExhaustedError) else PrivacyStatus.REFUSED
            return refuse(exc, privacy.report(ledger, events, status=status, note=note))
        except StoreError as exc:
            return refuse(exc, privacy.refusal_report(plan, str(exc)))
        faults.point("site.ledger.reserved")
        try:
            report = release(dp)
        except (PrivacyError, RoundError) as exc:
            return refuse(exc, privacy.report(ledger, events, status=PrivacyStatus.REFUSED, note=note))
        faults.point("site.ledger.commit")
        try:
            ledger.commit(reservation)
        except StoreError as exc:  # released and counted; the reservation stays spent
            log.warning("site %s: round %d: %s", privacy.site_id, message.round, exc)
            return report.model_copy(update={"privacy": privacy.refusal_report(plan, str(exc))})
        faults.point("site.ledger.committed")
        hint = message.projection_hint
        shown = privacy.report(ledger, events, note=note, hint=hint)
        return report.model_copy(update={"privacy": shown})
