"""A zone aggregator: push sessions, validation, streaming sums, reduce/forward,
residency policy and audit.

``aggregator``  the :class:`ZoneAggregator` role (lifecycle, push, forward, fetch)
``_push``       one site's push as a transaction: validate, stage, commit
``_intake``     taking in pushes: the manifest before any frame, a valid push folded whole
``_calls``      the calls a zone serves, as its audit log and its authorisation name them
``_norms``      the zone's reference of update norms, which bounds each push by default
``frames``      the one frame assembler of pushes, forwards and fetches
``_forward``    partial sums of global shards, from zone to reducing zone (checks, sessions)
``_reduce``     a zone's side of that reduction: receiving and sending partial sums
``_publish``    a closed round's aggregates, and the zone's store of them
``_state``      the state of an open round
``_stats``      what the zone has done for its run: counters for summaries and metrics
``_journal``    the round records on disk (open, published, aborted, lost)
``recovery``    a zone restarted on its store: lost rounds, torn and half-written files
``policy``      what a zone enforces: residency, signatures, serving
``rpc/``        the gRPC data plane: proto, service, client, conversions, refusal statuses
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.zone.aggregator import ZoneAggregator
    from fedshard.zone.policy import ZonePolicy
    from fedshard.zone.recovery import ZoneRecovery

__all__ = ["ZoneAggregator", "ZonePolicy", "ZoneRecovery"]

__getattr__ = lazy_surface(
    __name__, {"ZoneAggregator": "aggregator", "ZonePolicy": "policy", "ZoneRecovery": "recovery"}
)
