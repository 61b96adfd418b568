"""Issue 32, items 7 and 12: one site lying in every field of its replies cannot stop or steer
the federation, nor break its records.

The malicious-site harness. The demo federation (``configs/demo.yaml``: four hospitals,
three zones, two residency groups) runs as ``fedshard simulate`` runs it (in-process
engine, the zones' real checks and signatures, every site's signing key), with
``charite-berlin`` a real :class:`~fedshard.site.Site` (it trains and pushes a real update)
whose every reply is then rewritten: other sites' ids, other rounds, other model versions
(the US group's, a stale one, garbage), record counts of 10^15 and below zero, accuracies
and losses of NaN, ±inf, 10^300 and below zero, non-finite phase times, pushes to zones
that do not exist with 10^18 bytes, shard classes and reasons in ``$…$`` (matplotlib
mathtext) and 100,000 characters, privacy reports with NaN ε, replies of the wrong kind; the evaluation a train reply
carries (the round before's) is rewritten as an evaluate reply would be.
It also over-reports its examples (10^15) when asked who it is. Beside it, impostor nodes
answer the coordinator's query: one replays an honest site's proof of an earlier query,
one claims an honest site without a proof, one claims a site the config does not list,
one claims the US site from the EU. Then:

* the federation completes every round; the honest sites' model versions agree with each
  other and with the coordinator's chain;
* every round's accuracy lies in [0, 1] and its losses are finite and non-negative, in the
  summary, the metrics and the report; the liar's weight is at most 4× the median;
* each lie that is out of bounds is left out and recorded with its code; each impostor
  is refused, in the events and the report;
* ``fedshard report`` renders the run (no mathtext interpreted).

A Hypothesis test drives the coordinator's evaluation with arbitrary evaluate replies from
one node among honest ones (in-process gateway, no training): the federation's accuracy
and loss stay in bounds whatever the liar sends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

import fedshard.simulate.run as simulate_run
from fedshard.config import FederationConfig, load_federation
from fedshard.coordinator.coordinator import Coordinator
from fedshard.errors import RefusalCode
from fedshard.observability.run_metrics import RunCollector
from fedshard.protocol.messages import (
    EvaluateReport,
    MessageKind,
    PrivacyReport,
    QueryRequest,
    SiteFailure,
    SiteInfo,
    TrainReport,
    ZonePush,
)
from fedshard.protocol.timings import PhaseTimes
from fedshard.report import build_report
from fedshard.sharding import ShardPlan
from fedshard.transports.inprocess import InProcessSiteGateway

ROOT = Path(__file__).resolve().parents[2]
LIAR = "charite-berlin"
ROUNDS = 14  # every train lie once (and the evaluate lies, some twice)
MATH = r"$\mathrm{pwn}_{x}^{2}$"
HUGE = ("$x$ " * 25_000) + "\nsecond line"
NAN, INF = float("nan"), float("inf")


def _bad_times() -> PhaseTimes:
    return PhaseTimes.model_construct(train_s=NAN, push_s=-1.0, fetch_s=INF, apply_s=0.0, seal_s=0.0, evaluate_s=0.0)


def _bad_push(zone: str) -> ZonePush:
    return ZonePush.model_construct(
        zone=zone, merkle_root="0" * 64, shards=10**9, nbytes=10**18, fold_s=INF, classes={}
    )


def _push(nbytes: int = 10, classes: dict[str, int] | None = None) -> ZonePush:
    return ZonePush.model_construct(
        zone="eu-central", merkle_root="", shards=3, nbytes=nbytes, fold_s=0.0, classes=classes or {}
    )


def _bad_privacy() -> PrivacyReport:
    return PrivacyReport.model_construct(
        epsilon_budget=NAN, delta=2.0, epsilon_spent=-INF, epsilon_record=0.0, epsilon_update=0.0, note=HUGE
    )


# Each train lie: (what it rewrites, whether the coordinator must leave the reply out).
TRAIN_LIES: list[tuple[str, dict[str, Any], bool]] = [
    ("another site's id", {"site_id": "ap-hp-paris"}, True),
    ("another round", {"round": 10**9}, True),
    ("10^15 records", {"num_examples": 10**15}, True),
    ("negative records", {"num_examples": -5}, True),
    ("NaN loss", {"loss": NAN}, True),
    ("-inf loss", {"loss": -INF}, True),
    ("1e300 loss", {"loss": 1e300}, True),
    ("a zone in mathtext", {"pushes": [_bad_push(MATH)]}, True),
    ("10^18 bytes", {"pushes": [_push(nbytes=10**18)]}, True),
    ("a class in mathtext", {"pushes": [_push(classes={MATH: 3})]}, True),
    ("non-finite timings", {"timings": _bad_times()}, True),
    ("a privacy report with NaN ε", {"privacy": _bad_privacy()}, True),
    ("applied a round from the future", {"applied_round": 10**9}, True),
    ("a refusal in mathtext", {"ok": False, "reason": HUGE, "pushes": []}, False),
]
# Each evaluate lie: (what it rewrites, whether the reply must be left out).
EVALUATE_LIES: list[tuple[str, dict[str, Any], bool]] = [
    ("another site's id", {"site_id": "mayo-rochester"}, True),
    ("a garbage version", {"version": MATH}, True),
    ("the other group's version", {"version": "other-group"}, True),  # filled in at run time
    ("10^15 test records, accuracy 0", {"num_examples": 10**15, "accuracy": 0.0}, True),
    ("NaN accuracy and loss", {"accuracy": NAN, "loss": NAN}, True),
    ("accuracy 2", {"accuracy": 2.0}, True),
    ("negative loss", {"loss": -1.0}, True),
    ("inf loss", {"loss": INF}, True),
    ("non-finite timings", {"timings": _bad_times()}, True),
    ("accuracy 0 (within bounds: taken, at its fixed weight)", {"accuracy": 0.0}, False),
]


CLAIMED = 10**12
"""The examples the liar claims (the most a reply may claim: its weight is capped at 4x the median)."""


@dataclass
class LyingSite:
    """A real site whose replies are rewritten by the lies above, one per message, in turn."""

    inner: Any
    other: Any  # a site of the other residency group: the liar sends its model version
    told: dict[str, list[str]] = field(default_factory=lambda: {"train": [], "evaluate": []})
    weights: list[float] = field(default_factory=list)  # what the coordinator fixed for it

    def handle(self, kind: MessageKind, message: Any) -> Any:
        return self._rewrite(kind, message, self.inner.handle(kind, message))

    def staged(self, kind: MessageKind, message: Any) -> Generator[None, None, Any]:
        """As the simulation's gateway runs a site (in stages around its durability barrier)."""
        reply = yield from self.inner.staged(kind, message)
        return self._rewrite(kind, message, reply)

    def _rewrite(self, kind: MessageKind, message: Any, reply: Any) -> Any:
        """The lie told for ``message`` instead of the site's true ``reply``."""
        if isinstance(reply, SiteInfo):
            return reply.model_copy(update={"num_examples": CLAIMED})  # over-report (not signed: cannot be checked)
        if kind is MessageKind.EVALUATE:
            return self._lie(EVALUATE_LIES, "evaluate", reply)
        self.weights.append(message.weight)
        if reply.evaluation is not None:  # the round before's evaluation, carried: lied about too
            reply = reply.model_copy(update={"evaluation": self._lie(EVALUATE_LIES, "evaluate", reply.evaluation)})
        return self._lie(TRAIN_LIES, "train", reply)

    def _lie(self, lies: list[tuple[str, dict[str, Any], bool]], kind: str, reply: Any) -> Any:
        """``reply`` rewritten by the next of ``lies`` (told in turn, by message kind)."""
        told = self.told[kind]
        name, update, _ = lies[len(told) % len(lies)]
        told.append(name)
        if update.get("version") == "other-group":
            update = {"version": self.other.query(QueryRequest()).version}
        return reply.model_copy(update=update)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Impostors:
    """Nodes that answer the coordinator's query as someone they are not (and nothing else)."""

    def __init__(self, sites: dict[str, Any]) -> None:
        self.sites = sites
        self.replayed: SiteInfo | None = None

    def answers(self) -> dict[str, Any]:
        honest = self.sites["ap-hp-paris"]
        self.replayed = honest.handle(MessageKind.QUERY, QueryRequest(challenge="ab" * 32))  # an earlier query
        us = self.sites["mayo-rochester"].handle(MessageKind.QUERY, QueryRequest())
        return {
            "0-replays-a-proof": lambda: self.replayed,
            "1-claims-without-proof": lambda: self.replayed.model_copy(update={"proof": ""}),
            "2-not-in-config": lambda: self.replayed.model_copy(update={"site_id": MATH, "proof": "00" * 64}),
            "3-wrong-jurisdiction": lambda: us.model_copy(update={"jurisdiction": "EU"}),
        }


