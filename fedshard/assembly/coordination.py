"""The coordinator, wired the same way for every engine: the in-process simulation and the
Flower ServerApp (simulated or deployed) hand :func:`coordinate` the parts only they can
make (the gateway to their sites, the zone clients, where membership changes come from)
and get the run's result; the run's stop is journalled however it ends, and the zone
clients and the membership source are closed."""

from __future__ import annotations

from collections.abc import Mapping

from fedshard.config import FederationConfig
from fedshard.coordinator.binding import SiteKeys
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.events import EventLog
from fedshard.coordinator.ledger_book import LedgerBook
from fedshard.coordinator.membership import Membership
from fedshard.coordinator.recovery import RunRecovery, recover
from fedshard.coordinator.results import RoundObserver, RunResult
from fedshard.protocol.channels import SiteGateway, ZoneClient

__all__ = ["coordinate"]


def coordinate(
    config: FederationConfig,
    sites: SiteGateway,
    zones: Mapping[str, ZoneClient],
    endpoints: Mapping[str, str],
    journal: EventLog,
    *,
    observer: RoundObserver | None = None,
    recovery: RunRecovery | None = None,
    resume: bool = False,
    membership: Membership | None = None,
    ledger_heads: str | None = None,
    site_keys: SiteKeys | None = None,
) -> RunResult:
    """Run the federation's rounds to the end (see :class:`~fedshard.coordinator.coordinator.Coordinator`).

    ``recovery``: what the run recorded, when carrying it on (``resume``: read it from
    ``journal`` here); ``ledger_heads``: the file where the coordinator keeps every site's
    ledger head across runs (a deployment's). ``journal`` records the stop: the run's reason
    (empty when it completed), or the error that ended it, which is raised on. ``zones`` and
    ``membership`` are closed afterwards.
    """
    try:
        if recovery is None and resume:
            recovery = recover(journal.path)
        book = LedgerBook(ledger_heads, config.federation.name) if ledger_heads else None
        coordinator = Coordinator(
            config,
            sites,
            zones,
            endpoints,
            observer,
            journal=journal,
            recovery=recovery,
            membership=membership,
            ledger_book=book,
            site_keys=site_keys,
        )
        result = coordinator.run()
        journal.on_stop(result.stopped_reason)
        return result
    except Exception as exc:
        journal.on_stop(str(exc))
        raise
    finally:
        for zone in zones.values():
            zone.close()
        if membership is not None:
            membership.close()
