"""Packing fedshard control messages into Flower records."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import BaseModel

from fedshard.protocol.messages import (
    EvaluateInstruction,
    EvaluateReport,
    MessageKind,
    QueryRequest,
    SiteInfo,
    TrainInstruction,
    TrainReport,
    decode,
    encode,
)

if TYPE_CHECKING:
    from flwr.app import Message, RecordDict

__all__ = ["REQUESTS", "REPLIES", "clean_reason", "pack", "unpack"]

RECORD = "fedshard"
REQUESTS: dict[MessageKind, type[BaseModel]] = {
    MessageKind.QUERY: QueryRequest,
    MessageKind.TRAIN: TrainInstruction,
    MessageKind.EVALUATE: EvaluateInstruction,
}
REPLIES: dict[MessageKind, type[BaseModel]] = {
    MessageKind.QUERY: SiteInfo,
    MessageKind.TRAIN: TrainReport,
    MessageKind.EVALUATE: EvaluateReport,
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def pack(message: BaseModel) -> RecordDict:
    """A RecordDict carrying ``message``."""
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({RECORD: ConfigRecord({"payload": encode(message)})})


def unpack(message: Message, model: type[BaseModel]) -> BaseModel:
    """The fedshard message inside a Flower message."""
    payload = message.content[RECORD]["payload"]
    if not isinstance(payload, bytes | str):
        raise TypeError("fedshard payload must be bytes")
    return decode(model, payload)


def clean_reason(reason: str) -> str:
    """A one-line reason from a Flower error (Ray wraps the original in a colourful traceback)."""
    text = _ANSI.sub("", reason)
    for marker in ("FedshardError", "Error: ", "Exception: "):
        lines = [ln.strip() for ln in text.splitlines() if marker in ln]
        if lines:
            return lines[-1][:500]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "unknown error")[:500]
