"""The zone's gRPC service: maps the wire protocol onto :class:`ZoneAggregator`.

Errors leave as a refusal: a gRPC status chosen from the error's
:class:`~fedshard.errors.RefusalCode`, the code in the trailing metadata and the
one-line reason as details (:mod:`fedshard.zone.rpc._status`); nothing else (no
traceback, no internal state) leaves the zone.

Every call is admitted before its request is read (:meth:`ZoneService.handlers`): gRPC
Python reads a unary request inside the worker thread, so a call whose request never
came used to hold a worker before any of this code ran. Each method is therefore
registered at the server as client-streaming (identical on the wire: clients keep their
plain unary and server-streaming stubs); its caller's certificate is checked first (a
non-member is refused at once and audited; the handler checks the role), then the
zone's :class:`~fedshard.zone.rpc._guard.StreamGuard` admits it within its party's
allowance (``limits.streams_per_party`` streams, ``limits.calls_per_party`` unary
calls) and its watchdog ends a call that waits on its peer too long, a request that
never comes among them (:mod:`fedshard.zone.rpc._guard`). The handler bodies below
then see the request as for any unary call.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc

from fedshard.config import ZoneLimits
from fedshard.crypto.identity import Identity
from fedshard.crypto.tls import PEER_CERT_KEY, TlsFiles
from fedshard.errors import FedshardError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import Manifest
from fedshard.protocol.codes import refusal_code
from fedshard.protocol.rounds import DEFAULT_GROUP, Aggregate, PartialSum, RoundSpec
from fedshard.zone._calls import Call
from fedshard.zone._forward import ForwardSession
from fedshard.zone._push import PushSession
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc._authority import Authority, Members, caller_name
from fedshard.zone.rpc._guard import Stream, StreamEndedError, StreamGuard, pool_size
from fedshard.zone.rpc._status import abort_with
from fedshard.zone.rpc.convert import aggregate_frames, chunk_of, server_options, summary_to_header

if TYPE_CHECKING:
    from fedshard.zone.policy import ZonePolicy

__all__ = ["MEMBERSHIP_DIGEST_CHARS", "Reload", "SERVED_FRAMES_BYTES", "SERVICE", "ZoneService", "serve"]

MEMBERSHIP_DIGEST_CHARS = 64
"""A ``Reconfigure`` request's membership digest: hex SHA-256, exactly this long."""

Reload = Callable[[str, str], "ZonePolicy"]
"""``reload(membership_digest, by)``: re-read the zone's membership from where it was
started (its config file and key folder), check it matches the digest, give it to the
zone; the zone's new policy (:class:`fedshard.membership.zone_reload.ZoneReload`)."""

SERVED_FRAMES_BYTES = 64 << 20
"""A zone keeps the serialised reply frames of published aggregates up to this many bytes in all
(forgotten all at once beyond), as every site of a round fetches the same one; a larger aggregate's
frames are written as the stream takes them, so serving it holds one frame at a time."""

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Zone"].full_name
"""The gRPC service a zone serves (``fedshard.zone.v1.Zone``)."""

_Reply = TypeVar("_Reply")
_Message = Any  # a protobuf message of zone.proto (its classes are generated)
_Body = Callable[[_Message, grpc.ServicerContext], _Reply]

_UNARY = (
    ("OpenRound", Call.OPEN, pb.OpenRoundRequest, pb.OpenRoundReply),
    ("CloseRound", Call.CLOSE, pb.CloseRoundRequest, pb.CloseRoundReply),  # an abort: checked again as such
    ("Info", Call.INFO, pb.InfoRequest, pb.InfoReply),
    ("Reconfigure", Call.RECONFIGURE, pb.ReconfigureRequest, pb.ReconfigureReply),
)
"""Unary methods: name, the call they are admitted (and refused) as, request, reply."""
_STREAMING_IN = (
    ("Push", Call.PUSH, pb.PushFrame, pb.PushReply),
    ("Forward", Call.FORWARD, pb.PushFrame, pb.ForwardReply),
)
"""Client-streaming methods (the peer sends frames)."""
_STREAMING_OUT = (("FetchAggregate", Call.FETCH, pb.FetchAggregateRequest, pb.AggregateFrame),)
"""Server-streaming methods (one request, the zone sends frames)."""


