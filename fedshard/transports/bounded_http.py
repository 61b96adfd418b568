"""A small HTTP/1 server for one WSGI app whose cost anyone who reaches its port can bound.

The metrics port (``--metrics-port``) is plain HTTP that anyone on the network path
may open. ``prometheus-client``'s own server (``http.server`` with a thread per
connection, no timeout) gives every idle connection a thread and a file descriptor
until the peer hangs up: 1,100 idle connections took a zone from 11 to 1,111 threads,
and under ``ulimit -n 1024`` its gRPC data plane stopped. This server bounds them:

* **one thread** runs every connection (a :mod:`selectors` loop): an idle connection
  costs a file descriptor and a few hundred bytes, never a thread;
* **at most** ``max_connections`` **at once**: a connection beyond them is closed as
  soon as it is accepted (counted in :attr:`BoundedHttpServer.refused`);
* **deadlines**: a connection must send its whole request head within ``request_s``
  of being accepted, and the exchange (the reply sent) must end within ``timeout_s``;
  past either it is closed. A request head over :data:`MAX_REQUEST_BYTES` is refused.

Each connection carries one request (``Connection: close``, as HTTP/1.0); only GET is
served. The reply is what the WSGI app returns (:mod:`wsgiref` writes it), built in the
loop thread: the app must be quick (a scrape is).
"""

from __future__ import annotations

import contextlib
import io
import logging
import selectors
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.handlers import SimpleHandler

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_REQUEST_BYTES",
    "REQUEST_S",
    "TIMEOUT_S",
    "BoundedHttpServer",
    "WsgiApp",
]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
"""Connections served at once; one more is closed as soon as it is accepted."""

REQUEST_S = 5.0
"""Seconds a connection has, from being accepted, to send its whole request head."""

TIMEOUT_S = 30.0
"""Seconds a connection may last in all (its reply sent), from being accepted."""

MAX_REQUEST_BYTES = 16 << 10
"""The largest request head (request line and headers) served; a longer one gets 431."""

_TICK_S = 0.5  # the loop wakes at least this often (deadlines, close)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
"""A WSGI application (e.g. ``prometheus_client.make_wsgi_app(registry)``)."""


@dataclass
class _Connection:
    """One accepted connection: the request head it sent so far, then the reply it is sent."""

    sock: socket.socket
    peer: tuple[Any, ...]
    request_by: float  # monotonic deadline of the request head
    close_by: float  # monotonic deadline of the whole exchange
    received: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None  # set once the head is in: what is left to send


