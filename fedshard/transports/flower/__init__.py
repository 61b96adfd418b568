"""Flower adapters: the coordinator over Flower's Grid, sites as ClientApp handlers.

Control-plane messages travel as one ``ConfigRecord`` named ``fedshard`` whose
``payload`` is the JSON of a :mod:`fedshard.protocol.messages` model. Only metadata
goes through Flower; shards go to zones over gRPC. What relies on Flower's internals
(patches, the warm SuperNode) is in :mod:`fedshard.transports.flower.compat`, and only there.
"""
