"""Control-plane messages between coordinator and sites (metadata only).

They are pydantic models so every adapter (in-process, Flower) serialises them the
same way: ``encode(msg)`` → JSON bytes, ``decode(Model, data)``.
"""

from __future__ import annotations

import math
import time
from enum import StrEnum
from typing import Annotated, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    field_validator,
    model_validator,
)

from fedshard.aggregation.server_rules import RULES
from fedshard.crypto.signing import SIGNATURE_HEX_LENGTH
from fedshard.errors import IntegrityError, RefusalCode
from fedshard.integrity.aggregate_signature import (
    MAX_CERTIFICATE_BYTES,
    MAX_SIGNATURE_BYTES,
    MAX_STATEMENT_BYTES,
    AggregateSignature,
)
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import Guarantee
from fedshard.privacy.ledger.spend import MAX_PROJECTED_ROUNDS
from fedshard.privacy.mechanisms import find, known
from fedshard.protocol.rounds import AggregateSummary
from fedshard.protocol.timings import PhaseSeconds, PhaseTimes
from fedshard.residency.router import AggregateKey

__all__ = [
    "AggregateKeyField",
    "AppliedRound",
    "ApplyRule",
    "EvaluateInstruction",
    "EvaluateReport",
    "LedgerHeadReport",
    "MAX_CHALLENGE_BYTES",
    "MAX_SHARD_CLASSES",
    "MessageKind",
    "PrivacyPlan",
    "PrivacyReport",
    "PrivacyStatus",
    "PublishedAggregate",
    "QueryRequest",
    "RecordPlan",
    "SiteFailure",
    "SignedStatement",
    "SiteInfo",
    "TrainInstruction",
    "TrainReport",
    "UNCLASSIFIED",
    "UpdatePlan",
    "ZonePush",
    "decode",
    "encode",
]


def _aggregate_key(value: object) -> AggregateKey:
    if isinstance(value, AggregateKey):
        return value
    if isinstance(value, str):
        return AggregateKey.parse(value)
    raise ValueError(f"expected an aggregate key written zone|group, got {value!r}")


AggregateKeyField = Annotated[AggregateKey, BeforeValidator(_aggregate_key), PlainSerializer(str, return_type=str)]
"""An :class:`~fedshard.residency.AggregateKey` in a message: ``zone|group`` on the wire
(a JSON object key), the typed key in Python; a malformed one is refused on decode."""


MAX_CHALLENGE_BYTES = 64
"""The longest challenge a query may carry, in bytes (hex: twice as many characters)."""


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MessageKind(StrEnum):
    """The three kinds of control-plane message (Flower message types)."""

    QUERY = "query"
    TRAIN = "train"
    EVALUATE = "evaluate"


class PrivacyStatus(StrEnum):
    """Where a site's privacy budget stands, as it reports it."""

    ACTIVE = "active"
    """The site can afford the next round."""
    EXHAUSTED = "exhausted"
    """The next round would overrun the site's budget: it takes part in no more rounds."""
    REFUSED = "refused"
    """The site refused this round's release (its reservation stays counted as spent)."""


class SignedStatement(_Msg):
    """A zone's signed statement of an aggregate it published, as the coordinator relays it
    (:class:`~fedshard.integrity.aggregate_signature.AggregateSignature`, in text).

    Sent by the coordinator, as the zone's ``CloseRound`` reply gave it; bounded by the
    sizes a zone writes; checked by the site, which applies an aggregate only when the
    zone served it this very statement, and the zone's signature over it verifies.
    """

    statement: str = Field(max_length=MAX_STATEMENT_BYTES)  # canonical JSON
    signature: str = Field(max_length=2 * MAX_SIGNATURE_BYTES)  # hex
    certificate: str = Field(max_length=MAX_CERTIFICATE_BYTES)  # PEM

    @classmethod
    def of(cls, signed: AggregateSignature | None) -> SignedStatement | None:
        """The relay of a zone's signature (None: the zone signed nothing)."""
        return cls(**signed.to_json()) if signed is not None else None

    def signature_bytes(self) -> AggregateSignature:
        """Back to the zone's :class:`AggregateSignature`; :class:`IntegrityError` if malformed."""
        try:
            return AggregateSignature.from_json(self.model_dump())
        except IntegrityError:
            raise IntegrityError("the relayed statement of an aggregate is malformed") from None