class BoundedHttpServer:
    """Serve ``app`` on ``host:port`` (port 0: any free port) from one thread, bounded (see the module docstring).

    Parameters
    ----------
    app:
        The WSGI application that answers every GET.
    host, port:
        Where to listen.
    max_connections:
        Connections served at once; beyond, a new connection is closed at once.
    request_s:
        Seconds from accept to the end of the request head.
    timeout_s:
        Seconds from accept to the reply sent.

    Raises
    ------
    OSError
        The address cannot be bound (in use, not this machine's, unknown host).
    """

    def __init__(
        self,
        app: WsgiApp,
        host: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_s: float = REQUEST_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        if max_connections < 1 or request_s <= 0 or timeout_s < request_s:
            raise ValueError(
                f"max_connections ({max_connections}) must be ≥ 1 and 0 < request_s ({request_s}) ≤ timeout_s "
                f"({timeout_s})"
            )
        self.app = app
        self.max_connections = max_connections
        self.request_s = request_s
        self.timeout_s = timeout_s
        self.refused = 0  # connections closed at once because max_connections were open
        self.expired = 0  # connections closed at a deadline
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        self._connections: dict[socket.socket, _Connection] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"http-{self.port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving: close every connection and the port."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"x")
        self._thread.join(timeout=5)
        self._wake_writer.close()

    # -- the loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self._selector.select(self._next_wakeup()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_reader:
                        with contextlib.suppress(OSError):
                            self._wake_reader.recv(64)
                    else:
                        self._step(key.data, events)
                self._expire(time.monotonic())
        except Exception:  # the metrics port must never take its process down
            log.exception("metrics: the HTTP server on port %d stopped", self.port)
        finally:
            for connection in list(self._connections.values()):
                self._close(connection)
            self._selector.close()
            self._listener.close()
            self._wake_reader.close()

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        deadlines = [c.request_by if c.reply is None else c.close_by for c in self._connections.values()]
        return max(0.0, min([_TICK_S, *(d - now for d in deadlines)]))

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: the process is out of descriptors; try again next tick
                log.warning("metrics: cannot accept a connection on port %d: %s", self.port, exc)
                return
            if len(self._connections) >= self.max_connections:
                self.refused += 1
                _hang_up(sock)
                continue
            sock.setblocking(False)
            now = time.monotonic()
            connection = _Connection(sock, peer, now + self.request_s, now + self.timeout_s)
            self._connections[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _expire(self, now: float) -> None:
        for connection in list(self._connections.values()):
            deadline = connection.request_by if connection.reply is None else connection.close_by
            if now >= deadline:
                self.expired += 1
                self._close(connection)

    def _step(self, connection: _Connection, events: int) -> None:
        try:
            if connection.reply is None and events & selectors.EVENT_READ:
                self._read(connection)
            elif connection.reply is not None and events & selectors.EVENT_WRITE:
                self._write(connection, connection.reply)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # reset by the peer, broken pipe: nothing more to say to it
            self._close(connection)

    def _read(self, connection: _Connection) -> None:
        data = connection.sock.recv(65536)
        if not data:  # the peer closed before its request was complete
            self._close(connection)
            return
        connection.received += data
        end = connection.received.find(b"\r\n\r\n")
        if end < 0 and len(connection.received) <= MAX_REQUEST_BYTES:
            return
        if end < 0 or end > MAX_REQUEST_BYTES:
            reply = _plain(431, "Request Header Fields Too Large")
        else:
            reply = self._respond(bytes(connection.received[:end]))
        connection.reply = memoryview(reply)
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._write(connection, connection.reply)

    def _write(self, connection: _Connection, reply: memoryview) -> None:
        sent = connection.sock.send(reply)
        connection.reply = reply[sent:]
        if not connection.reply:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_WR)
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(connection.sock)
        connection.sock.close()

    # -- HTTP --------------------------------------------------------------------------------------
    def _respond(self, head: bytes) -> bytes:
        """The whole reply to a request ``head`` (request line and headers, without the blank line)."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _plain(400, "Bad Request")
        method, target, protocol = parts
        if method != "GET":
            return _plain(405, "Method Not Allowed", [("Allow", "GET")])
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": urllib.parse.unquote(path, "latin-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": self.host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": protocol,
            "CONTENT_LENGTH": "0",
        }
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep and name.strip():
                environ["HTTP_" + name.strip().upper().replace("-", "_")] = value.strip()
        out, errors = io.BytesIO(), io.StringIO()
        handler = SimpleHandler(io.BytesIO(), out, errors, environ, multithread=False)
        handler.os_environ = {}  # wsgiref would copy the process's environment into the request's (CGI)
        handler.run(self.app)  # an HTTP/1.0 reply: it ends when the connection does
        if errors.getvalue():
            log.warning("metrics: the exporter failed: %s", errors.getvalue().strip().splitlines()[-1])
        return out.getvalue()


def _plain(status: int, reason: str, headers: list[tuple[str, str]] | None = None) -> bytes:
    """A short text reply with ``status``."""
    body = f"{status} {reason}\n".encode()
    lines = [f"HTTP/1.0 {status} {reason}", "Content-Type: text/plain", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers or ()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _hang_up(sock: socket.socket) -> None:
    """Close ``sock`` at once, with a reset rather than a lingering close (no TIME_WAIT kept here)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
