"""``aggregator up --metrics-port P``: the run's metrics on P (from its event log), each
zone the host starts on the next port (P+1, P+2, …; P = 0: any free port for each)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedshard.observability.server import DEFAULT_METRICS_HOST, MetricsServer

__all__ = ["HostMetrics"]


class HostMetrics:
    """The metrics ports of an aggregator host (none when ``port`` is None)."""

    def __init__(self, port: int | None, host: str = DEFAULT_METRICS_HOST) -> None:
        self.port, self.host = port, host
        self._server: MetricsServer | None = None
        self._zones = 0  # zones started with a metrics port so far

    def serve_run(self, events: Path, connected: Callable[[], int | None]) -> str | None:
        """Serve the run logged in ``events`` (once); where, or None without a port."""
        if self.port is None:
            return None
        if self._server is None:
            from fedshard.observability.run_metrics import RunCollector

            self._server = MetricsServer([RunCollector(events, connected=connected)], self.port, self.host)
        return self._server.url

    def zone_args(self) -> list[str]:
        """The metrics options of the next zone the host starts (none without a port)."""
        if self.port is None:
            return []
        self._zones += 1
        port = self.port + self._zones if self.port else 0
        return ["--metrics-port", str(port), "--metrics-host", self.host]

    def close(self, snapshot: Path | None = None) -> None:
        """Stop serving the run's metrics (their last values first written to ``snapshot``, when given)."""
        if self._server is not None:
            self._server.close(snapshot)
            self._server = None
