"""Refusals on gRPC: the status each :class:`~fedshard.errors.RefusalCode` travels with,
and the trailing metadata that carries the code itself.

The zone aborts a refused call with the status from :data:`GRPC_STATUS` (by table,
never by matching the reason's words), the one-line reason as the status details, and
the code in the trailing metadata entry :data:`REFUSAL_CODE_KEY` (and, for a duplicate
push, :data:`HELD_PUSH_KEY`). The client rebuilds the zone's error from the code
(:func:`error_from_rpc`); a call that failed without a code because no answer came (the
zone was down or restarting, the connection broke, the deadline passed) is a
:class:`~fedshard.errors.ZoneUnavailableError`, which callers may retry; any other
status without a code (a proxy answered) is a plain :class:`~fedshard.errors.ZoneError`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, NoReturn

import grpc

from fedshard.errors import FedshardError, HeldPush, PushRejectedError, RefusalCode, ZoneError, ZoneUnavailableError
from fedshard.protocol.codes import error_for, one_line, refusal_code

__all__ = ["GRPC_STATUS", "HELD_PUSH_KEY", "REFUSAL_CODE_KEY", "abort_with", "error_from_rpc"]

REFUSAL_CODE_KEY = "fedshard-refusal-code"
"""Trailing metadata key of a refused call. Sent by a zone only, on refused calls only;
its value is one :class:`RefusalCode` value (ASCII, at most 32 characters). A client
that does not know the value treats it as :attr:`RefusalCode.REJECTED`."""

HELD_PUSH_KEY = "fedshard-held-push"
"""Trailing metadata key of a push refused as :attr:`RefusalCode.DUPLICATE` whose manifest
(same digest) the zone already holds from an earlier stream of the same site: one
:class:`~fedshard.errors.HeldPush` value. Sent by a zone only, to the site the manifest
names (under mTLS its certificate), so it tells a caller nothing it did not send; a
client ignores a value it does not know."""

_NO_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_C = RefusalCode
_S = grpc.StatusCode
GRPC_STATUS: MappingProxyType[RefusalCode, Any] = MappingProxyType(
    {
        _C.ROUND: _S.FAILED_PRECONDITION,
        _C.TOKEN: _S.FAILED_PRECONDITION,
        _C.SITE: _S.FAILED_PRECONDITION,
        _C.PLAN: _S.FAILED_PRECONDITION,
        _C.VERSION: _S.FAILED_PRECONDITION,
        _C.ZONE: _S.FAILED_PRECONDITION,
        _C.STATE: _S.FAILED_PRECONDITION,
        _C.LIFECYCLE: _S.FAILED_PRECONDITION,
        _C.PRIVACY: _S.FAILED_PRECONDITION,
        _C.FAILED: _S.FAILED_PRECONDITION,
        _C.DUPLICATE: _S.ALREADY_EXISTS,
        _C.IDENTITY: _S.PERMISSION_DENIED,
        _C.SIGNATURE: _S.PERMISSION_DENIED,
        _C.POLICY: _S.PERMISSION_DENIED,
        _C.CLASS: _S.PERMISSION_DENIED,
        _C.ENCRYPTION: _S.PERMISSION_DENIED,
        _C.RESIDENCY: _S.PERMISSION_DENIED,
        _C.MEMBER: _S.PERMISSION_DENIED,
        _C.AUTHORITY: _S.PERMISSION_DENIED,
        _C.NOT_SERVED: _S.PERMISSION_DENIED,
        _C.UNKNOWN_SHARD: _S.INVALID_ARGUMENT,
        _C.MALFORMED: _S.INVALID_ARGUMENT,
        _C.FORMAT: _S.FAILED_PRECONDITION,
        _C.PROTOCOL: _S.INVALID_ARGUMENT,
        _C.SHAPE: _S.INVALID_ARGUMENT,
        _C.DTYPE: _S.INVALID_ARGUMENT,
        _C.OFFSET: _S.INVALID_ARGUMENT,
        _C.TRUNCATED: _S.INVALID_ARGUMENT,
        _C.MISSING: _S.INVALID_ARGUMENT,
        _C.DIGEST: _S.INVALID_ARGUMENT,
        _C.NON_FINITE: _S.INVALID_ARGUMENT,
        _C.WEIGHT: _S.INVALID_ARGUMENT,
        _C.BOUND: _S.INVALID_ARGUMENT,
        _C.REJECTED: _S.INVALID_ARGUMENT,
        _C.INVALID: _S.INVALID_ARGUMENT,
        _C.BUSY: _S.RESOURCE_EXHAUSTED,
        _C.LIMIT: _S.RESOURCE_EXHAUSTED,
        _C.IDLE: _S.DEADLINE_EXCEEDED,
        _C.NOT_FOUND: _S.NOT_FOUND,
        _C.CORRUPT: _S.DATA_LOSS,
    }
)
"""The gRPC status of each refusal code (every code has one)."""


def abort_with(context: grpc.ServicerContext, error: FedshardError) -> NoReturn:
    """End the call as refused: status by the error's code, the code in the trailing
    metadata, one line of reason as the details (nothing else leaves the zone)."""
    code = refusal_code(error)
    held = error.held if isinstance(error, PushRejectedError) and code is RefusalCode.DUPLICATE else None
    extra = ((HELD_PUSH_KEY, held.value),) if held is not None else ()
    context.set_trailing_metadata(((REFUSAL_CODE_KEY, code.value), *extra))
    context.abort(GRPC_STATUS[code], one_line(str(error)))
    raise AssertionError("unreachable: grpc's abort raises")  # pragma: no cover


def error_from_rpc(exc: grpc.RpcError, endpoint: str) -> FedshardError:
    """The error a failed call to the zone at ``endpoint`` raises on the client."""
    status = exc.code()
    details = exc.details() or str(status)
    metadata = {key: str(value) for key, value in exc.trailing_metadata() or ()}
    if REFUSAL_CODE_KEY in metadata:
        error = error_for(RefusalCode.parse(metadata[REFUSAL_CODE_KEY]), details)
        if isinstance(error, PushRejectedError) and error.code is RefusalCode.DUPLICATE:
            held = metadata.get(HELD_PUSH_KEY)
            error.held = HeldPush(held) if held in {h.value for h in HeldPush} else None
        return error
    if status == grpc.StatusCode.UNAVAILABLE:
        return ZoneUnavailableError(f"zone at {endpoint} is unreachable ({details}); is `fedshard zone up` running?")
    if status in _NO_ANSWER:
        return ZoneUnavailableError(f"zone at {endpoint} did not answer in time ({details})")
    return ZoneError(f"zone at {endpoint}: {status.name}: {details}")
