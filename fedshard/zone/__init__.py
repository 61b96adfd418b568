"""A zone aggregator: push sessions, validation, streaming sums, reduce/forward,
residency policy and audit.

``aggregator``  the :class:`ZoneAggregator` role (lifecycle, push, forward, fetch)
``push``        one site's push as a transaction: validate, stage, commit
``intake``      taking in pushes: the manifest before any frame, a valid push folded whole
``calls``       the calls a zone serves, as its audit log and its authorisation name them
``norms``       the zone's reference of update norms, which bounds each push by default
``frames``      the one frame assembler of pushes, forwards and fetches
``forward``     partial sums of global shards, from zone to reducing zone (checks, sessions)
``reduce``      a zone's side of that reduction: receiving and sending partial sums
``publish``     a closed round's aggregates, and the zone's store of them
``state``       the state of an open round
``stats``       what the zone has done for its run: counters for summaries and metrics
``journal``     the round records on disk (open, published, aborted, lost)
``recovery``    a zone restarted on its store: lost rounds, torn and half-written files
``policy``      what a zone enforces: residency, signatures, serving
``heap``        returning freed staging memory to the OS
``rpc/``        the gRPC data plane: proto, service, client, conversions, refusal statuses
"""

__all__: list[str] = []
