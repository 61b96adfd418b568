"""The two questions a deployed aggregator asks its SuperLink every few seconds (which
SuperNodes are online, what state the run is in), asked in-process over one Control API
client instead of by starting the ``flwr`` CLI twice per poll.

Each ``flwr`` process imports Flower's CLI before it asks (about 0.8 s of a core); an
aggregator polling every 5 s spent a sixth of a core on it while the federation ran. The
client here is the one the CLI builds (``init_http_client_from_connection`` on the
connection in ``$FLWR_HOME/config.toml``), kept open between polls. It relies on Flower's
CLI internals: :func:`open_control` checks the release and the names first and returns
None (the caller keeps the CLI) with one log line when they differ.

Who may send: only the aggregator host, to its own SuperLink, over the connection (and
TLS root) it wrote; the replies are Flower's own and are read as the CLI reads them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from pathlib import Path
from typing import Any
from unittest import mock

from fedshard.transports.flower.compat import INTERNALS, missing_internals
from fedshard.transports.flower.compat._release import release_problem

__all__ = ["ControlClient", "open_control"]

log = logging.getLogger(__name__)

_PROTO = "flwr.proto.control_pb2"

_USES = tuple(i for i in INTERNALS if i.by == "control")
"""The Flower internals this module uses (what the CLI's ``ls`` commands call)."""


class ControlClient:
    """One open Control API client of a SuperLink (see the module docstring)."""

    def __init__(self, modules: dict[str, Any], client: Any) -> None:
        self._m = modules
        self._client = client

    def node_statuses(self) -> list[tuple[str, str]]:
        """(node id, status) of every SuperNode the SuperLink knows (``flwr supernode list``)."""
        reply = self._client.ListNodes(self._m[_PROTO].ListNodesRequest())
        return [(str(n.node_id), str(n.status)) for n in reply.nodes_info]

    def run_status(self, run_id: str) -> str:
        """The run's status as ``flwr list --run-id`` prints it (e.g. ``finished:completed``); empty if unknown."""
        from flwr.common.serde import run_from_proto

        reply = self._client.ListRuns(self._m[_PROTO].ListRunsRequest(run_id=int(run_id)))
        runs = [run_from_proto(p) for p in reply.run_dict.values()]
        rows = self._m["flwr.cli.run_utils"].format_runs(runs, reply.now)
        return str(rows[0].status_text) if rows else ""

    def close(self) -> None:
        """Close the client's connection (idempotent)."""
        with contextlib.suppress(Exception):
            self._client.close()


def open_control(flwr_home: Path, connection: str) -> ControlClient | None:
    """A Control API client on ``connection`` of ``flwr_home``'s config, or None (one log line)
    when the installed Flower is not the release these internals were read in, lacks one of
    them, or the client cannot be built."""
    problem = release_problem("the in-process SuperLink queries")
    if problem is None and (missing := missing_internals(_USES)):
        problem = f"the installed Flower lacks {', '.join(missing)}"
    if problem is None:
        modules = {i.module: importlib.import_module(i.module) for i in _USES}
        try:
            with mock.patch.dict(os.environ, {"FLWR_HOME": str(flwr_home)}):  # where the CLI reads its connection
                found = modules["flwr.cli.flower_config"].read_superlink_connection(connection)
                client = modules["flwr.cli.utils"].init_http_client_from_connection(found)
            return ControlClient(modules, client)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
    log.info("asking the SuperLink through the flwr CLI (%s)", problem)
    return None
