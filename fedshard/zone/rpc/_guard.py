"""Call admission and the watchdog: what one caller may hold of a zone's gRPC server.

The zone's gRPC server is synchronous: every call runs on a worker thread for as long
as it lasts, and a call whose peer sends nothing holds its worker until it ends. gRPC
Python reads a unary request inside the worker, before any handler runs, so the zone
registers every method as client-streaming (identical on the wire: clients keep their
unary stubs) and the guard admits each call *before* its request is read. Anyone who
reaches the port may open calls and never finish them, so the guard bounds what a call
may hold (:class:`~fedshard.config.ZoneLimits`):

* **admission** — one party (the caller's certificate) holds at most
  ``streams_per_party`` Push, Forward and FetchAggregate streams and at most
  ``calls_per_party`` OpenRound, CloseRound, Info and Reconfigure calls at once
  (:func:`allowance`); one more is refused at once with
  :attr:`~fedshard.errors.RefusalCode.LIMIT`, which frees its worker. A caller whose
  certificate fails its checks or names no member is refused by the service before
  the guard (:mod:`fedshard.zone.rpc._authority`). Without mutual TLS there is no
  party to hold to (every channel of a process shares one connection), and no limit:
  the watchdog still applies;
* **the watchdog** — the zone charges a call only for the time it *waits on the
  peer* (for its request or the peer's next frame, or for the peer to take the zone's
  next frame). A call waited on for ``idle_s`` in one go, or for longer in all than
  ``grace_s + bytes moved / min_rate``, is ended with
  :attr:`~fedshard.errors.RefusalCode.IDLE`. A stream of N bytes from a peer that
  keeps up ``min_rate`` therefore always completes, and an idle or trickling one (a
  unary call whose request never comes among them) is ended within ``idle_s`` (or
  ``grace_s``) plus one tick.

Every refusal goes to the zone's recorder (counted and audited), with the call and
the party. A call the watchdog ended leaves its handler with
:class:`StreamEndedError` (a :class:`~fedshard.errors.ZoneError`, code ``idle``; already
recorded), so its push or forward session is
aborted and its staging bytes returned; its peer sees ``DEADLINE_EXCEEDED`` and the
reason, without the refusal-code metadata (a cancelled call carries no trailers).

:func:`pool_size` sizes the worker pool so that every party may hold its full
allowance at once and refusals still find a worker.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from fedshard.config import ZoneLimits
from fedshard.errors import RefusalCode, ZoneError
from fedshard.protocol.codes import one_line
from fedshard.zone._calls import Call
from fedshard.zone.rpc._status import GRPC_STATUS

__all__ = [
    "COORDINATORS",
    "RESERVE_WORKERS",
    "STREAMS",
    "Allowance",
    "Recorder",
    "Stream",
    "StreamEndedError",
    "StreamGuard",
    "allowance",
    "end_call",
    "pool_size",
]

log = logging.getLogger(__name__)

RESERVE_WORKERS = 16
"""Workers beyond the parties' allowances: refusing the calls over a party's limit (each
holds a worker for milliseconds) and the calls of a zone without mutual TLS."""

COORDINATORS = 1
"""Parties that make unary calls only, beyond the sites and zones: the coordinator."""

STREAMS = frozenset({Call.PUSH, Call.FORWARD, Call.FETCH})
"""The streaming calls; every other call is unary (``calls_per_party``)."""

Recorder = Callable[[str, str, RefusalCode, str], None]
"""Counts and audits a refusal: ``(call, caller, code, reason)``
(:meth:`~fedshard.zone.aggregator.ZoneAggregator.refused_call`)."""


class _Frame(Protocol):
    def ByteSize(self) -> int: ...  # noqa: N802 - protobuf's name


M = TypeVar("M", bound=_Frame)
R = TypeVar("R", bound=_Frame | bytes)
"""A frame the zone sends: a message, or one already serialised."""


class StreamEndedError(ZoneError):
    """Raised in the handler of a stream the watchdog ended (code ``idle``). The
    watchdog already counted and audited it: handlers must not record it again."""


@dataclass(frozen=True)
class Allowance:
    """How many calls of one kind a party may hold at once, and the setting that says so."""

    kind: str  # "streams" or "unary calls", for reasons
    noun: str  # one of them: "stream" or "call"
    setting: str  # the ZoneLimits field
    limit: int


def allowance(call: Call, limits: ZoneLimits) -> Allowance:
    """The allowance ``call`` is admitted under: streams (:data:`STREAMS`) or unary calls."""
    if call in STREAMS:
        return Allowance("streams", "stream", "streams_per_party", limits.streams_per_party)
    return Allowance("unary calls", "call", "calls_per_party", limits.calls_per_party)


def pool_size(limits: ZoneLimits, parties: int) -> int:
    """Worker threads for a zone that ``parties`` (sites and zones) may call:
    ``limits.workers`` if set, else every party's full allowance (streams and unary
    calls), the coordinator's unary calls (:data:`COORDINATORS`) and
    :data:`RESERVE_WORKERS`. Even if every member holds all it may, a refusal and
    every honest call still find a worker."""
    if limits.workers is not None:
        return limits.workers
    per_party = limits.streams_per_party + limits.calls_per_party
    return max(parties, 1) * per_party + COORDINATORS * limits.calls_per_party + RESERVE_WORKERS


def end_call(context: grpc.ServicerContext, code: RefusalCode, reason: str) -> None:
    """End a call from outside its handler's thread: the peer gets ``code``'s status and
    the reason; the handler's blocked read (or send) returns at once.

    ``ServicerContext.cancel`` alone ends the call as CANCELLED; the call object under
    it can cancel with a status (grpc's core sends it as the call's trailers). That
    object is not public API, so a grpc without it falls back to the plain cancel
    (tests/unit/zone/test_zone_guard.py checks which one runs).
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
    """One admitted call (a stream, or a unary call): the guard watches how long it waits on its peer.

    Use it as a context manager (leaving it gives the party's slot back), and read
    the peer's frames through :meth:`frames` (a unary call's one request through
    :meth:`request`) or send the zone's through :meth:`replies`.
    """

    def __init__(
        self,
        guard: StreamGuard,
        call: str,
        caller: str,
        slot: tuple[str, str] | None,
        context: grpc.ServicerContext,
        noun: str = "stream",
    ) -> None:
        self.call = call
        self.noun = noun  # for reasons: "stream" or "call"
        self.caller = caller
        self.slot = slot  # (party, allowance kind) whose count it holds; None: no limit
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

    def request(self, requests: Iterator[M]) -> M:
        """A unary call's request: the peer's first frame, waited for as any other.

        Raises
        ------
        StreamEndedError
            The watchdog ended the call while its request did not come (already recorded).
        ZoneError
            With code :attr:`~RefusalCode.PROTOCOL`: the peer closed without a request
            (not recorded: the caller records it).
        """
        for frame in self.frames(requests):
            return frame
        raise ZoneError(
            f"zone {self._guard.zone}: the {self.call} call ended before its request message", RefusalCode.PROTOCOL
        )

    def replies(self, frames: Iterable[R]) -> Iterator[R]:
        """Yield the zone's frames (messages, or serialised ones), charging the time until the peer has taken each."""
        for frame in frames:
            self.moved += len(frame) if isinstance(frame, bytes) else frame.ByteSize()
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
                f"{self.call} {self.noun} of {self.caller} sent nothing for {waiting:.0f}s "
                f"(limits.idle_s is {limits.idle_s:g})"
            )
        waited = self._waited + waiting
        allowed = limits.grace_s + self.moved / (limits.min_rate_kib_s * 1024)
        if waited > allowed:
            return (
                f"{self.call} {self.noun} of {self.caller} moved {self.moved} bytes in {waited:.0f}s of waiting; a "
                f"stream must keep up {limits.min_rate_kib_s:g} KiB/s after {limits.grace_s:g}s (limits.min_rate_kib_s)"
            )
        return None


