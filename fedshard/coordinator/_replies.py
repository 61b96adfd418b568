"""What the coordinator takes from a site's train and evaluate replies.

A reply is checked against what the coordinator knows itself, never against what the
reply says of itself: the site id its node is bound to (:mod:`fedshard.coordinator.binding`),
the round it asked about, the model version it computed for the site's residency group,
the federation's zones and shard classes, and the shard plan's size. A reply that
disagrees, or whose figures are out of bounds, is that site's failure for the round
(:class:`Excluded`: left out of the round's metrics, traffic and timings, and recorded
with a code and one line): never the round's or the federation's. Whether the site's
update counts is the zones' decision, not the reply's.

Bounds (each reply field, who sends it, who checks it: SECURITY.md, "Malicious sites"):

* ids: the node's bound site id; round: the one asked about; ``applied_round`` within
  ``[0, round]``;
* evaluate: the model version the coordinator expects; ``accuracy`` in ``[0, 1]`` or NaN
  (the task measures none); ``loss`` finite and within ``[0, MAX_LOSS]`` (fedshard tasks'
  losses are non-negative: :class:`~fedshard.task.Metrics`); counts within ``[0, MAX_EXAMPLES]``;
* train: the same for loss and counts; each push to a distinct zone of the federation,
  at most the plan's shards and :meth:`ReplyBounds.push_bytes` bytes, shard counts by
  classes the federation knows; phase seconds as :data:`~fedshard.protocol.timings.MAX_PHASE_S`;
* privacy reports: ε and budget finite and non-negative, δ in ``[0, 1]``.

Evaluation and train loss are weighted by the weights the coordinator fixed
(:func:`~fedshard.coordinator._selection.fixed_weights`), never by a count in a reply, so a
liar moves the federation's accuracy by at most its weight share (and only within [0, 1]).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from fedshard.config import FederationConfig, ShardClass
from fedshard.errors import RefusalCode
from fedshard.protocol.messages import (
    UNCLASSIFIED,
    EvaluateReport,
    MessageKind,
    PrivacyReport,
    TrainReport,
    ZonePush,
)
from fedshard.protocol.timings import MAX_PHASE_S, PhaseTimes
from fedshard.sharding import ShardPlan

__all__ = [
    "MAX_EXAMPLES",
    "MAX_LOSS",
    "MAX_TEXT",
    "Excluded",
    "ReplyBounds",
    "check_evaluate",
    "check_privacy",
    "check_train",
    "clean_privacy",
    "left_out",
    "one_line",
    "weighted_mean",
]

MAX_EXAMPLES = 10**12
"""The most training or test records a reply may claim."""
MAX_LOSS = 1e12
"""The largest loss a reply may report."""
MAX_TEXT = 500
"""Characters of site-supplied text (a refusal's reason, a note) the coordinator keeps."""
MAX_EPSILON = 1e9
"""The largest ε (spent or budget) a privacy report may state."""


@dataclass(frozen=True)
class Excluded:
    """Why the coordinator left a site's reply out of a round: a code and one line."""

    code: RefusalCode
    reason: str
    kind: MessageKind = MessageKind.TRAIN

    def line(self) -> str:
        """``kind: code: reason``, as the report and summary show it, e.g. ``evaluate: version:
        reports model version 3f2a…, its group's is 9c41…``."""
        return f"{self.kind.value}: {self.code.value}: {self.reason}"


def left_out(
    lines: Mapping[str, str], codes: Mapping[str, tuple[RefusalCode, ...]], more: Mapping[str, Excluded]
) -> tuple[dict[str, str], dict[str, tuple[RefusalCode, ...]]]:
    """A round's replies left out (site → lines joined by ``; ``, site → codes) with ``more`` added."""
    out_lines, out_codes = dict(lines), dict(codes)
    for site, why in more.items():
        out_lines[site] = f"{out_lines[site]}; {why.line()}" if site in out_lines else why.line()
        out_codes[site] = (*out_codes.get(site, ()), why.code)
    return dict(sorted(out_lines.items())), dict(sorted(out_codes.items()))


@dataclass(frozen=True)
class ReplyBounds:
    """What a site's replies are held to: the federation's zones and shard classes, the plan's size."""

    zones: frozenset[str]
    classes: frozenset[str]
    shards: int
    plan_bytes: int

    @classmethod
    def of(cls, config: FederationConfig, plan: ShardPlan) -> ReplyBounds:
        """The bounds of ``config`` (its zones, its classes) and its shard ``plan``."""
        classes = {c.value for c in ShardClass} | {rule.shard_class for rule in config.residency.classes}
        return cls(frozenset(z.name for z in config.zones), frozenset(classes | {UNCLASSIFIED}), len(plan), plan.nbytes)

    def push_bytes(self, shards: int) -> int:
        """The most bytes one zone may have received from one site: the plan's bytes, as HE
        ciphertext at most 64× that plus 1 MiB per shard (what zones let a ciphertext weigh)."""
        return 64 * self.plan_bytes + shards * (1 << 20)


def one_line(text: object, limit: int = MAX_TEXT) -> str:
    """Site-supplied ``text`` as one printable line of at most ``limit`` characters."""
    line = "".join(ch if ch.isprintable() else " " for ch in str(text)[: limit + 1])
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _name(text: str) -> str:
    """A name a site sent, quoted for a reason (cut short)."""
    return repr(one_line(text, 64))


def _count(value: int) -> bool:
    return 0 <= value <= MAX_EXAMPLES


def _loss(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= MAX_LOSS


def _common(reply: TrainReport | EvaluateReport, site_id: str, rnd: int, applied_max: int) -> Excluded | None:
    """What train and evaluate replies share: ids, round, applied round, counts, loss, timings."""
    if reply.site_id != site_id:
        return Excluded(
            RefusalCode.IDENTITY, f"the reply names site {_name(reply.site_id)}; this node is bound to {site_id}"
        )
    if reply.round != rnd:
        return Excluded(RefusalCode.MALFORMED, f"the reply is for round {reply.round}, not {rnd}")
    if reply.applied_round is not None and not 0 <= reply.applied_round <= applied_max:
        return Excluded(
            RefusalCode.BOUND, f"the reply says round {reply.applied_round} was applied (at most {applied_max})"
        )
    if not _count(reply.num_examples):
        return Excluded(RefusalCode.BOUND, f"{reply.num_examples} records is not in [0, {MAX_EXAMPLES:.0e}]")
    if not _loss(reply.loss):
        return Excluded(RefusalCode.BOUND, f"loss {reply.loss!r} is not finite within [0, {MAX_LOSS:.0e}]")
    return _check_timings(reply.timings)


def _check_timings(times: PhaseTimes) -> Excluded | None:
    bad = next((name for name, v in times.model_dump().items() if not (0.0 <= v <= MAX_PHASE_S)), None)
    if bad is not None:
        return Excluded(RefusalCode.BOUND, f"phase time {bad} is not within [0, {MAX_PHASE_S:.0f}] s")
    return None


def check_evaluate(reply: object, site_id: str, rnd: int, version: str) -> Excluded | None:
    """Why ``reply`` to round ``rnd``'s evaluate message sent to ``site_id``'s node is left out
    (None: it is taken). ``version`` is the one the coordinator computed for the site's group."""
    why = _evaluate(reply, site_id, rnd, version)
    return None if why is None else replace(why, kind=MessageKind.EVALUATE)


def _evaluate(reply: object, site_id: str, rnd: int, version: str) -> Excluded | None:
    if not isinstance(reply, EvaluateReport):
        return Excluded(RefusalCode.MALFORMED, f"answered an evaluate message with a {type(reply).__name__}")
    common = _common(reply, site_id, rnd, rnd)
    if common is not None:
        return common
    if reply.version != version:
        return Excluded(
            RefusalCode.VERSION,
            f"reports model version {one_line(reply.version, 16)}…, its group's is {version[:16]}…",
        )
    if not (math.isnan(reply.accuracy) or 0.0 <= reply.accuracy <= 1.0):
        return Excluded(RefusalCode.BOUND, f"accuracy {reply.accuracy!r} is not within [0, 1]")
    return None


def check_train(reply: TrainReport, site_id: str, rnd: int, bounds: ReplyBounds) -> Excluded | None:
    """Why ``reply`` to round ``rnd``'s train message sent to ``site_id``'s node is left out of
    the round's metrics (None: it is taken)."""
    common = _common(reply, site_id, rnd, max(rnd - 1, 0))
    if common is not None:
        return common
    if reply.privacy is not None:
        privacy = check_privacy(reply.privacy)
        if privacy is not None:
            return privacy
    return _check_pushes(reply.pushes, bounds) if reply.ok else None


def _check_pushes(pushes: Iterable[ZonePush], bounds: ReplyBounds) -> Excluded | None:
    seen: set[str] = set()
    for push in pushes:
        if push.zone not in bounds.zones:
            return Excluded(RefusalCode.ZONE, f"reports a push to {_name(push.zone)}, not a zone of the federation")
        if push.zone in seen:
            return Excluded(RefusalCode.DUPLICATE, f"reports two pushes to zone {push.zone}")
        seen.add(push.zone)
        if not 0 <= push.shards <= bounds.shards:
            return Excluded(
                RefusalCode.BOUND, f"reports {push.shards} shards at {push.zone}; the plan has {bounds.shards}"
            )
        if not 0 <= push.nbytes <= bounds.push_bytes(push.shards):
            return Excluded(RefusalCode.BOUND, f"reports {push.nbytes} bytes at {push.zone} for {push.shards} shards")
        if not (math.isfinite(push.fold_s) and 0.0 <= push.fold_s <= MAX_PHASE_S):
            return Excluded(RefusalCode.BOUND, f"reports a fold time of {push.fold_s!r} s at {push.zone}")
        unknown = next((c for c in push.classes if c not in bounds.classes), None)
        if unknown is not None:
            return Excluded(
                RefusalCode.CLASS, f"reports shards of class {_name(unknown)}, which the federation has not"
            )
        if not all(0 <= n <= push.shards for n in push.classes.values()) or sum(push.classes.values()) > push.shards:
            return Excluded(RefusalCode.BOUND, f"reports more shards by class than shards at {push.zone}")
    return None


def check_privacy(report: PrivacyReport) -> Excluded | None:
    """Why a privacy report is left out (None: it is taken); the site's last good one stands."""
    figures = (report.epsilon_spent, report.epsilon_record, report.epsilon_update, report.epsilon_budget)
    if not all(math.isfinite(x) and 0.0 <= x <= MAX_EPSILON for x in figures):
        return Excluded(RefusalCode.BOUND, "its privacy report states an ε that is not finite within [0, 1e9]")
    if not (math.isfinite(report.delta) and 0.0 <= report.delta <= 1.0):
        return Excluded(RefusalCode.BOUND, f"its privacy report states δ = {report.delta!r}")
    if report.rounds_participated < 0 or (report.projected_rounds_left or 0) < 0:
        return Excluded(RefusalCode.BOUND, "its privacy report counts rounds below 0")
    return None


def clean_privacy(report: PrivacyReport) -> PrivacyReport:
    """``report`` with its note cut to one line of :data:`MAX_TEXT` characters (what is kept and shown)."""
    note = one_line(report.note)
    return report if note == report.note else report.model_copy(update={"note": note})


def weighted_mean(values: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Σ w·x / Σ w over the sites of ``values`` whose value is a number (NaN when none is)."""
    taken = {site: x for site, x in values.items() if not math.isnan(x)}
    total = math.fsum(weights[site] for site in taken)
    if not taken or total <= 0:
        return math.nan
    return math.fsum(weights[site] * x for site, x in taken.items()) / total
