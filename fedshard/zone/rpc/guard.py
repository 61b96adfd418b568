"""Stream admission and the watchdog: what one caller may hold of a zone's gRPC server.

The zone's gRPC server is synchronous: every call runs on a worker thread for as long
as it lasts, and a stream whose peer sends nothing holds its worker until it ends.
Anyone who reaches the port may open streams and never finish them, so the guard
bounds what a stream may hold (:class:`~fedshard.config.ZoneLimits`):

* **admission** — one party (the caller's certificate) holds at most
  ``streams_per_party`` Push, Forward and FetchAggregate streams at once; one more is
  refused at once with :attr:`~fedshard.errors.RefusalCode.LIMIT`, which frees its
  worker. Without mutual TLS there is no party to hold to (every channel of a process
  shares one connection), and no limit: the watchdog still applies;
* **the watchdog** — the zone charges a stream only for the time it *waits on the
  peer* (for the peer's next frame, or for the peer to take the zone's next frame).
  A stream waited on for ``idle_s`` in one go, or for longer in all than
  ``grace_s + bytes moved / min_rate``, is ended with
  :attr:`~fedshard.errors.RefusalCode.IDLE`. A stream of N bytes from a peer that
  keeps up ``min_rate`` therefore always completes, and an idle or trickling one is
  ended within ``idle_s`` (or ``grace_s``) plus one tick.

Every refusal goes to the zone's recorder (counted and audited), with the call and
the party. A stream the watchdog ended leaves its handler with
:class:`StreamEndedError` (a :class:`~fedshard.errors.ZoneError`, code ``idle``; already
recorded), so its push or forward session is
aborted and its staging bytes returned; its peer sees ``DEADLINE_EXCEEDED`` and the
reason, without the refusal-code metadata (a cancelled call carries no trailers).

:func:`pool_size` sizes the worker pool so that every party may hold its full
allowance and unary calls (Info, OpenRound, CloseRound) still find a worker.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import grpc

from fedshard.config import ZoneLimits
from fedshard.crypto.tls import PEER_CERT_KEY, peer_identity
from fedshard.errors import PkiError, RefusalCode, ZoneError
from fedshard.protocol.codes import one_line
from fedshard.zone.rpc.status import GRPC_STATUS

__all__ = [
    "RESERVE_WORKERS",
    "Recorder",
    "Stream",
    "StreamEndedError",
    "StreamGuard",
    "end_call",
    "party_of",
    "pool_size",
]

log = logging.getLogger(__name__)

RESERVE_WORKERS = 16
"""Workers beyond the parties' stream allowance: unary calls (Info, OpenRound,
CloseRound) and refusing the streams over a party's limit."""

Recorder = Callable[[str, str, RefusalCode, str], None]
"""Counts and audits a refusal: ``(call, caller, code, reason)``
(:meth:`~fedshard.zone.aggregator.ZoneAggregator.refused_call`)."""


class _Frame(Protocol):
    def ByteSize(self) -> int: ...  # noqa: N802 - protobuf's name


M = TypeVar("M", bound=_Frame)


class StreamEndedError(ZoneError):
    """Raised in the handler of a stream the watchdog ended (code ``idle``). The
    watchdog already counted and audited it: handlers must not record it again."""


def pool_size(limits: ZoneLimits, parties: int) -> int:
    """Worker threads for a zone that ``parties`` (sites and zones) may stream to:
    ``limits.workers`` if set, else each party's full allowance plus :data:`RESERVE_WORKERS`."""
    if limits.workers is not None:
        return limits.workers
    return max(parties, 1) * limits.streams_per_party + RESERVE_WORKERS


def party_of(context: grpc.ServicerContext, ca_pem: bytes | None) -> str | None:
    """Who holds a call's streams: ``role:name`` from its client certificate; the
    certificate's fingerprint if it names no identity the CA issued; None without mTLS."""
    if ca_pem is None:
        return None
    try:
        identity = peer_identity(context, ca_pem, role=None)
    except PkiError:
        certs = context.auth_context().get(PEER_CERT_KEY) or []
        if not certs:
            return None
        return "cert:" + hashlib.sha256(certs[0]).hexdigest()[:16]
    return f"{identity.role.value}:{identity.name}"


