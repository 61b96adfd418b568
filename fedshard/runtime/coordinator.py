"""The Coordinator: drives rounds over metadata only.

It selects sites, opens the round at the zone, tells the selected sites to train,
waits (with a timeout and a minimum-sites rule), closes the round, extends the
model-version chain with the aggregate's Merkle root, and has sites evaluate. It
never sees parameters or updates: those go from sites straight to zones.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fedshard.config import FederationConfig
from fedshard.errors import RoundError
from fedshard.integrity import next_version
from fedshard.runtime.channels import SiteGateway, ZoneClient
from fedshard.runtime.messages import (
    AppliedRound,
    ApplyRule,
    EvaluateInstruction,
    EvaluateReport,
    MessageKind,
    PrivacyPlan,
    PrivacyReport,
    QueryRequest,
    RecordPlan,
    SiteFailure,
    SiteInfo,
    TrainInstruction,
    TrainReport,
    UpdatePlan,
)
from fedshard.runtime.rounds import RoundSpec, derive_seed
from fedshard.sharding import ShardPlan

__all__ = ["Coordinator", "RoundObserver", "RoundResult", "RunResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round produced (metadata only)."""

    round: int
    version: str
    merkle_root: str
    sites: tuple[str, ...]
    refused: dict[str, str]
    train_loss: float
    accuracy: float
    loss: float
    bytes_up: int
    privacy: dict[str, dict[str, Any]] = field(default_factory=dict)  # site id -> PrivacyReport fields


@dataclass
class RunResult:
    """A whole run."""

    sites: list[SiteInfo]
    genesis_version: str
    version: str
    rounds: list[RoundResult] = field(default_factory=list)
    stopped_reason: str = ""

    @property
    def privacy(self) -> dict[str, dict[str, Any]]:
        """Each site's privacy as last reported (at discovery, then after each round)."""
        latest = {s.site_id: s.privacy.model_dump() for s in self.sites if s.privacy is not None}
        for r in self.rounds:
            latest.update(r.privacy)
        return latest


class RoundObserver(Protocol):
    """Receives progress events (progress display, event log)."""

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        """The federation is assembled."""
        ...

    def on_round(self, result: RoundResult) -> None:
        """A round finished."""
        ...


