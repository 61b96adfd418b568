"""Refusal codes: the wire table is total, every code rebuilds the zone's error class,
and a refusal sent by a real gRPC server on loopback comes back with its code and line."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from fedshard.errors import (
    AggregateNotFoundError,
    ConfigError,
    FedshardError,
    IntegrityError,
    PushRejectedError,
    RefusalCode,
    ResidencyViolationError,
    ShardError,
    ShardIntegrityError,
    StoreError,
    ZoneError,
)
from fedshard.protocol.codes import MAX_REASON_CHARS, error_for, one_line, refusal_code
from fedshard.zone.rpc._status import GRPC_STATUS, REFUSAL_CODE_KEY, abort_with, error_from_rpc

NOT_PUSH = {
    RefusalCode.BUSY: ZoneError,
    RefusalCode.LIMIT: ZoneError,
    RefusalCode.IDLE: ZoneError,
    RefusalCode.LIFECYCLE: ZoneError,
    RefusalCode.PRIVACY: ZoneError,
    RefusalCode.INVALID: ZoneError,
    RefusalCode.FAILED: ZoneError,
    RefusalCode.NOT_FOUND: AggregateNotFoundError,
    RefusalCode.NOT_SERVED: ResidencyViolationError,
    RefusalCode.CORRUPT: IntegrityError,
}


def test_every_code_has_a_grpc_status() -> None:
    assert set(GRPC_STATUS) == set(RefusalCode)


@pytest.mark.parametrize("code", list(RefusalCode))
def test_error_for_gives_the_class_of_the_code_with_the_code_attached(code: RefusalCode) -> None:
    error = error_for(code, "zone eu-1: why")

    assert type(error) is NOT_PUSH.get(code, PushRejectedError)
    assert error.code is code
    assert str(error) == "zone eu-1: why"
    assert refusal_code(error) is code


def test_errors_without_a_code_are_classed() -> None:
    assert refusal_code(ResidencyViolationError("no")) is RefusalCode.NOT_SERVED
    assert refusal_code(StoreError("store file x is corrupt")) is RefusalCode.CORRUPT
    assert refusal_code(ShardIntegrityError("w", "altered")) is RefusalCode.CORRUPT
    assert refusal_code(IntegrityError("bad json")) is RefusalCode.MALFORMED
    assert refusal_code(ShardError("bad plan")) is RefusalCode.INVALID
    assert refusal_code(ConfigError("bad")) is RefusalCode.INVALID
    assert refusal_code(FedshardError("?")) is RefusalCode.FAILED
    assert refusal_code(ZoneError("?")) is RefusalCode.FAILED
    assert refusal_code(PushRejectedError("?")) is RefusalCode.REJECTED


def test_an_unknown_code_is_a_generic_refusal() -> None:
    assert RefusalCode.parse("digest") is RefusalCode.DIGEST
    assert RefusalCode.parse("from-a-newer-zone") is RefusalCode.REJECTED


def test_one_line_joins_lines_and_bounds_the_length() -> None:
    assert one_line("a\nb\r\n  c  ") == "a b c"
    long = one_line("x" * (MAX_REASON_CHARS + 50))
    assert len(long) == MAX_REASON_CHARS and long.endswith("…")


# over a real gRPC server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def refusing_endpoint() -> Iterator[str]:
    """A gRPC server on loopback whose method ``/t.T/Refuse`` refuses with the code it is sent."""

    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        code = RefusalCode(request.decode())
        abort_with(context, error_for(code, f"zone eu-1 refused: because {code.value}\nsecond line"))

    handler = grpc.method_handlers_generic_handler("t.T", {"Refuse": grpc.unary_unary_rpc_method_handler(refuse)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(timeout=10)


@pytest.mark.parametrize("code", list(RefusalCode))
def test_a_refusal_crosses_grpc_with_its_status_code_and_one_line(refusing_endpoint: str, code: RefusalCode) -> None:
    with grpc.insecure_channel(refusing_endpoint) as channel:
        call = channel.unary_unary("/t.T/Refuse")
        with pytest.raises(grpc.RpcError) as info:
            call(code.value.encode(), timeout=20)
    rpc_error = info.value

    assert rpc_error.code() == GRPC_STATUS[code]
    assert dict(rpc_error.trailing_metadata())[REFUSAL_CODE_KEY] == code.value
    error = error_from_rpc(rpc_error, refusing_endpoint)
    assert type(error) is NOT_PUSH.get(code, PushRejectedError)
    assert error.code is code
    assert str(error) == f"zone eu-1 refused: because {code.value} second line"


def test_a_failure_without_a_code_names_the_endpoint_and_status() -> None:
    class Failed(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INTERNAL

        def details(self) -> str:
            return "boom"

        def trailing_metadata(self) -> tuple[()]:
            return ()

    error = error_from_rpc(Failed(), "127.0.0.1:1")

    assert type(error) is ZoneError
    assert str(error) == "zone at 127.0.0.1:1: INTERNAL: boom"