class PublishedAggregate(_Msg):
    """One aggregate a zone published in a round: the zone, its group and Merkle root, and
    the zone's signed statement of it (``signed``; None from a zone without a key)."""

    zone: str
    group: str
    merkle_root: str
    signed: SignedStatement | None = None

    @property
    def key(self) -> AggregateKey:
        """``(zone, group)``: which aggregate this is."""
        return AggregateKey(self.zone, self.group)

    @classmethod
    def of(cls, summary: AggregateSummary) -> PublishedAggregate:
        """What the coordinator announces of a zone's summary: it relays the zone's signature as it is."""
        return cls(
            zone=summary.zone,
            group=summary.group,
            merkle_root=summary.merkle_root,
            signed=SignedStatement.of(summary.signature),
        )


class AppliedRound(_Msg):
    """One round a site has not applied yet, as its residency group sees it.

    ``aggregates`` are all the aggregates published in the round; ``merkle_root`` is
    the root over the shards *this site* applies from them (its residency group's
    view), which extends its model-version chain.
    """

    round: int
    merkle_root: str
    aggregates: list[PublishedAggregate]


def _mechanism_of(guarantee: Guarantee, name: str) -> str:
    """``name`` if it is a registered mechanism giving ``guarantee`` (a site never runs one it does not know)."""
    if find(name, guarantee) is None:
        raise ValueError(
            f"{name[:40]!r} is not a {guarantee.value}-level DP mechanism this party knows ({known(guarantee)})"
        )
    return name


class RecordPlan(_Msg):
    """Record-level DP settings for a round (sent by the coordinator; the site admits them
    against its own config, :mod:`fedshard.site.terms`)."""

    mechanism: str = "dpsgd"  # a registered record-level mechanism (fedshard.privacy.mechanisms)
    noise_multiplier: float | None  # None: the site calibrates σ to spend its budget over planned_rounds
    max_grad_norm: float
    planned_rounds: int
    distributed_over: int | None = None  # noise shared by ≥ n sites under HE: each adds σ/√(n−1)
    # Coordinator to site: each round one DP-SGD step over a Poisson sample of the site's records at
    # this rate (None: rounds of whole local epochs). The site refuses it unless the plan trains every
    # record for one epoch (batch_size 0, epochs 1), and its ledger accounts the step at this rate.
    sample_rate: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)

    @field_validator("mechanism")
    @classmethod
    def _registered(cls, name: str) -> str:
        return _mechanism_of(Guarantee.RECORD, name)


class UpdatePlan(_Msg):
    """Update-level DP settings for a round (sent by the coordinator; admitted by the site)."""

    mechanism: str = "gaussian"  # a registered update-level mechanism (fedshard.privacy.mechanisms)
    clip_norm: float
    noise_multiplier: float  # σ of the released aggregate (what the ledger accounts)
    distributed_over: int | None = None  # noise shared by ≥ n sites under HE: each adds σ/√(n−1)

    @field_validator("mechanism")
    @classmethod
    def _registered(cls, name: str) -> str:
        return _mechanism_of(Guarantee.UPDATE, name)


class PrivacyPlan(_Msg):
    """The privacy the aggregator asks for: mechanisms and the budget it assigns the site.

    The site keeps the stricter of this budget and its own cap; the aggregator can lower
    a site's budget, never raise it.
    """

    accountant: AccountantKind
    epsilon: float
    delta: float
    batch_size: int = Field(ge=0)  # local training per round (0: every record), which a round's cost depends on
    epochs: int
    record: RecordPlan | None = None
    update: UpdatePlan | None = None


class LedgerHeadReport(_Msg):
    """Where a site's privacy ledger (its MAC chain) ended, as the site reported it.

    The coordinator sends the last one it saw back with the next train instruction; the
    site refuses to release anything if its ledger does not contain it (deleted or
    rolled back since). The MAC reveals nothing of the ledger's key.
    """

    ledger_id: str
    length: int
    mac: str


class PrivacyReport(_Msg):
    """A site's privacy ledger, as it reports it (ε per guarantee, budget, status)."""

    epsilon_budget: float
    delta: float
    epsilon_spent: float  # the binding guarantee: record-level when on, else update-level
    epsilon_record: float = 0.0
    epsilon_update: float = 0.0
    rounds_participated: int = 0
    status: PrivacyStatus = PrivacyStatus.ACTIVE
    can_afford_next: bool = True
    projected_rounds_left: int | None = None
    note: str = ""
    ledger_head: LedgerHeadReport | None = None


