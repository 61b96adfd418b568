"""``--metrics-port`` and ``--metrics-host``: the options that serve Prometheus metrics
from ``fedshard simulate``, ``fedshard zone up`` and ``fedshard aggregator up``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from fedshard.observability.server import DEFAULT_METRICS_HOST

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from fedshard.observability.server import MetricsServer

__all__ = ["MetricsHostOpt", "MetricsPortOpt", "start_metrics"]

MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus metrics on this port (GET /metrics; 0: any free port); see README, Metrics",
    ),
]
MetricsHostOpt = Annotated[
    str,
    typer.Option("--metrics-host", help="Address the metrics port listens on (plain HTTP: keep it private)"),
]


def start_metrics(
    collectors: Iterable[Collector], port: int | None, host: str, console: Console, what: str
) -> MetricsServer | None:
    """Serve ``collectors`` on ``host:port`` and say where (None: no ``--metrics-port``)."""
    if port is None:
        if host != DEFAULT_METRICS_HOST:
            from fedshard.errors import FedshardError

            raise FedshardError("--metrics-host needs --metrics-port")
        return None
    from fedshard.observability.server import MetricsServer

    server = MetricsServer(collectors, port, host)
    console.print(f"{what} metrics: {server.url}", highlight=False, soft_wrap=True)
    return server
