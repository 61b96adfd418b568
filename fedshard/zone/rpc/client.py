"""Client of a zone's gRPC service, used by sites (push, fetch), the coordinator (open,
close) and zones (forward). Implements :class:`fedshard.protocol.channels.ZoneClient`.

With mutual TLS and the zone it expects (``zone``: name and region from the caller's own
config) the client completes a handshake only with that zone's certificate
(:func:`~fedshard.crypto.tls.zone_channel_options`), so nothing is sent to anyone else,
whatever endpoint it was given; a failed handshake is one line naming the zone expected
and what answered instead (:class:`~fedshard.errors.PeerIdentityError`). Every aggregate
it fetches must then carry that zone's signature over exactly what was fetched
(:func:`~fedshard.integrity.aggregate_signature.check_aggregate`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import numpy as np

from fedshard.crypto.identity import ZoneId
from fedshard.crypto.tls import TlsFiles, channel_credentials, describe_peer, zone_channel_options
from fedshard.errors import FedshardError, FrameError, IntegrityError, PeerIdentityError, RefusalCode, ZoneError
from fedshard.integrity import Manifest, merkle_root
from fedshard.integrity.aggregate_signature import check_aggregate
from fedshard.protocol.rounds import (
    DEFAULT_GROUP,
    Aggregate,
    AggregateSummary,
    PartialSum,
    PushReceipt,
    RoundSpec,
    ShardPayload,
)
from fedshard.zone.frames import Declared, FrameAssembler, Header
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc._status import error_from_rpc
from fedshard.zone.rpc.convert import CHUNK_BYTES, GRPC_OPTIONS, chunk_of, header_to_summary, push_frames

__all__ = ["GrpcZoneClient"]

_NO_CONNECTION = "Failed to connect to remote host"  # gRPC's words when no TCP connection was made: no peer to ask


class GrpcZoneClient:
    """Talks to one zone over gRPC.

    Parameters
    ----------
    endpoint:
        ``host:port`` of the zone.
    timeout:
        Seconds allowed for each call.
    tls:
        This party's certificate, key and the federation CA, for mutual TLS.
    zone:
        With ``tls``: the zone expected at ``endpoint`` (name and region, from this
        party's own config); the handshake fails against any other certificate, and
        every fetched aggregate must be signed by it. None: any certificate the CA
        issued for the host dialled (tools, tests), and aggregates are not checked.
    """

    def __init__(
        self,
        endpoint: str,
        timeout: float = 300.0,
        chunk_bytes: int = CHUNK_BYTES,
        tls: TlsFiles | None = None,
        zone: ZoneId | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self.zone = zone
        self._tls = tls
        self._ca: bytes | None = None
        if tls is None:
            self._channel = grpc.insecure_channel(endpoint, options=GRPC_OPTIONS)
        else:
            cert, key, self._ca = tls.read()
            options = [*GRPC_OPTIONS, *(zone_channel_options(zone) if zone is not None else [])]
            self._channel = grpc.secure_channel(endpoint, channel_credentials(self._ca, cert, key), options=options)
        self._stub = pb_grpc.ZoneStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> GrpcZoneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serialised(self, method: str, reply: type[pb.PushReply] | type[pb.ForwardReply]) -> Any:
        """A streaming call of ``method`` that sends frames as the bytes given: Push and Forward
        frames come serialised by :func:`~fedshard.zone.rpc.convert.push_frames` (a chunk's
        bytes copied once), not as ``PushFrame`` s for the stub to serialise."""
        return self._channel.stream_unary(
            f"/fedshard.zone.v1.Zone/{method}", request_serializer=None, response_deserializer=reply.FromString
        )

    def _error(self, exc: grpc.RpcError) -> FedshardError:
        if (
            exc.code() == grpc.StatusCode.UNAVAILABLE
            and self._tls is not None
            and self.zone is not None
            and _NO_CONNECTION not in (exc.details() or "")
        ):
            # a failed handshake looks like a zone that is down: ask the peer what it holds
            wrong = describe_peer(self.endpoint, self._tls, self.zone)
            if wrong is not None:
                return PeerIdentityError(wrong)
        return error_from_rpc(exc, self.endpoint)

    def info(self) -> tuple[str, str]:
        """``(name, region)`` of the zone."""
        reply = self._info()
        return reply.name, reply.region

    def details(self) -> dict[str, Any]:
        """The zone's counters, residency role and audit head (see ``ZoneAggregator.info``)."""
        reply = self._info()
        return dict(json.loads(reply.info_json)) if reply.info_json else {"name": reply.name, "region": reply.region}

    def _info(self) -> pb.InfoReply:
        try:
            reply: pb.InfoReply = self._stub.Info(pb.InfoRequest(), timeout=self.timeout)
            return reply
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def reconfigure(self, membership_digest: str) -> dict[str, Any]:
        """Ask the zone (as the coordinator) to take the membership it reads from its own config
        file, which must match ``membership_digest``
        (:func:`fedshard.config.changes.membership_digest`); its new policy digest and counts."""
        try:
            reply = self._stub.Reconfigure(
                pb.ReconfigureRequest(membership_digest=membership_digest), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return {"policy_digest": reply.policy_digest, "sites": reply.sites, "zones": reply.zones}

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the zone's channel is connected (a zone still starting, or restarting, is waited for)."""
        deadline = time.monotonic() + timeout
        while True:
            # A channel whose connection failed goes idle until asked again: ask every second.
            try:
                grpc.channel_ready_future(self._channel).result(timeout=min(1.0, max(deadline - time.monotonic(), 0)))
                return
            except grpc.FutureTimeoutError:
                if time.monotonic() >= deadline:
                    raise ZoneError(f"zone at {self.endpoint} did not come up within {timeout:.0f}s") from None

    def open_round(self, spec: RoundSpec) -> None:
        """Ask the zone to accept pushes for ``spec.round``."""
        request = pb.OpenRoundRequest(
            round=spec.round,
            token=spec.token,
            plan_json=spec.plan_json,
            base_version=spec.base_version,
            sites=list(spec.sites),
            base_versions=dict(spec.base_versions),
            weights=dict(spec.weights),
        )
        try:
            self._stub.OpenRound(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        """Stream the manifest then the shards (ciphertext ``bytes`` where the manifest says
        ``encrypted``); raises :class:`PushRejectedError`, with the zone's code, if refused."""
        encrypted = {e.shard_id for e in manifest.shards if e.encrypted}
        header = pb.PushHeader(manifest=manifest.to_bytes(), round_token=token)
        try:
            call = self._serialised("Push", pb.PushReply)
            reply = call(push_frames(header, shards, self.chunk_bytes, encrypted), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        fold_s = reply.fold_seconds if math.isfinite(reply.fold_seconds) and reply.fold_seconds >= 0 else 0.0
        return PushReceipt(reply.zone, reply.round, reply.site_id, reply.shards, reply.bytes, fold_s)

    def close_round(self, round: int, forward_to: tuple[str, str] | None = None) -> list[AggregateSummary]:
        """Close ``round``; the summaries of the aggregates it published (one per group), each
        with the zone's signature when it has a key.

        ``forward_to``: the reducing zone's ``(name, endpoint)`` as the caller sees it; the
        zone forwards to its own config's and refuses a close naming another.
        """
        zone, endpoint = forward_to or ("", "")
        request = pb.CloseRoundRequest(round=round, forward_zone=zone, forward_endpoint=endpoint)
        try:
            reply = self._stub.CloseRound(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return [header_to_summary(h) for h in reply.aggregates]

    def forward(self, partial: PartialSum, sums: Mapping[str, ShardPayload]) -> int:
        """Send partial sums (ciphertext ``bytes`` where the header says ``encrypted``) to the
        reducing zone; the number of shards it folded in."""
        encrypted = {e.shard_id for e in partial.entries if e.encrypted}
        header = pb.PushHeader(manifest=partial.to_bytes(), round_token=partial.token)
        try:
            call = self._serialised("Forward", pb.ForwardReply)
            reply = call(push_frames(header, sums, self.chunk_bytes, encrypted), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return int(reply.shards)

    def abort_round(self, round: int) -> None:
        """Discard ``round`` at the zone."""
        try:
            self._stub.CloseRound(pb.CloseRoundRequest(round=round, abort=True), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def fetch(self, round: int, group: str = DEFAULT_GROUP, site_id: str = "") -> Aggregate:
        """Download aggregate ``group`` of ``round``: means, and encrypted sums as ``bytes``.

        Every shard is held to the aggregate's summary (offsets, sizes, digests, its
        ``encrypted`` flag) and the summary to its Merkle root; with mutual TLS and an
        expected zone, the summary to the zone's signature. ``site_id`` says who
        asks (the zone checks that the policy lets that site's jurisdiction receive
        it; under mTLS the certificate says who asks).

        Raises
        ------
        FrameError
            The stream breaks what its summary declares, with the code of the check.
        IntegrityError
            The summary's own Merkle root does not match its shard list, or the aggregate
            is not signed by the expected zone exactly as fetched.
        """
        request = pb.FetchAggregateRequest(round=round, group=group, site_id=site_id)
        try:
            frames = iter(self._stub.FetchAggregate(request, timeout=self.timeout))
            first = next(frames, None)
            if first is None or first.WhichOneof("frame") != "header":
                raise ZoneError(f"zone at {self.endpoint} sent no aggregate header for round {round}")
            summary = header_to_summary(first.header)
            where = f"aggregate {summary.group} of round {round} from zone {summary.zone}"
            if merkle_root({e.shard_id: e.digest for e in summary.shards}) != summary.merkle_root:
                raise IntegrityError(f"{where}: its shard list fails its Merkle root")
            means, ciphertexts = _assemble(frames, summary, where)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        if self._ca is not None and self.zone is not None:
            if summary.zone != self.zone.name:
                raise IntegrityError(f"{where}: asked {self.zone}, the aggregate names zone {summary.zone}")
            check_aggregate(
                summary.signature,
                self._ca,
                self.zone,
                round=round,
                group=group,
                merkle_root=summary.merkle_root,
                total_weight=summary.total_weight,
                sites=summary.sites,
            )
        return Aggregate(summary, means, ciphertexts)


def _assemble(
    frames: Iterator[pb.AggregateFrame], summary: AggregateSummary, where: str
) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    """The means and ciphertexts of an aggregate stream, held to its summary by the one frame assembler."""
    declared = {
        e.shard_id: Declared(e.shard_id, e.nbytes, e.digest, declared_by=Header.SUMMARY, encrypted=e.encrypted)
        for e in summary.shards
    }
    assembler = FrameAssembler(declared, source=Header.SUMMARY)
    means: dict[str, np.ndarray] = {}
    ciphertexts: dict[str, bytes] = {}
    try:
        for frame in frames:
            if frame.WhichOneof("frame") != "chunk":
                raise FrameError("a second header in the stream", RefusalCode.PROTOCOL)
            done = assembler.add(chunk_of(frame.chunk))
            if done is None:
                continue
            if isinstance(done[1], bytes):
                ciphertexts[done[0]] = done[1]
            else:
                means[done[0]] = done[1]
        assembler.finish()
    except FrameError as exc:
        raise FrameError(f"{where}: {exc.reason}", exc.code) from None
    return means, ciphertexts