class ApplyRule(_Msg):
    """How sites apply each aggregate to their parameters (server-side optimiser).

    Sent by the coordinator; ``kind`` must name a rule this party has registered
    (:mod:`fedshard.aggregation.server_rules`): a site never runs a rule it does not know."""

    kind: str = "avg"
    learning_rate: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        if kind not in RULES:
            raise ValueError(f"{kind[:40]!r} is not a server optimiser this party knows ({', '.join(sorted(RULES))})")
        return kind


class QueryRequest(_Msg):
    """Ask a site who it is and where its model stands.

    The coordinator does not know which node is which site before they answer, so it
    sends every site's privacy plan; each site reads its own (and checks it against its own
    config). ``zones`` (name → endpoint) lets the site report which aggregates it will apply
    (its view); only the names count, a site dials the endpoints of its own config.

    ``challenge`` (coordinator to site: fresh random hex, one per node and query; empty:
    no proof asked) is what the site signs, with its manifest-signing key, to prove which
    site it is (:mod:`fedshard.protocol.binding`); the coordinator checks the proof.
    """

    privacy: dict[str, PrivacyPlan] = {}
    zones: dict[str, str] = {}
    # Coordinator to each site: the ledger head the federation last saw of it (this run or an
    # earlier one, :mod:`fedshard.coordinator.ledger_book`); a site whose ledger does not
    # contain it reports a refusal and takes part in nothing. A lie only stops that site.
    ledger_heads: dict[str, LedgerHeadReport] = {}
    challenge: str = Field("", max_length=2 * MAX_CHALLENGE_BYTES, pattern=r"^[0-9a-f]*$")


class SiteInfo(_Msg):
    """A site's answer to a query."""

    site_id: str
    jurisdiction: str
    num_examples: int
    plan_digest: str
    plan_json: str
    genesis_version: str
    privacy: PrivacyReport | None = None
    view: dict[AggregateKeyField, list[str]] = Field(default_factory=dict)  # aggregate -> shard ids the site applies
    version: str = ""  # the site's model version now (its genesis until it applies a round)
    applied_round: int = 0  # the last round the site applied
    # Site to coordinator: Ed25519 signature (hex) over the query's challenge and who the site is
    # (fedshard.protocol.binding); the coordinator checks it with the site's public key.
    proof: str = Field("", max_length=SIGNATURE_HEX_LENGTH)


class TrainInstruction(_Msg):
    """Apply the rounds in ``missed``, check the model is at ``base_version``, train, push the update.

    ``missed`` holds only the rounds after the one the site last reported applying
    (the coordinator knows it from the site's reports), oldest first; the site extends
    its own version chain with them and refuses unless it arrives at ``base_version``,
    its residency group's head. The message does not grow with the round number.

    ``weight`` is the aggregation weight the coordinator fixed for the site this round
    (the one it sent the zones in the round's ``RoundSpec``): the site's manifests carry
    it, and a zone refuses any other. Encrypted shards carry ``weight / weight_scale``.
    """

    round: int
    token: str
    base_version: str
    missed: list[AppliedRound]
    zones: dict[str, str]  # zone name -> endpoint
    epochs: int
    batch_size: int = Field(ge=0)  # records per step; 0 (FULL_BATCH): every record the site holds
    learning_rate: float
    seed: int
    privacy: PrivacyPlan | None = None
    apply: ApplyRule = ApplyRule()
    weight_scale: float = 0.0  # divides the weight of encrypted shards (the largest fixed weight)
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)  # the site's weight, fixed by the coordinator (RoundSpec)
    ledger_head: LedgerHeadReport | None = None  # the site's ledger head as it last reported it
    # Where the site's search for its rounds left starts: its last projection, one round on. The
    # coordinator's guess; the site composes every candidate, so a wrong one only costs time.
    projection_hint: int | None = Field(None, ge=0, le=MAX_PROJECTED_ROUNDS)
    # Coordinator to site: seconds it waits for the reply (its round_timeout_s; 0: not said).
    # Bounds how long the site retries zones that do not answer; at most a day.
    deadline_s: float = Field(0.0, ge=0, le=86400, allow_inf_nan=False)
    # Coordinator to site: the round before this one, whose model (the site's after catching up
    # to ``base_version``) the site evaluates on its own test data before it trains, and reports
    # in ``TrainReport.evaluation``: the evaluate message that round would otherwise need, carried
    # by this one (None: not asked). It releases what an evaluate message releases, and nothing
    # the site would not answer anyway; the coordinator checks the evaluation as an evaluate reply.
    evaluate: int | None = Field(None, ge=1)
    _received: float = PrivateAttr(default_factory=time.monotonic)

    @model_validator(mode="after")
    def _evaluates_an_earlier_round(self) -> TrainInstruction:
        if self.evaluate is not None and self.evaluate >= self.round:
            raise ValueError(f"evaluate names round {self.evaluate}, not one before round {self.round}")
        return self

    def deadline(self) -> float:
        """When the reply is due, as a :func:`time.monotonic` time: ``deadline_s`` after this
        message was received (decoded), less a tenth for the reply to travel; ``inf`` if not said."""
        return self._received + 0.9 * self.deadline_s if self.deadline_s else math.inf


