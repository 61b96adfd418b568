"""Control-plane messages between coordinator and sites (metadata only).

They are pydantic models so every adapter (in-process, Flower) serialises them the
same way: ``encode(msg)`` → JSON bytes, ``decode(Model, data)``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AppliedRound",
    "EvaluateInstruction",
    "EvaluateReport",
    "MessageKind",
    "QueryRequest",
    "SiteFailure",
    "SiteInfo",
    "TrainInstruction",
    "TrainReport",
    "decode",
    "encode",
]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MessageKind(StrEnum):
    """The three kinds of control-plane message (Flower message types)."""

    QUERY = "query"
    TRAIN = "train"
    EVALUATE = "evaluate"


class AppliedRound(_Msg):
    """One published aggregate in the model's history: which zone holds it and its root."""

    round: int
    zone: str
    merkle_root: str


class QueryRequest(_Msg):
    """Ask a site who it is and where its model stands."""


class SiteInfo(_Msg):
    """A site's answer to a query."""

    site_id: str
    jurisdiction: str
    num_examples: int
    plan_digest: str
    plan_json: str
    genesis_version: str


class TrainInstruction(_Msg):
    """Train on the model after ``history`` and push the update for ``round``."""

    round: int
    token: str
    base_version: str
    history: list[AppliedRound]
    zones: dict[str, str]  # zone name -> endpoint
    epochs: int
    batch_size: int
    learning_rate: float
    seed: int


class TrainReport(_Msg):
    """What a site did with a train instruction."""

    site_id: str
    round: int
    ok: bool
    reason: str = ""
    num_examples: int = 0
    loss: float = 0.0
    bytes_up: int = 0
    shards: int = 0
    zone: str = ""
    merkle_root: str = ""


class EvaluateInstruction(_Msg):
    """Bring the model up to ``history`` and evaluate it on local test data."""

    round: int
    version: str
    history: list[AppliedRound]
    zones: dict[str, str]


class EvaluateReport(_Msg):
    """A site's local evaluation."""

    site_id: str
    round: int
    version: str
    num_examples: int
    loss: float
    accuracy: float


class SiteFailure(_Msg):
    """A site did not answer usefully (timeout, crash, transport error)."""

    reason: str


M = TypeVar("M", bound=BaseModel)


def encode(message: BaseModel) -> bytes:
    """Serialise a message to JSON bytes."""
    return message.model_dump_json().encode()


def decode(model: type[M], data: bytes | str) -> M:
    """Parse JSON bytes into ``model``."""
    return model.model_validate_json(data)