class StreamGuard:
    """Admits calls within each party's allowance and ends the ones overdue (see the module docstring).

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
        self._held: collections.Counter[tuple[str, str]] = collections.Counter()  # (party, kind) → calls
        self._watcher: threading.Thread | None = None

    def held(self, party: str, call: Call = Call.PUSH) -> int:
        """Calls of ``call``'s allowance (streams by default) ``party`` holds now."""
        with self._lock:
            return self._held[party, allowance(call, self.limits).kind]

    @property
    def open_streams(self) -> int:
        """Calls (streams and unary calls) admitted and not yet ended."""
        with self._lock:
            return len(self._streams)

    def admit(self, call: Call, context: grpc.ServicerContext, party: str | None) -> Stream:
        """Admit a ``call`` of ``party`` (``role:name``; None: no limit) within its allowance, or refuse it.

        Raises
        ------
        ZoneError
            With code :attr:`~RefusalCode.LIMIT`: the party already holds its
            :func:`allowance` of such calls (the refusal is recorded).
        """
        caller = party if party is not None else context.peer()
        rule = allowance(call, self.limits)
        slot = (party, rule.kind) if party is not None else None
        with self._lock:
            held = self._held[slot] if slot is not None else 0
            if slot is None or held < rule.limit:
                stream = Stream(self, call, caller, slot, context, rule.noun)
                self._streams.add(stream)
                if slot is not None:
                    self._held[slot] += 1
                if self._watch and self._watcher is None:
                    self._watcher = threading.Thread(target=self._run, name=f"zone-{self.zone}-watchdog", daemon=True)
                    self._watcher.start()
                return stream
        reason = (
            f"{caller} already holds {held} {rule.kind} at this zone; at most {rule.limit} at once "
            f"(limits.{rule.setting}): finish or cancel one first"
        )
        self._record(call, caller, RefusalCode.LIMIT, reason)
        raise ZoneError(f"zone {self.zone}: {reason}", RefusalCode.LIMIT)

    def _leave(self, stream: Stream) -> None:
        with self._lock:
            if stream in self._streams:
                self._streams.discard(stream)
                if stream.slot is not None:
                    self._held[stream.slot] -= 1
                    if not self._held[stream.slot]:
                        del self._held[stream.slot]

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
