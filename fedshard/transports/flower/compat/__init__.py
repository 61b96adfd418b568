"""Flower compatibility: every place fedshard relies on Flower beyond its documented API
(``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp``, ``flwr.simulation``, ``flwr.common``),
in one package, listed in :data:`INTERNALS`.

``_release``       the one release line the internals were read in (:data:`~.release.SUPPORTED`)
``delivery``       the simulation engine's one-pass delivery of messages to its actors
``waits``          the SuperNode's and the Grid's fixed waits and object-pull backoffs, shortened
``supernode``      ``python -m fedshard.transports.flower.compat.supernode``: ``flower-supernode``
                   with those waits shortened
``warm_executor``  ``python -m fedshard.transports.flower.compat.warm_executor``: a SuperExec that
                   forks warm ClientApp processes
``warm_checks``    what ``fedshard site up`` checks before it runs the warm SuperNode
``control``        the aggregator's polled SuperLink queries, in-process instead of the ``flwr`` CLI

Every patch checks the release first and, where it can, the behaviour it relies on (a
state built as Flower builds it, a parser fed the option it needs); on any other Flower it
falls back to Flower's stock path and says why in one line. Nothing outside this package
names a Flower internal (``tests/unit/transports/test_flower_compat.py`` holds every module to it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["INTERNALS", "Internal", "missing_internals"]


@dataclass(frozen=True)
class Internal:
    """One Flower internal fedshard relies on: ``name`` (dotted, within ``module``), used by ``by``."""

    module: str
    name: str
    by: str


INTERNALS: tuple[Internal, ...] = (
    Internal("flwr.server.superlink.fleet.vce.vce_api", "add_messages_to_queue", "delivery"),
    Internal("flwr.server.superlink.linkstate.in_memory_linkstate", "InMemoryLinkState", "delivery"),
    Internal(
        "flwr.server.superlink.linkstate.in_memory_linkstate",
        "InMemoryLinkState._check_stored_messages",
        "delivery",
    ),
    Internal("flwr.supercore.date", "now", "delivery"),
    Internal("flwr.supernode.start_client_internal", "time", "supernode (its loop sleeps through it)"),
    Internal("flwr.supernode.cli.flower_supernode", "flower_supernode", "supernode"),
    Internal("flwr.supernode.cli.flower_supernode", "_parse_args_run_supernode", "warm_checks"),
    Internal("flwr.supernode.runtime.run_clientapp", "run_clientapp", "warm_executor"),
    Internal(
        "flwr.supernode.runtime.run_clientapp", "pull_and_inflate_object_from_tree", "waits (the ClientApp's pulls)"
    ),
    Internal("flwr.supernode.start_client_internal", "pull_objects", "waits (the SuperNode's pulls)"),
    Internal("flwr.superlink.grid.http_grid", "pull_objects", "waits (the ServerApp's pulls)"),
    Internal("flwr.supercore.runtime", "RuntimeHttpClient.AcquireTask", "warm_executor"),
    Internal("flwr.supercore.runtime", "RuntimeHttpClient.from_server_address", "warm_executor"),
    Internal("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor", "warm_executor"),
    Internal("flwr.supercore.interceptors", "SuperExecAuthHttpInterceptor", "warm_executor"),
    Internal("flwr.supercore.retry", "make_simple_http_retry_invoker", "warm_executor"),
    Internal("flwr.supercore.constant", "TaskType.CLIENT_APP", "warm_executor"),
    Internal("flwr.proto.runtime_pb2", "AcquireTaskRequest", "warm_executor"),
    Internal("flwr.cli.flower_config", "read_superlink_connection", "control"),
    Internal("flwr.cli.utils", "init_http_client_from_connection", "control"),
    Internal("flwr.cli.run_utils", "format_runs", "control"),
    Internal("flwr.supercore.control.control_http_client", "ControlHttpClient.ListRuns", "control"),
    Internal("flwr.supercore.control.control_http_client", "ControlHttpClient.ListNodes", "control"),
    Internal("flwr.proto.control_pb2", "ListRunsRequest", "control"),
    Internal("flwr.proto.control_pb2", "ListNodesRequest", "control"),
)
"""Every Flower internal fedshard relies on."""


def missing_internals(internals: tuple[Internal, ...] = INTERNALS) -> list[str]:
    """The entries of ``internals`` (default: all of :data:`INTERNALS`) the installed Flower
    lacks, as ``module:name``."""
    missing = []
    for internal in internals:
        try:
            found: object = importlib.import_module(internal.module)
            for part in internal.name.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            missing.append(f"{internal.module}:{internal.name}")
    return missing
