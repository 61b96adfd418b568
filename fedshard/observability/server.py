"""Serve Prometheus metrics over HTTP (``GET /metrics``) while a zone, an aggregator or a
simulation runs (``--metrics-port``); see README, "Metrics".

The endpoint is plain, unauthenticated HTTP: it binds to loopback unless told otherwise
(``--metrics-host``), and says so in one warning line when it does not. The series name
sites, zones and each site's ε spent, no parameters or records (SECURITY.md, "Metrics").
``prometheus-client`` writes the exposition (``make_wsgi_app``); the connections are
served by :class:`~fedshard.transports.bounded_http.BoundedHttpServer`, so that idle
connections cost no thread and at most ``max_connections`` file descriptors (SECURITY.md,
"Resource exhaustion").
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from fedshard.errors import ConfigError, DeployError
from fedshard.transports.bounded_http import MAX_CONNECTIONS, REQUEST_S, TIMEOUT_S, BoundedHttpServer

if TYPE_CHECKING:
    from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["DEFAULT_METRICS_HOST", "SNAPSHOT_FILE", "MetricsServer", "is_loopback", "write_snapshot"]

log = logging.getLogger(__name__)

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where ``--metrics-port`` listens unless ``--metrics-host`` says otherwise."""

SNAPSHOT_FILE = "metrics.prom"
"""The run's last metrics, written into its folder when it ends (with ``--metrics-port``)."""


def write_snapshot(registry: CollectorRegistry, path: Path) -> None:
    """Write what ``registry`` exports now to ``path`` (atomically; a failure is logged, never
    raised: the run's own records are already written)."""
    from prometheus_client import generate_latest

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(generate_latest(registry))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("metrics: could not keep the last values in %s (%s)", path, exc.strerror or exc)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine's loopback only."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


class MetricsServer:
    """An HTTP server exporting ``collectors`` on ``host:port`` (port 0: any free port) until closed.

    At most ``max_connections`` connections at once (one more is closed at once); each
    must send its request within ``request_s`` and be done within ``timeout_s``
    (:mod:`fedshard.transports.bounded_http`). Bound off loopback, it warns once on
    stderr: the port is plain, unauthenticated HTTP.
    """

    def __init__(
        self,
        collectors: Iterable[Collector],
        port: int,
        host: str = DEFAULT_METRICS_HOST,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_s: float = REQUEST_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app  # only where metrics are served

        self.registry = CollectorRegistry()
        for collector in collectors:
            self.registry.register(collector)
        try:
            self._server = BoundedHttpServer(
                make_wsgi_app(self.registry),
                host,
                port,
                max_connections=max_connections,
                request_s=request_s,
                timeout_s=timeout_s,
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DeployError(f"metrics: port {port} on {host} is in use; choose another --metrics-port") from None
            raise ConfigError(f"metrics: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host = host
        self.port = self._server.port
        if not is_loopback(host):  # one line on stderr (logging's last resort prints it if nothing is set up)
            log.warning(
                "metrics on %s are plain, unauthenticated HTTP reachable from other machines; keep the port on a "
                "private network or behind an authenticating proxy (SECURITY.md, Metrics)",
                self.url,
            )

    @property
    def refused(self) -> int:
        """Connections closed at once because ``max_connections`` were open."""
        return self._server.refused

    @property
    def url(self) -> str:
        """Where to scrape, e.g. ``http://127.0.0.1:9100/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, snapshot: Path | None = None) -> None:
        """Stop serving; first write the last values to ``snapshot`` (when given), in the
        exposition format node_exporter's textfile collector reads, so a scrape that comes
        after a short run still finds them."""
        if snapshot is not None:
            write_snapshot(self.registry, snapshot)
        self._server.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
