"""The coordinator: drives rounds over a :class:`~fedshard.protocol.channels.SiteGateway`
and the zones' lifecycle calls. It sees metadata only, never parameters or updates.

``coordinator``  round driving: open, train, close, evaluate; the run from start to stop
``_selection``   which sites take part in a round, and with what weight
``_discovery``   who answered the first query: sites bound to nodes, on one starting model
``_groups``      residency groups: one version chain each, and the rounds each site has not applied
``results``      what a round and a run produced (refusals with their codes), and the observer of them
``events``       the JSON-lines event log a run writes (and replays for status and summaries)
``recovery``     resuming a run from its event log: version chains, finished rounds, the next round
``_plans``       what sites are asked: each site's privacy plan, the server-side optimiser
``binding``      which node speaks for which site: each proves its site id, one node per id
``_replies``     what the coordinator takes from a site's reply, and what makes it the site's failure
``_reports``     each site's privacy reports between rounds
``ledger_book``  every site's privacy ledger across the runs of one federation
``_zone_calls``  open, close and abort a round at every zone (the reducing zone closes last)
``membership``   changing a running federation between rounds: zones added or drained, sites joining
``_timings``     where one round's time went and what it moved, logged with the round
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.coordinator.coordinator import Coordinator
    from fedshard.coordinator.events import EventLog
    from fedshard.coordinator.ledger_book import LedgerBook
    from fedshard.coordinator.membership import Membership, Reconfiguration
    from fedshard.coordinator.recovery import RunRecovery, recover
    from fedshard.coordinator.results import RoundResult, RunResult

__all__ = [
    "Coordinator",
    "EventLog",
    "LedgerBook",
    "Membership",
    "Reconfiguration",
    "RoundResult",
    "RunRecovery",
    "RunResult",
    "recover",
]

__getattr__ = lazy_surface(
    __name__,
    {
        "Coordinator": "coordinator",
        "EventLog": "events",
        "LedgerBook": "ledger_book",
        "Membership": "membership",
        "Reconfiguration": "membership",
        "RoundResult": "results",
        "RunRecovery": "recovery",
        "RunResult": "results",
        "recover": "recovery",
    },
)