class Gateway(InProcessSiteGateway):
    """The in-process gateway with the impostor nodes connected too."""

    impostors: ClassVar[dict[str, Any]] = {}

    def nodes(self) -> list[str]:
        return [*super().nodes(), *self.impostors]

    def send(self, kind: MessageKind, messages: Any, timeout: float) -> dict[str, Any]:
        fake = {n: self.impostors[n]() for n in messages if n in self.impostors}
        real = super().send(kind, {n: m for n, m in messages.items() if n not in self.impostors}, timeout)
        return {**real, **fake} if kind is MessageKind.QUERY else real


@dataclass
class Run:
    out: Path
    summary: dict[str, Any]
    sites: dict[str, Any]
    liar: LyingSite


def _config() -> FederationConfig:
    data = load_federation(ROOT / "configs" / "demo.yaml").model_dump(mode="json")
    data["federation"]["rounds"] = ROUNDS
    return FederationConfig.model_validate(data)


@pytest.fixture(scope="module")
def lying_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("lying") / "run"
    real_make_site = simulate_run.make_site
    sites: dict[str, Any] = {}
    liar: list[LyingSite] = []

    def make_site(config: FederationConfig, site_id: str, root: Any, routing: Any = None, **kw: Any) -> Any:
        site = sites[site_id] = real_make_site(config, site_id, root, routing, **kw)
        if site_id == LIAR:
            liar.append(LyingSite(site, other=lambda: None))
            return liar[0]
        return site

    class Impostored(Gateway):
        def __init__(self, by_id: Any, **kw: Any) -> None:
            super().__init__(by_id, **kw)
            self.impostors = Impostors(sites).answers()
            liar[0].other = sites["mayo-rochester"]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulate_run, "make_site", make_site)
        patch.setattr(simulate_run, "InProcessSiteGateway", Impostored)
        summary = simulate_run.simulate(_config(), out)
    yield Run(out, summary, sites, liar[0])