class Coordinator:
    """Runs a federation's rounds.

    Parameters
    ----------
    config:
        The federation config.
    sites:
        Control-plane gateway to the sites.
    zones:
        Zone clients by zone name (the coordinator only opens and closes rounds).
    endpoints:
        Zone endpoints by zone name, as sites should reach them.
    observer:
        Optional progress observer.
    """

    def __init__(
        self,
        config: FederationConfig,
        sites: SiteGateway,
        zones: Mapping[str, ZoneClient],
        endpoints: Mapping[str, str],
        observer: RoundObserver | None = None,
    ) -> None:
        self.config = config
        self.sites = sites
        self.zones = dict(zones)
        self.endpoints = dict(endpoints)
        self.observer = observer
        self._rng = random.Random(config.federation.seed)
        self._nodes: dict[str, SiteInfo] = {}  # node key -> site info
        self._history: list[AppliedRound] = []
        self._privacy: dict[str, PrivacyReport] = {}  # site id -> last report
        self._apply_rule = ApplyRule(**config.training.server_optimizer.model_dump())
        self._plan_json = ""

    @property
    def _timeout(self) -> float:
        return self.config.federation.round_timeout_s

    # assembly --------------------------------------------------------------------------------
    def discover(self) -> RunResult:
        """Ask every connected site who it is; keep those that share the plan and genesis."""
        nodes = self.sites.nodes()
        plans = {s.id: self._privacy_plan(s.id) for s in self.config.sites}
        query = QueryRequest(privacy={site: plan for site, plan in plans.items() if plan is not None})
        replies = self.sites.send(MessageKind.QUERY, {n: query for n in nodes}, self._timeout)
        infos: dict[str, SiteInfo] = {}
        for node, reply in replies.items():
            if isinstance(reply, SiteInfo):
                infos[node] = reply
            else:
                log.warning("node %s did not answer the query: %s", node, getattr(reply, "reason", reply))
        known = {s.id for s in self.config.sites}
        for node, info in list(infos.items()):
            if info.site_id not in known:
                log.warning("site %r is not in the federation config; ignored", info.site_id)
                del infos[node]
        if not infos:
            raise RoundError("no site answered; check that the sites are running and reachable")
        votes: dict[tuple[str, str], int] = {}
        for info in infos.values():
            key = (info.plan_digest, info.genesis_version)
            votes[key] = votes.get(key, 0) + 1
        plan_digest, genesis = max(votes, key=lambda k: votes[k])
        for node, info in list(infos.items()):
            if (info.plan_digest, info.genesis_version) != (plan_digest, genesis):
                log.warning("site %s starts from a different model (plan or seed differs); excluded", info.site_id)
                del infos[node]
        self._nodes = infos
        self._privacy = {i.site_id: i.privacy for i in infos.values() if i.privacy is not None}
        # The plan (names, shapes, dtypes; no values) is what zones check frames against.
        plan_json = next(i.plan_json for i in infos.values())
        if ShardPlan.from_json(plan_json).digest != plan_digest:
            raise RoundError("the sites' shard plan does not match its digest")
        self._plan_json = plan_json
        return RunResult(
            sites=sorted(infos.values(), key=lambda s: s.site_id), genesis_version=genesis, version=genesis
        )

    # rounds ------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Discover the sites, run every configured round, return the result.

        A round that cannot proceed (too few sites, version disagreement) stops the
        federation: the result then holds the rounds completed and ``stopped_reason``.
        """
        result = self.discover()
        if self.observer is not None:
            self.observer.on_start(result.sites, self.config.federation.rounds, result.genesis_version)
        for rnd in range(1, self.config.federation.rounds + 1):
            try:
                round_result = self.run_round(rnd, result.version)
            except RoundError as exc:
                log.info("federation stopped: %s", exc)
                result.stopped_reason = str(exc)
                return result
            result.version = round_result.version
            result.rounds.append(round_result)
            if self.observer is not None:
                self.observer.on_round(round_result)
        return result

    def _privacy_plan(self, site_id: str) -> PrivacyPlan | None:
        """The privacy the aggregator asks of a site (None when DP is off)."""
        p = self.config.privacy
        if not p.enabled:
            return None
        budget = self.config.budget_of(site_id)
        assert budget is not None  # validated: a budget exists whenever DP is on
        t = self.config.training
        record = p.record_level
        return PrivacyPlan(
            accountant=record.accountant,
            epsilon=budget.epsilon,
            delta=budget.delta,
            batch_size=t.batch_size,
            epochs=t.local_epochs,
            record=RecordPlan(
                noise_multiplier=record.noise_multiplier,
                max_grad_norm=record.max_grad_norm,
                planned_rounds=math.ceil(self.config.federation.rounds * self.config.federation.sample_fraction),
            )
            if record.enabled
            else None,
            update=UpdatePlan(clip_norm=p.update_level.clip_norm, noise_multiplier=p.update_level.noise_multiplier)
            if p.update_level.enabled
            else None,
        )

    def _select(self, rnd: int) -> list[str]:
        """Sample the round's sites among those that can still afford a round."""
        fed = self.config.federation
        nodes = sorted(self._nodes, key=lambda n: self._nodes[n].site_id)
        eligible = [n for n in nodes if self._can_afford(self._nodes[n].site_id)]
        if len(eligible) < fed.min_sites:
            spent = sorted(self._nodes[n].site_id for n in nodes if n not in eligible)
            why = f"; privacy budget exhausted: {', '.join(spent)}" if spent else ""
            raise RoundError(
                f"round {rnd}: only {len(eligible)} site(s) can still take part, "
                f"federation.min_sites is {fed.min_sites}{why}"
            )
        k = max(fed.min_sites, math.ceil(fed.sample_fraction * len(eligible)))
        return sorted(self._rng.sample(eligible, min(k, len(eligible))))

    def _can_afford(self, site_id: str) -> bool:
        report = self._privacy.get(site_id)
        return report is None or report.can_afford_next

    def run_round(self, rnd: int, version: str) -> RoundResult:
        """Run round ``rnd`` starting from model ``version``."""
        fed = self.config.federation
        selected = self._select(rnd)
        zone_name = self.config.zones[0].name
        zone = self.zones[zone_name]
        token = secrets.token_hex(16)
        plan_json = self._plan_json
        zone.open_round(RoundSpec(rnd, token, plan_json, version, tuple(self._nodes[n].site_id for n in selected)))
        t = self.config.training
        instructions = {
            node: TrainInstruction(
                round=rnd,
                token=token,
                base_version=version,
                history=list(self._history),
                zones=self.endpoints,
                epochs=t.local_epochs,
                batch_size=t.batch_size,
                learning_rate=t.learning_rate,
                seed=derive_seed(fed.seed, rnd, self._nodes[node].site_id),
                privacy=self._privacy_plan(self._nodes[node].site_id),
                apply=self._apply_rule,
            )
            for node in selected
        }
        replies = self.sites.send(MessageKind.TRAIN, instructions, self._timeout)
        reports: list[TrainReport] = []
        refused: dict[str, str] = {}
        for node, reply in replies.items():
            site_id = self._nodes[node].site_id
            if isinstance(reply, TrainReport) and reply.privacy is not None:
                self._privacy[site_id] = reply.privacy
            if isinstance(reply, TrainReport) and reply.ok:
                reports.append(reply)
            else:
                refused[site_id] = reply.reason if isinstance(reply, TrainReport | SiteFailure) else str(reply)
                log.info("round %d: site %s did not contribute: %s", rnd, site_id, refused[site_id])
        if len(reports) < fed.min_sites:
            zone.abort_round(rnd)
            details = "; ".join(f"{s}: {r}" for s, r in sorted(refused.items()))
            raise RoundError(
                f"round {rnd}: only {len(reports)} of {len(selected)} sites pushed an update "
                f"(federation.min_sites is {fed.min_sites}). {details}"
            )
        summary = zone.close_round(rnd)
        counted = set(summary.sites)
        if not counted:
            raise RoundError(f"round {rnd}: zone {zone_name} counted no update")
        version = next_version(version, summary.merkle_root)
        self._history.append(AppliedRound(round=rnd, zone=zone_name, merkle_root=summary.merkle_root))
        accuracy, loss = self._evaluate(rnd, version)
        ok = [r for r in reports if r.site_id in counted]
        weight = sum(r.num_examples for r in ok) or 1
        return RoundResult(
            round=rnd,
            version=version,
            merkle_root=summary.merkle_root,
            sites=tuple(sorted(counted)),
            refused=refused,
            train_loss=sum(r.loss * r.num_examples for r in ok) / weight,
            accuracy=accuracy,
            loss=loss,
            bytes_up=sum(r.bytes_up for r in ok),
            privacy={site: report.model_dump() for site, report in sorted(self._privacy.items())},
        )

    def _evaluate(self, rnd: int, version: str) -> tuple[float, float]:
        """Every site applies the aggregate and evaluates; weighted accuracy and loss."""
        message = EvaluateInstruction(
            round=rnd, version=version, history=list(self._history), zones=self.endpoints, apply=self._apply_rule
        )
        replies = self.sites.send(MessageKind.EVALUATE, {n: message for n in self._nodes}, self._timeout)
        reports = [r for r in replies.values() if isinstance(r, EvaluateReport)]
        for node, reply in replies.items():
            if not isinstance(reply, EvaluateReport):
                log.warning("round %d: site %s did not evaluate: %s", rnd, self._nodes[node].site_id, reply)
        disagree = [r.site_id for r in reports if r.version != version]
        if disagree:
            raise RoundError(f"round {rnd}: sites {', '.join(disagree)} report a different model version")
        n = sum(r.num_examples for r in reports)
        if n == 0:
            return float("nan"), float("nan")
        return (
            sum(r.accuracy * r.num_examples for r in reports) / n,
            sum(r.loss * r.num_examples for r in reports) / n,
        )
