"""gRPC data plane of a zone: generated stubs, the service, and the site/coordinator client.

``zone_pb2*.py`` are generated from ``zone.proto`` by ``make proto``; do not edit them.
"""