def test_the_federation_completes_every_round_and_the_honest_sites_agree(lying_run: Run) -> None:
    summary = lying_run.summary
    assert summary["stopped_reason"] == "" and summary["rounds"] == ROUNDS
    expected = {s["id"]: s["model_version"] for s in summary["sites"]}
    for site_id, site in lying_run.sites.items():
        held = site.query(QueryRequest())
        assert held.version == expected[site_id], site_id  # the liar's store too: it is a real site
    eu = {expected[s] for s in ("charite-berlin", "ap-hp-paris")}
    assert len(eu) == 1  # one residency group, one model


def test_every_lie_out_of_bounds_is_left_out_with_its_code(lying_run: Run) -> None:
    history = lying_run.summary["history"]
    events = [json.loads(line) for line in (lying_run.out / "events.jsonl").read_text().splitlines()]
    rounds = [e for e in events if e["event"] == "round"]
    told = lying_run.liar.told
    lies = {name: out for name, _, out in TRAIN_LIES} | {f"eval {n}": out for n, _, out in EVALUATE_LIES}
    for r, event in zip(history, rounds, strict=True):
        i = r["round"] - 1
        train, evaluate = told["train"][i], told["evaluate"][i]
        left_out = event.get("excluded", {}).get(LIAR)
        assert r["excluded"] == event.get("excluded", {})  # the summary says the same
        if lies[train] or lies[f"eval {evaluate}"]:
            assert left_out is not None, (r["round"], train, evaluate)
            assert "\n" not in left_out and len(left_out) < 1000
        for site in ("ap-hp-paris", "mayo-rochester", "sgh-singapore"):
            assert site not in event.get("excluded", {})  # an id the liar used is not blamed
        assert set(r["refused"]) <= {LIAR} and all(len(v) < 1000 for v in r["refused"].values())
    codes = {c for e in rounds for site_codes in e.get("excluded_codes", {}).values() for c in site_codes}
    assert {"identity", "version", "bound", "zone", "class", "malformed"} <= codes


