"""A zone aggregator: push sessions, validation, streaming sums, reduce/forward,
residency policy and audit.

``aggregator``  the :class:`ZoneAggregator` role (lifecycle, push, forward, fetch)
``push``        one site's push as a transaction: validate, stage, commit
``state``       the state of an open round and the zone's counters
``policy``      what a zone enforces: residency, signatures, serving
``heap``        returning freed staging memory to the OS
``rpc/``        the gRPC data plane: proto, service, client, conversions
"""

__all__: list[str] = []