UNCLASSIFIED = "unclassified"
"""What a push counts shards without a class under (:attr:`ZonePush.classes`)."""

MAX_SHARD_CLASSES = 64
"""Shard classes a push may count (the residency policy's classes are far fewer)."""

ShardClassName = Annotated[str, Field(max_length=64)]


class ZonePush(_Msg):
    """What one zone acknowledged of a site's update: the root of the manifest it counted,
    the shards and bytes it received, how long it took to fold them in (``fold_s``, the
    zone's figure from its receipt), and the shards by class (``classes``, from the
    manifest the zone counted). Sent by the site; used for the run's report and metrics only."""

    zone: str
    merkle_root: str
    shards: int
    nbytes: int
    fold_s: PhaseSeconds = 0.0
    classes: dict[ShardClassName, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, max_length=MAX_SHARD_CLASSES
    )


class EvaluateReport(_Msg):
    """A site's local evaluation. Sent by: the site; checked by the coordinator as a
    :class:`TrainReport` is, against the model version it computed for the site's group."""

    site_id: str
    round: int
    version: str
    num_examples: int
    loss: float
    accuracy: float
    applied_round: int | None = None  # the last round the site's model has applied
    timings: PhaseTimes = PhaseTimes()  # the site's seconds per phase (report and metrics only)


class TrainReport(_Msg):
    """What a site did with a train instruction. Sent by: the site; the coordinator checks every
    field against what it knows and leaves a reply that disagrees or is out of bounds out of
    the round (:mod:`fedshard.coordinator._replies`, SECURITY.md "Malicious sites").

    ``pushes`` lists each zone's acknowledgement (zones by name) when ``ok``; otherwise
    ``reason`` says why in one line and ``code`` is the :class:`~fedshard.errors.RefusalCode`
    of the refusal that stopped the site, where one did (a zone refused its push, or
    refused to serve it an aggregate).
    """

    site_id: str
    round: int
    ok: bool
    reason: str = ""
    code: RefusalCode | None = None
    num_examples: int = 0
    loss: float = 0.0
    pushes: list[ZonePush] = Field(default_factory=list)
    privacy: PrivacyReport | None = None
    applied_round: int | None = None  # the last round the site's model has applied (None: unknown)
    timings: PhaseTimes = PhaseTimes()  # the site's seconds per phase (report and metrics only)
    # Site to coordinator: the evaluation ``TrainInstruction.evaluate`` asked for, whether or not the
    # site then trained (None: not asked, or the site could not catch up to the model to evaluate).
    evaluation: EvaluateReport | None = None

    @property
    def bytes_up(self) -> int:
        """Bytes the zones received from the site."""
        return sum(p.nbytes for p in self.pushes)

    @property
    def shards(self) -> int:
        """Shards the zones received from the site."""
        return sum(p.shards for p in self.pushes)


class EvaluateInstruction(_Msg):
    """Apply the rounds in ``missed`` (see :class:`TrainInstruction`), check the model is at
    ``version``, and evaluate it on local test data."""

    round: int
    version: str
    missed: list[AppliedRound]
    zones: dict[str, str]
    apply: ApplyRule = ApplyRule()


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