class ZoneService(pb_grpc.ZoneServicer):
    """gRPC front of one zone aggregator.

    With mTLS (``ca_pem`` given) every call is authorised from the caller's
    certificate (:mod:`fedshard.zone.rpc._authority`): rounds are opened and closed by
    the coordinator only, a push is accepted only from the member site its manifest
    names, a forward only from a member zone to the reducing zone, a fetch only from a
    member site, a reconfiguration only from the coordinator. Every refusal is counted
    and audited. ``limits`` bound what one caller may hold (:mod:`fedshard.zone.rpc._guard`);
    ``reload`` takes a new membership between rounds (None: the zone refuses to);
    ``pool``, the server's worker pool where it was sized for the membership, grows
    with a reconfiguration that adds parties.
    """

    def __init__(
        self,
        zone: ZoneAggregator,
        ca_pem: bytes | None = None,
        members: Members | None = None,
        limits: ZoneLimits | None = None,
        reload: Reload | None = None,
        pool: futures.ThreadPoolExecutor | None = None,
    ) -> None:
        self.zone = zone
        self.reload = reload
        self._pool = pool
        self.ca_pem = ca_pem
        self.limits = limits if limits is not None else ZoneLimits()
        self.guard = StreamGuard(zone.name, self.limits, zone.refused_call)
        residency = zone.residency
        self._members_follow_policy = members is None  # a reconfiguration then brings new members
        if members is None and residency is not None:
            members = Members.of(residency.jurisdictions, (z.name for z in residency.router.zones))
        reducing = residency is None or residency.is_reducer
        self.authority = Authority(zone.name, ca_pem, members, reducing=reducing)
        self._served: dict[tuple[int, str], tuple[Aggregate, list[bytes]]] = {}
        self._served_lock = threading.Lock()

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The service's methods as the server runs them, each admitted before its request is read.

        Every method is registered as client-streaming (the wire is the same: a unary
        call is a stream of one message), so that :meth:`_admit` runs before gRPC reads
        anything of the request; the handler bodies then get the request as for any
        unary call.
        """
        out: dict[str, grpc.RpcMethodHandler] = {}
        for name, call, request, reply in _UNARY:
            out[name] = grpc.stream_unary_rpc_method_handler(
                self._unary(call, getattr(self, name)), request.FromString, reply.SerializeToString
            )
        for name, call, request, reply in _STREAMING_IN:
            out[name] = grpc.stream_unary_rpc_method_handler(
                self._streaming(call, getattr(self, name)), request.FromString, reply.SerializeToString
            )
        for name, call, request, _ in _STREAMING_OUT:  # the bodies yield frames serialised already: sent as they are
            out[name] = grpc.stream_stream_rpc_method_handler(
                self._replying(call, getattr(self, name)), request.FromString, None
            )
        return out

    def _admit(self, call: Call, context: grpc.ServicerContext) -> Stream:
        """Admit ``call`` before its request is read: the caller's certificate first (one
        that fails its checks, or a non-member's, is refused at once, audited), then its
        party's allowance (a refusal is audited by the guard). The handler checks the
        caller's role (an abort's is known only from its request)."""
        identity = self._member(context, call)
        try:
            return self.guard.admit(call, context, caller_name(identity) if identity is not None else None)
        except FedshardError as exc:
            self._fail(context, exc)

    def _request(self, stream: Stream, requests: Iterator[_Message], context: grpc.ServicerContext) -> _Message:
        """The one request of an admitted unary (or server-streaming) call, read under the watchdog."""
        try:
            return stream.request(requests)
        except FedshardError as exc:
            self._refuse(context, Call(stream.call), stream.caller, exc)

    def _unary(self, call: Call, body: _Body[_Reply]) -> Callable[[Iterator[_Message], grpc.ServicerContext], _Reply]:
        def run(requests: Iterator[_Message], context: grpc.ServicerContext) -> _Reply:
            with self._admit(call, context) as stream:
                return body(self._request(stream, requests, context), context)

        return run

    def _streaming(
        self, call: Call, body: Callable[[Iterator[_Message], grpc.ServicerContext], _Reply]
    ) -> Callable[[Iterator[_Message], grpc.ServicerContext], _Reply]:
        def run(requests: Iterator[_Message], context: grpc.ServicerContext) -> _Reply:
            with self._admit(call, context) as stream:
                return body(stream.frames(requests), context)

        return run

    def _replying(
        self, call: Call, body: _Body[Iterable[bytes]]
    ) -> Callable[[Iterator[_Message], grpc.ServicerContext], Iterator[bytes]]:
        def run(requests: Iterator[_Message], context: grpc.ServicerContext) -> Iterator[bytes]:
            with self._admit(call, context) as stream:
                yield from stream.replies(body(self._request(stream, requests, context), context))

        return run

    def _fail(self, context: grpc.ServicerContext, error: FedshardError) -> NoReturn:
        log.info("zone %s refused (%s): %s", self.zone.name, error.code or "-", error)
        abort_with(context, error)

    def _refuse(self, context: grpc.ServicerContext, call: Call, caller: str, error: FedshardError) -> NoReturn:
        """Refuse a call the service itself turned down: count, audit, then abort."""
        if not isinstance(error, StreamEndedError):  # the guard's watchdog recorded it
            self.zone.refused_call(call, caller, refusal_code(error), str(error))
        self._fail(context, error)

    def _member(self, context: grpc.ServicerContext, call: Call) -> Identity | None:
        """The caller, if it is a party of the federation; else ``call`` is refused (audited)."""
        try:
            identity = self.authority.identify(context)
        except FedshardError as exc:
            self._refuse(context, call, _peer(context), exc)
        try:
            self.authority.check_member(identity)
        except FedshardError as exc:
            self._refuse(context, call, caller_name(identity), exc)
        return identity

    def _authorize(self, context: grpc.ServicerContext, call: Call) -> Identity | None:
        """The caller, if it may make ``call``; else the call is refused (audited)."""
        identity = self._member(context, call)
        try:
            self.authority.permit(identity, call)
        except FedshardError as exc:
            self._refuse(context, call, caller_name(identity), exc)
        return identity

    def OpenRound(self, request: pb.OpenRoundRequest, context: grpc.ServicerContext) -> pb.OpenRoundReply:  # noqa: N802
        caller = caller_name(self._authorize(context, Call.OPEN))
        spec = RoundSpec(
            request.round,
            request.token,
            request.plan_json,
            request.base_version,
            tuple(request.sites),
            tuple(sorted(request.base_versions.items())),
            tuple(sorted(request.weights.items())),
        )
        try:
            self.zone.open_round(spec, by=caller)
        except FedshardError as exc:
            self._fail(context, exc)
        return pb.OpenRoundReply()

    def Push(self, request_iterator: Iterator[pb.PushFrame], context: grpc.ServicerContext) -> pb.PushReply:  # noqa: N802
        identity = self._authorize(context, Call.PUSH)
        caller = caller_name(identity)
        try:
            first = self._header(request_iterator, "a push must start with its manifest")
            manifest = Manifest.from_bytes(first.header.manifest)
            if identity is not None and identity.name != manifest.site_id:
                raise PushRejectedError(
                    f"zone {self.zone.name}: manifest names site {manifest.site_id!r} but the caller's certificate "
                    f"is {identity.name!r}",
                    RefusalCode.IDENTITY,
                )
        except FedshardError as exc:
            self._refuse(context, Call.PUSH, caller, exc)
        certified = identity.jurisdiction_or_region if identity is not None else None
        try:
            with self.zone.begin_push(
                manifest, first.header.round_token, self.limits.staging_wait_s, certified=certified
            ) as session:
                self._feed(request_iterator, session, "manifest sent twice in one push")
                receipt = session.commit()
        except FedshardError as exc:
            self._fail(context, exc)
        return pb.PushReply(
            zone=receipt.zone,
            round=receipt.round,
            site_id=receipt.site_id,
            shards=receipt.shards,
            bytes=receipt.bytes,
            fold_seconds=receipt.fold_s,
        )

    def _header(self, frames: Iterator[pb.PushFrame], rule: str) -> pb.PushFrame:
        first = next(frames, None)
        if first is None or first.WhichOneof("frame") != "header":
            raise PushRejectedError(f"zone {self.zone.name}: {rule}", RefusalCode.PROTOCOL)
        return first

    def _feed(self, frames: Iterator[pb.PushFrame], session: PushSession | ForwardSession, twice: str) -> None:
        """Hand every chunk after the header to ``session``; a second header is refused (audited)."""
        for frame in frames:
            if frame.WhichOneof("frame") != "chunk":
                raise session.refuse(RefusalCode.PROTOCOL, twice)
            session.take(chunk_of(frame.chunk))

    def Forward(self, request_iterator: Iterator[pb.PushFrame], context: grpc.ServicerContext) -> pb.ForwardReply:  # noqa: N802
        identity = self._authorize(context, Call.FORWARD)
        try:
            first = self._header(request_iterator, "a forward must start with its header")
            partial = PartialSum.from_bytes(first.header.manifest)
        except FedshardError as exc:
            self._refuse(context, Call.FORWARD, caller_name(identity), exc)
        certified = identity.name if identity is not None else None
        try:
            with self.zone.begin_forward(partial, self.limits.staging_wait_s, certified=certified) as session:
                self._feed(request_iterator, session, "header sent twice in one forward")
                shards = session.commit()
        except FedshardError as exc:
            self._fail(context, exc)
        return pb.ForwardReply(shards=shards)

    def CloseRound(self, request: pb.CloseRoundRequest, context: grpc.ServicerContext) -> pb.CloseRoundReply:  # noqa: N802
        caller = caller_name(self._authorize(context, Call.ABORT if request.abort else Call.CLOSE))
        try:
            if request.abort:
                self.zone.abort_round(request.round, by=caller)
                return pb.CloseRoundReply()
            forward = (request.forward_zone, request.forward_endpoint) if request.forward_zone else None
            summaries = self.zone.close_round(request.round, forward, by=caller)
            return pb.CloseRoundReply(aggregates=[summary_to_header(s) for s in summaries])
        except FedshardError as exc:
            self._fail(context, exc)

    def FetchAggregate(  # noqa: N802
        self, request: pb.FetchAggregateRequest, context: grpc.ServicerContext
    ) -> Iterable[bytes]:
        identity = self._authorize(context, Call.FETCH)
        try:
            residency = self.zone.residency
            if identity is not None:
                jurisdiction: str | None = identity.jurisdiction_or_region
                by = caller_name(identity)
            else:
                jurisdiction = residency.jurisdictions.get(request.site_id) if residency is not None else None
                by = f"site:{request.site_id}" if request.site_id else "-"
            group = request.group or DEFAULT_GROUP
            aggregate = self.zone.fetch(request.round, group, jurisdiction=jurisdiction, by=by)
        except FedshardError as exc:
            self._fail(context, exc)
        return self._frames(aggregate)

    def _frames(self, aggregate: Aggregate) -> Iterable[bytes]:
        """The serialised frames that serve ``aggregate``: kept once built while the kept ones
        weigh at most :data:`SERVED_FRAMES_BYTES` (the memo holds the very object it was built
        for); a larger aggregate's are written as they are sent."""
        written = aggregate_frames(
            summary_to_header(aggregate.summary), aggregate.payload(), encrypted=aggregate.ciphertexts
        )  # a generator: nothing is written until it is iterated
        if aggregate.nbytes > SERVED_FRAMES_BYTES:
            return written
        key = (aggregate.summary.round, aggregate.summary.group)
        with self._served_lock:
            memo = self._served.get(key)
            if memo is not None and memo[0] is aggregate:
                return memo[1]
        built = list(written)
        with self._served_lock:
            kept = sum(len(f) for _, fs in self._served.values() for f in fs)
            if kept + sum(len(f) for f in built) > SERVED_FRAMES_BYTES:
                self._served.clear()
            self._served[key] = (aggregate, built)
        return built

    def Info(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.InfoReply:  # noqa: N802
        self._authorize(context, Call.INFO)
        info = json.dumps(self.zone.info(), sort_keys=True)
        return pb.InfoReply(name=self.zone.name, region=self.zone.region, info_json=info)

    def Reconfigure(self, request: pb.ReconfigureRequest, context: grpc.ServicerContext) -> pb.ReconfigureReply:  # noqa: N802
        caller = caller_name(self._authorize(context, Call.RECONFIGURE))
        try:
            if self.reload is None:
                raise ZoneError(f"zone {self.zone.name} was not started from a config file; it cannot be reconfigured")
            digest = request.membership_digest
            if len(digest) != MEMBERSHIP_DIGEST_CHARS or not all(c in "0123456789abcdef" for c in digest):
                raise ZoneError(
                    f"zone {self.zone.name}: a membership digest is {MEMBERSHIP_DIGEST_CHARS} hex characters"
                )
            policy = self.reload(digest, caller)
        except FedshardError as exc:
            self._fail(context, exc)
        zones = [z.name for z in policy.router.zones]
        if self._members_follow_policy:
            self.authority.members = Members.of(policy.jurisdictions, zones)
        self._fit_pool(len(policy.jurisdictions) + len(zones))
        log.info(
            "zone %s reconfigured by %s: %d sites, %d zones",
            self.zone.name,
            caller,
            len(policy.jurisdictions),
            len(zones),
        )
        return pb.ReconfigureReply(
            policy_digest=policy.policy.digest, sites=len(policy.jurisdictions), zones=len(zones)
        )

    def _fit_pool(self, parties: int) -> None:
        """Grow the worker pool so that ``parties`` (sites and zones) each fit their full
        allowance (:func:`~fedshard.zone.rpc._guard.pool_size`); it never shrinks."""
        if self._pool is None:
            return
        need = pool_size(self.limits, parties)
        if need > self._pool._max_workers:  # read at every submit: new workers start as calls come
            log.info("zone %s: %d workers for %d parties", self.zone.name, need, parties)
            self._pool._max_workers = need


def _peer(context: grpc.ServicerContext) -> str:
    """Who called, for audit records of a caller the zone could not authorise."""
    certs = context.auth_context().get(PEER_CERT_KEY) or []
    if certs:
        from cryptography import x509

        try:
            cert = x509.load_pem_x509_certificate(certs[0])
            return f"cert:{cert.subject.rfc4514_string()}"
        except ValueError:
            pass
    return f"peer:{context.peer()}"


def serve(
    zone: ZoneAggregator,
    address: str = "127.0.0.1:0",
    max_workers: int | None = None,
    tls: TlsFiles | None = None,
    members: Members | None = None,
    *,
    limits: ZoneLimits | None = None,
    parties: int = 4,
    reload: Reload | None = None,
) -> tuple[grpc.Server, int]:
    """Start a gRPC server for ``zone`` on ``address``; returns the server and its port.

    With ``tls`` the zone requires mutual TLS (client certificates signed by the
    federation CA) and authorises every call from the caller's certificate; ``members``
    are the federation's parties (default: from the zone's residency policy). Without
    ``tls`` the data plane is plain text and nothing is authorised: loopback only.
    ``limits`` bound what each caller may hold and how long connections last
    (:func:`~fedshard.zone.rpc.convert.server_options`); the worker pool is
    ``max_workers``, else :func:`~fedshard.zone.rpc._guard.pool_size` for ``parties``
    (the sites and zones that may call it; a reconfiguration that adds parties grows
    it). ``reload`` lets the coordinator hand the zone a new membership between rounds
    (see :class:`ZoneService`).
    """
    limits = limits if limits is not None else ZoneLimits()
    sized = max_workers is None and limits.workers is None  # sized for the membership: grows with it
    workers = max_workers if max_workers is not None else pool_size(limits, parties)
    pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"zone-{zone.name}")
    server = grpc.server(pool, options=server_options(limits))
    ca_pem = tls.read()[2] if tls is not None else None
    service = ZoneService(
        zone, ca_pem=ca_pem, members=members, limits=limits, reload=reload, pool=pool if sized else None
    )
    handlers = service.handlers()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)  # the fast path of clients' registered methods
    try:
        port = server.add_secure_port(address, tls.server()) if tls is not None else server.add_insecure_port(address)
    except RuntimeError:  # recent grpcio raises where older releases returned 0
        port = 0
    if port == 0:
        raise ZoneError(f"zone {zone.name}: cannot listen on {address} (port in use?)")
    server.start()
    return server, port