def test_metrics_stay_in_bounds_in_the_summary_the_events_and_the_metrics(lying_run: Run) -> None:
    for r in lying_run.summary["history"]:
        assert 0.0 <= r["accuracy"] <= 1.0, r
        for loss in (r["loss"], r["train_loss"]):
            assert math.isfinite(loss) and loss >= 0.0, r
        assert 0 <= r["bytes_up"] < 10**9  # the demo's pushes: kilobytes
    assert lying_run.summary["final_accuracy"] > 0.6  # the liar trains honestly; its lies do not count
    events = [json.loads(line) for line in (lying_run.out / "events.jsonl").read_text().splitlines()]
    for e in (e for e in events if e["event"] == "round"):
        assert set(e["traffic"]) <= {"eu-central", "us-east", "sg-central"}
        classes = {c.split(" from ")[0] for t in e["traffic"].values() for c in t["shards"]}
        assert classes <= {"personal", "public"}
        assert all(math.isfinite(s) for ph in e["timings"]["sites"].values() for s in ph.values())
    registry = CollectorRegistry()
    registry.register(RunCollector(lying_run.out / "events.jsonl"))
    text = generate_latest(registry).decode()
    accuracy = next(line for line in text.splitlines() if line.startswith("fedshard_round_accuracy "))
    assert 0.0 <= float(accuracy.split()[1]) <= 1.0
    assert 'fedshard_site_replies_excluded_total{code="version"}' in text


def test_the_liar_weighs_at_most_four_times_the_median(lying_run: Run) -> None:
    examples = {s["id"]: s["examples"] for s in lying_run.summary["sites"]}
    assert examples[LIAR] == CLAIMED  # what it claimed, 10^10 times its records
    median = sorted(examples.values())[1]  # the lower median of four
    assert lying_run.liar.weights == [4.0 * median] * ROUNDS
    audit = [json.loads(line) for line in (lying_run.out / "zones" / "eu-central" / "audit.jsonl").open()]
    assert sum(1 for r in audit if r.get("decision") == "accepted" and r.get("site") == LIAR) == ROUNDS  # counted


def test_impostor_nodes_are_refused_and_the_run_goes_on(lying_run: Run) -> None:
    events = [json.loads(line) for line in (lying_run.out / "events.jsonl").read_text().splitlines()]
    refused = {e["node"]: e["code"] for e in events if e["event"] == "node-refused"}
    assert refused == {
        "0-replays-a-proof": RefusalCode.SIGNATURE,
        "1-claims-without-proof": RefusalCode.SIGNATURE,
        "2-not-in-config": RefusalCode.MEMBER,
        "3-wrong-jurisdiction": RefusalCode.IDENTITY,
    }
    assert {n["node"]: n["code"] for n in lying_run.summary["refused_nodes"]} == refused
    started = next(e for e in events if e["event"] == "start")
    assert sorted(s["site_id"] for s in started["sites"]) == sorted(lying_run.sites)