def end_call(context: grpc.ServicerContext, code: RefusalCode, reason: str) -> None:
    """End a call from outside its handler's thread: the peer gets ``code``'s status and
    the reason; the handler's blocked read (or send) returns at once.

    ``ServicerContext.cancel`` alone ends the call as CANCELLED; the call object under
    it can cancel with a status (grpc's core sends it as the call's trailers). That
    object is not public API, so a grpc without it falls back to the plain cancel
    (tests/unit/test_zone_guard.py checks which one runs).
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    cancel = getattr(call, "cancel", None)
    if cancel is not None:
        try:
            cancel(GRPC_STATUS[code].value[0], one_line(reason))
            return
        except TypeError:  # pragma: no cover - a grpc whose call takes no status
            pass
    context.cancel()


class Stream:
    """One admitted stream: the guard watches how long it waits on its peer.

    Use it as a context manager (leaving it gives the party's slot back), and read
    the peer's frames through :meth:`frames` or send the zone's through :meth:`replies`.
    """

    def __init__(self, guard: StreamGuard, call: str, caller: str, party: str | None, context: grpc.ServicerContext):
        self.call = call
        self.caller = caller
        self.party = party
        self.context = context
        self.moved = 0
        self.ended: str | None = None  # why the watchdog ended it
        self._guard = guard
        self._waited = 0.0
        self._since: float | None = None  # waiting on the peer since

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._guard._leave(self)

    def frames(self, iterator: Iterator[M]) -> Iterator[M]:
        """The peer's frames; raises :class:`StreamEndedError` once the watchdog ended the stream."""
        while True:
            self._wait()
            try:
                frame = next(iterator)
            except StopIteration:
                self._resume()
                return
            except grpc.RpcError:
                self._resume()
                raise
            self._resume()
            self.moved += frame.ByteSize()
            yield frame

    def replies(self, frames: Iterator[M]) -> Iterator[M]:
        """Yield the zone's frames, charging the time until the peer has taken each."""
        for frame in frames:
            self.moved += frame.ByteSize()
            self._wait()
            try:
                yield frame
            finally:
                self._resume()

    def _wait(self) -> None:
        with self._guard._lock:
            self._since = self._guard.clock()

    def _resume(self) -> None:
        with self._guard._lock:
            if self._since is not None:
                self._waited += self._guard.clock() - self._since
                self._since = None
            ended = self.ended
        if ended is not None:  # decided while waiting: whatever arrived since is dropped
            raise StreamEndedError(f"zone {self._guard.zone}: {ended}", RefusalCode.IDLE)

    def overdue(self, now: float, limits: ZoneLimits) -> str | None:
        """Why the zone should stop waiting on this stream at ``now`` (None: it need not).
        Call with the guard's lock held."""
        if self._since is None:
            return None
        waiting = now - self._since
        if waiting > limits.idle_s:
            return (
                f"{self.call} stream of {self.caller} sent nothing for {waiting:.0f}s "
                f"(limits.idle_s is {limits.idle_s:g})"
            )
        waited = self._waited + waiting
        allowed = limits.grace_s + self.moved / (limits.min_rate_kib_s * 1024)
        if waited > allowed:
            return (
                f"{self.call} stream of {self.caller} moved {self.moved} bytes in {waited:.0f}s of waiting; a "
                f"stream must keep up {limits.min_rate_kib_s:g} KiB/s after {limits.grace_s:g}s (limits.min_rate_kib_s)"
            )
        return None


class StreamGuard:
    """Admits streams within each party's limit and ends the ones overdue (see the module docstring).

    Parameters
    ----------
    zone:
        The zone's name, for reasons.
    limits:
        The zone's limits.
    record:
        Counts and audits each refusal (:data:`Recorder`).
    clock:
        Monotonic seconds (tests pass their own, and call :meth:`check`).
    watch:
        Run the watchdog thread (while any stream is admitted); False: only :meth:`check`.
    """

    def __init__(
        self,
        zone: str,
        limits: ZoneLimits,
        record: Recorder,
        *,
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
    ) -> None:
        self.zone = zone
        self.limits = limits
        self.clock = clock
        self._record = record
        self._watch = watch
        self._tick = min(limits.idle_s / 4, 1.0)
        self._lock = threading.Lock()
        self._streams: set[Stream] = set()
        self._held: collections.Counter[str] = collections.Counter()
        self._watcher: threading.Thread | None = None

    def held(self, party: str) -> int:
        """Streams ``party`` holds now."""
        with self._lock:
            return self._held[party]

    @property
    def open_streams(self) -> int:
        """Streams admitted and not yet ended."""
        with self._lock:
            return len(self._streams)

    def admit(self, call: str, context: grpc.ServicerContext, party: str | None) -> Stream:
        """Admit a ``call`` stream of ``party`` (None: no limit), or refuse it.

        Raises
        ------
        ZoneError
            With code :attr:`~RefusalCode.LIMIT`: the party already holds
            ``streams_per_party`` streams (the refusal is recorded).
        """
        caller = party if party is not None else context.peer()
        limit = self.limits.streams_per_party
        with self._lock:
            held = self._held[party] if party is not None else 0
            if held < limit or party is None:
                stream = Stream(self, call, caller, party, context)
                self._streams.add(stream)
                if party is not None:
                    self._held[party] += 1
                if self._watch and self._watcher is None:
                    self._watcher = threading.Thread(target=self._run, name=f"zone-{self.zone}-watchdog", daemon=True)
                    self._watcher.start()
                return stream
        reason = (
            f"{caller} already holds {held} streams at this zone; at most {limit} at once "
            "(limits.streams_per_party): finish or cancel one first"
        )
        self._record(call, caller, RefusalCode.LIMIT, reason)
        raise ZoneError(f"zone {self.zone}: {reason}", RefusalCode.LIMIT)

    def _leave(self, stream: Stream) -> None:
        with self._lock:
            if stream in self._streams:
                self._streams.discard(stream)
                if stream.party is not None:
                    self._held[stream.party] -= 1
                    if not self._held[stream.party]:
                        del self._held[stream.party]

    def check(self) -> list[Stream]:
        """End every stream overdue now; the streams ended."""
        now = self.clock()
        overdue: list[tuple[Stream, str]] = []
        with self._lock:
            for stream in self._streams:
                reason = stream.overdue(now, self.limits) if stream.ended is None else None
                if reason is not None:
                    stream.ended = reason  # before the cancel wakes its handler
                    overdue.append((stream, reason))
        for stream, reason in overdue:
            log.info("zone %s ended a stream (idle): %s", self.zone, reason)
            try:  # recorded before the peer hears of it; ended even if recording fails
                self._record(stream.call, stream.caller, RefusalCode.IDLE, reason)
            finally:
                end_call(stream.context, RefusalCode.IDLE, f"zone {self.zone}: {reason}")
        return [stream for stream, _ in overdue]

    def _run(self) -> None:
        """The watchdog: check every tick while any stream is admitted."""
        while True:
            time.sleep(self._tick)
            with self._lock:
                if not self._streams:
                    self._watcher = None
                    return
            try:
                self.check()
            except Exception:  # the watchdog must outlive one bad record
                log.exception("zone %s: watchdog check failed", self.zone)
