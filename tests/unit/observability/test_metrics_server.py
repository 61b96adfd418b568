"""The metrics port's HTTP server: bounded connections, deadlines, one thread (issue 32, item 10)."""

from __future__ import annotations

import gzip
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fedshard.errors import DeployError
from fedshard.observability.server import MetricsServer, is_loopback


class _Gauge(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("fedshard_test_value", "a value")
        family.add_metric([], 3.0)
        yield family


@pytest.fixture()
def server() -> Iterator[MetricsServer]:
    with MetricsServer([_Gauge()], 0, max_connections=4, request_s=0.5, timeout_s=2.0) as metrics:
        yield metrics


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_scrape_gets_the_exposition_plain_or_gzipped(server: MetricsServer) -> None:
    with urllib.request.urlopen(server.url, timeout=5) as reply:
        assert "fedshard_test_value 3.0" in reply.read().decode()
    request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.headers["Content-Encoding"] == "gzip"
        assert b"fedshard_test_value 3.0" in gzip.decompress(reply.read())


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"not http\r\n\r\n", b"400"),
        (b"GET /" + b"a" * (20 << 10) + b" HTTP/1.1\r\n\r\n", b"431"),
    ],
)
def test_what_is_not_a_small_get_gets_one_status_line(
    server: MetricsServer, request_head: bytes, status: bytes
) -> None:
    assert _exchange(server.port, request_head).startswith(b"HTTP/1.0 " + status)


def test_beyond_the_bound_a_connection_is_closed_at_once_and_no_thread_is_started(server: MetricsServer) -> None:
    threads = threading.active_count()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(4)]
    time.sleep(0.1)  # accepted: every slot is taken
    try:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
                extra.settimeout(0.4)  # well before the held ones' request_s
                assert _closed_by_peer(extra)
        except ConnectionResetError:  # closed before connect() returned
            pass
        assert server.refused == 1
        assert threading.active_count() <= threads
    finally:
        for sock in held:
            sock.close()


def test_a_connection_that_sends_no_request_is_closed_at_its_deadline_and_its_slot_comes_back(
    server: MetricsServer,
) -> None:
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(4)]
    try:
        held[0].settimeout(5)
        started = time.monotonic()
        assert _closed_by_peer(held[0])  # request_s (0.5 s) passed without a request
        assert time.monotonic() - started < 4
        with urllib.request.urlopen(server.url, timeout=5) as reply:  # slots free again
            assert reply.status == 200
    finally:
        for sock in held:
            sock.close()


def test_a_slow_reader_is_cut_at_the_exchange_deadline(server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # a head that never ends: closed at request_s
        sock.settimeout(5)
        assert _closed_by_peer(sock)


def test_bound_off_loopback_it_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fedshard.observability.server"):
        with MetricsServer([], 0, host="127.0.0.1"):
            pass
        assert not caplog.records
        with MetricsServer([], 0, host="0.0.0.0") as metrics:
            pass
    [record] = caplog.records
    assert "plain, unauthenticated HTTP" in record.getMessage() and str(metrics.port) in record.getMessage()
    assert "\n" not in record.getMessage()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        *[("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True)],
        *[("0.0.0.0", False), ("10.0.0.5", False), ("::", False), ("metrics.example.org", False)],
    ],
)
def test_loopback_addresses_are_recognised(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_port_in_use_is_one_deploy_error(server: MetricsServer) -> None:
    with pytest.raises(DeployError, match=f"port {server.port} on 127.0.0.1 is in use"):
        MetricsServer([], server.port)


def test_closing_stops_serving(server: MetricsServer) -> None:
    server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)