def test_the_report_renders_and_interprets_no_text(lying_run: Run) -> None:
    written = build_report(lying_run.out)
    assert len(written.images) == 5 and all(p.stat().st_size > 5_000 for p in written.images)
    page = written.html.read_text()
    assert "Replies the coordinator left out" in page and "Nodes refused for the run" in page
    assert "$\\mathrm{pwn}" in page and "<script" not in page.lower()


# Property: whatever one node answers to an evaluate message, the federation's figures stay in bounds.

_PLAN = ShardPlan.from_state_dict({"w": np.zeros((2, 2), "float32")}, (2, 2))
_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, -1.0, 1e300, -1e300, 0.5])
)


class EvaluatingGateway:
    """Three honest nodes and one liar: queries answered with who they are, evaluations as drawn."""

    def __init__(self) -> None:
        self.lie: Any = None

    def nodes(self) -> list[str]:
        return ["n0", "n1", "n2", "liar"]

    def send(self, kind: MessageKind, messages: dict[str, Any], timeout: float) -> dict[str, Any]:
        site = {"n0": "s0", "n1": "s1", "n2": "s2", "liar": "s3"}
        if kind is MessageKind.QUERY:
            return {n: _info(site[n]) for n in messages}
        return {
            n: self.lie if n == "liar" else _evaluation(site[n], m.round, m.version, accuracy=0.5 + 0.1 * int(n[1]))
            for n, m in messages.items()
        }


def _info(site: str) -> SiteInfo:
    return SiteInfo(
        site_id=site,
        jurisdiction="EU",
        num_examples=100,
        plan_digest=_PLAN.digest,
        plan_json=_PLAN.to_json(),
        genesis_version="g" * 64,
        version="g" * 64,
    )


def _evaluation(site: str, rnd: int, version: str, *, accuracy: float) -> EvaluateReport:
    return EvaluateReport(site_id=site, round=rnd, version=version, num_examples=30, loss=0.3, accuracy=accuracy)


_LIES = st.one_of(
    st.builds(
        EvaluateReport.model_construct,
        site_id=st.sampled_from(["s3", "s0", "s1", MATH, ""]),
        round=st.sampled_from([1, 0, -1, 10**9]),
        version=st.sampled_from(["g" * 64, "h" * 64, MATH]),
        num_examples=st.one_of(st.integers(), st.sampled_from([10**15, -1, 0])),
        loss=_FLOATS,
        accuracy=_FLOATS,
        applied_round=st.one_of(st.none(), st.integers()),
        timings=st.just(PhaseTimes()),
    ),
    st.just(SiteFailure(reason="$x$ " * 1000)),
    st.builds(TrainReport, site_id=st.just("s3"), round=st.just(1), ok=st.booleans()),
)


def _config_for(sites: int) -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "liars", "rounds": 1, "min_sites": 1},
            "task": {"target": "tests.toy_task:task"},
            "zones": [{"name": "z", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(sites)],
        }
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lie=_LIES)
def test_no_evaluate_reply_moves_the_federations_figures_out_of_bounds(lie: Any) -> None:
    gateway = EvaluatingGateway()
    coordinator = Coordinator(_config_for(4), gateway, {}, {})  # type: ignore[arg-type]
    coordinator.discover()
    gateway.lie = lie
    accuracy, loss, excluded = coordinator._evaluate(1)
    honest = (0.5 + 0.6 + 0.7) / 3
    assert 0.0 <= accuracy <= 1.0 and math.isfinite(loss) and loss >= 0.0
    assert "s0" not in excluded and "s1" not in excluded and "s2" not in excluded
    if "s3" not in excluded and isinstance(lie, EvaluateReport) and not math.isnan(lie.accuracy):
        assert abs(accuracy - honest) <= 0.25 + 1e-9  # its weight share (1 of 4 equal weights) at most
    else:
        assert accuracy == pytest.approx(honest)
