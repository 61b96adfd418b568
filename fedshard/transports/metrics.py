"""Serve Prometheus metrics over HTTP (``GET /metrics``) while a zone, an aggregator or a
simulation runs (``--metrics-port``); see README, "Metrics".

The endpoint is plain, unauthenticated HTTP: it binds to loopback unless told otherwise
(``--metrics-host``). The series name sites, zones and each site's ε spent, no
parameters or records (SECURITY.md, "Metrics").
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from fedshard.errors import ConfigError, DeployError

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

__all__ = ["DEFAULT_METRICS_HOST", "MetricsServer"]

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where ``--metrics-port`` listens unless ``--metrics-host`` says otherwise."""


class MetricsServer:
    """An HTTP server exporting ``collectors`` on ``host:port`` (port 0: any free port) until closed."""

    def __init__(self, collectors: Iterable[Collector], port: int, host: str = DEFAULT_METRICS_HOST) -> None:
        from prometheus_client import CollectorRegistry, start_http_server  # only where metrics are served

        self.registry = CollectorRegistry()
        for collector in collectors:
            self.registry.register(collector)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DeployError(f"metrics: port {port} on {host} is in use; choose another --metrics-port") from None
            raise ConfigError(f"metrics: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host = host
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str:
        """Where to scrape, e.g. ``http://127.0.0.1:9100/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
