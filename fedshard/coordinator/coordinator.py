"""The Coordinator: drives rounds over metadata only.

It selects sites, opens the round at every zone, tells the selected sites to train,
waits (with a timeout and a minimum-sites rule), closes the round (the other zones
first, so that they forward their partial sums of global shards to the reducing
zone, then the reducing zone), extends each residency group's model-version chain,
and has sites evaluate. It never sees parameters or updates: those go from sites
straight to zones.

**One message per site and round.** A round's evaluation needs no message of its own:
the next round's train message asks each site to evaluate the model it catches up to
(``TrainInstruction.evaluate``) before it trains, and the reply carries it
(``TrainReport.evaluation``), checked as an evaluate reply is. The round is finished
(logged, shown) once those replies are in, before the next round closes. The last round
of a run, a round before one in which some site does not train (sampling, a spent
budget) and a round a resumed run finds closed are evaluated alone, by evaluate messages.

Sites whose shards end up in the same aggregates form a **residency group**, each
with its own model-version chain (:mod:`fedshard.coordinator._groups`); a message
carries only the rounds its site has not applied, never the whole history.

A round a zone fails (it cannot open or close it, or lost it) is aborted at every zone
and logged, and the next round runs, up to :data:`MAX_ABORTED_IN_A_ROW` in a row. A
coordinator that died resumes from its run's event log (:mod:`fedshard.coordinator.recovery`).
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from fedshard import faults
from fedshard._heap import release_free_memory
from fedshard.config import FederationConfig
from fedshard.config.changes import fixed_digests
from fedshard.coordinator._discovery import agreeing_sites
from fedshard.coordinator._groups import Group, combine_versions, recorded_names, residency_groups
from fedshard.coordinator._plans import apply_rule, privacy_plan
from fedshard.coordinator._replies import (
    Excluded,
    ReplyBounds,
    check_evaluate,
    check_train,
    clean_privacy,
    left_out,
    one_line,
    weighted_mean,
)
from fedshard.coordinator._reports import PrivacyReports
from fedshard.coordinator._selection import fixed_weights, select_sites
from fedshard.coordinator._timings import RoundClock
from fedshard.coordinator._zone_calls import abort_everywhere, close_everywhere, open_everywhere
from fedshard.coordinator.binding import Binding, NodeRefusal, SiteKeys, bind_nodes
from fedshard.coordinator.events import EventLog
from fedshard.coordinator.ledger_book import LedgerBook
from fedshard.coordinator.membership import JOIN_QUERIES, JoinQueries, Membership, admit
from fedshard.coordinator.recovery import RunRecovery, check_standing, evaluated, in_flight_reason
from fedshard.coordinator.results import RoundObserver, RoundResult, RunResult, aggregate_entries, refusal_line
from fedshard.errors import RefusalCode, RoundAbortedError, RoundError
from fedshard.integrity import merkle_root
from fedshard.protocol.binding import new_challenge
from fedshard.protocol.channels import SiteGateway, ZoneClient
from fedshard.protocol.messages import (
    EvaluateInstruction,
    EvaluateReport,
    MessageKind,
    PrivacyPlan,
    PrivacyStatus,
    PublishedAggregate,
    QueryRequest,
    SiteFailure,
    SiteInfo,
    TrainInstruction,
    TrainReport,
)
from fedshard.protocol.rounds import RoundSpec, derive_seed
from fedshard.protocol.timings import Phase
from fedshard.sharding import ShardPlan

__all__ = ["JOIN_QUERIES", "MAX_ABORTED_IN_A_ROW", "Coordinator"]

log = logging.getLogger(__name__)

MAX_ABORTED_IN_A_ROW = 3
"""Rounds aborted one after the other (a zone failed each) before the federation stops."""

_ZONE_FAILED = {RefusalCode.ROUND, RefusalCode.FAILED}
"""Refusal codes that say a zone failed a site's push (it no longer had the round open, or
could not be reached): a round too few sites pushed to for these is aborted, not the federation."""


@dataclass(frozen=True)
class _Closed:
    """A round closed at the zones (and logged), not yet evaluated by the sites: its result so far,
    and its clock (the evaluation's timings join it)."""

    result: RoundResult
    clock: RoundClock

    def evaluated(self, figures: tuple[float, float, Mapping[str, Excluded]]) -> RoundResult:
        """The round with the sites' evaluation (accuracy, loss, replies left out) and its timings."""
        accuracy, loss, not_taken = figures
        return evaluated(self.result, accuracy, loss, self.clock.timings(), not_taken)


@dataclass(frozen=True)
class _Carried:
    """The round before, closed, whose evaluation a round's train messages carry; ``finish`` takes
    its result once their replies are in."""

    closed: _Closed
    finish: Callable[[RoundResult], None]


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
    journal:
        The run's event log: rounds are logged there as they close (before any site
        applies them) and finish, which is what a resumed coordinator recovers from.
    recovery:
        The run to resume (:func:`~fedshard.coordinator.recovery.recover`); None: a fresh
        run, refused if the sites hold a later model than genesis.
    membership:
        Where the runtime offers changes between rounds (zones added or drained, sites
        joining: :mod:`fedshard.coordinator.membership`); None: the federation is fixed.
    ledger_book:
        Every site's ledger head and spend across runs of this federation
        (:mod:`fedshard.coordinator.ledger_book`): sites are sent the heads it holds, a site
        whose ledger lost spend it records is refused, and it is kept up to date. None:
        only this run's reports count.
    site_keys:
        Returns the sites' manifest-signing public keys by site id: each node must prove,
        with its site's key, which site it is (:mod:`fedshard.coordinator.binding`). None:
        no proof is asked and the first node per site id is kept (bare library use).
    """

    def __init__(
        self,
        config: FederationConfig,
        sites: SiteGateway,
        zones: Mapping[str, ZoneClient],
        endpoints: Mapping[str, str],
        observer: RoundObserver | None = None,
        *,
        journal: EventLog | None = None,
        recovery: RunRecovery | None = None,
        membership: Membership | None = None,
        ledger_book: LedgerBook | None = None,
        site_keys: SiteKeys | None = None,
    ) -> None:
        self.config = config
        self.sites = sites
        self.zones = dict(zones)
        self.endpoints = dict(endpoints)
        self.observer = observer
        self.journal = journal
        self.recovery = recovery
        self.membership = membership
        self.site_keys = site_keys
        self._refused_nodes: list[NodeRefusal] = []  # refused since the journal last recorded them
        self._bounds: ReplyBounds | None = None  # what replies are held to (from the plan, at discovery)
        self._genesis = self._plan_digest = ""
        self._nodes: dict[str, SiteInfo] = {}  # node key -> site info
        self._groups: dict[str, Group] = {}  # residency group name -> group
        self._group_of: dict[str, str] = {}  # site id -> group name
        self._joining = JoinQueries()
        self._privacy = PrivacyReports()
        self._book = ledger_book
        if ledger_book is not None:
            self._privacy.preload(ledger_book.heads())
        self._apply_rule = apply_rule(config)
        self._plan_json = ""
        self._carried: _Closed | None = None  # the last closed round, its evaluation due with the next train

    @property
    def _timeout(self) -> float:
        return self.config.federation.round_timeout_s

    # assembly --------------------------------------------------------------------------------
    def discover(self) -> RunResult:
        """Ask every connected site who it is; keep those that share the plan and genesis."""
        binding = self._ask(self.sites.nodes(), self._query())
        infos, plan_digest, genesis = agreeing_sites(binding)
        self._refused_nodes += binding.refused
        self._nodes = {node: self._checked_ledger(info) for node, info in infos.items()}
        infos = self._nodes
        self._privacy.reset({i.site_id: i.privacy for i in infos.values() if i.privacy is not None})
        self._remember_ledgers()
        # The plan (names, shapes, dtypes; no values) is what zones check frames against.
        plan_json = next(i.plan_json for i in infos.values())
        plan = ShardPlan.from_json(plan_json)
        if plan.digest != plan_digest:
            raise RoundError("the sites' shard plan does not match its digest")
        self._plan_json, self._plan_digest, self._genesis = plan_json, plan_digest, genesis
        self._bounds = ReplyBounds.of(self.config, plan)
        self._form_groups(genesis)
        self._recover_groups(genesis)
        return RunResult(
            sites=sorted(infos.values(), key=lambda s: s.site_id),
            genesis_version=genesis,
            version=genesis,
            groups={name: list(g.sites) for name, g in sorted(self._groups.items())},
            refused_nodes=[r.as_event() for r in binding.refused],
        )

    def _ask(self, nodes: list[str], query: QueryRequest, taken: dict[str, str] | None = None) -> Binding:
        """Send ``query`` to ``nodes``, each with a challenge of its own; bind those that prove
        which site they are (:func:`~fedshard.coordinator.binding.bind_nodes`; ``taken``: site
        id → node of the sites already bound)."""
        challenges = {n: new_challenge() for n in nodes}
        messages = {n: query.model_copy(update={"challenge": challenges[n]}) for n in nodes}
        replies = self.sites.send(MessageKind.QUERY, messages, self._timeout)
        keys = self.site_keys() if self.site_keys is not None else None
        return bind_nodes(replies, challenges, self.config, keys, taken)

    def _journal_refusals(self, rnd: int) -> None:
        """Record the nodes refused since the last call (``rnd``: the round they were refused before)."""
        if self.journal is not None:
            for refusal in self._refused_nodes:
                self.journal.on_node_refused(rnd, refusal)
        self._refused_nodes = []

    def _query(self, skip: set[str] | frozenset[str] = frozenset()) -> QueryRequest:
        """The query sites answer with who they are: each site's privacy plan (but those of
        ``skip``) and the zones' endpoints."""
        plans = {s.id: self._privacy_plan(s.id) for s in self.config.sites if s.id not in skip}
        heads = {s.id: self._privacy.ledger_head(s.id) for s in self.config.sites if s.id not in skip}
        return QueryRequest(
            privacy={s: p for s, p in plans.items() if p is not None},
            zones=self.endpoints,
            ledger_heads={s: h for s, h in heads.items() if h is not None},
        )

    def _checked_ledger(self, info: SiteInfo) -> SiteInfo:
        """``info``, its privacy report marked refused when its ledger lost spend the ledger book
        records (the site is then never selected; the report says why)."""
        reason = self._book.check(info.site_id, info.privacy) if self._book is not None else None
        if reason is None or info.privacy is None:
            return info
        log.warning("%s", reason)
        refused = info.privacy.model_copy(
            update={"status": PrivacyStatus.REFUSED, "can_afford_next": False, "note": reason, "ledger_head": None}
        )
        return info.model_copy(update={"privacy": refused})

    def _remember_ledgers(self) -> None:
        """Keep the sites' newest ledger heads and spends in the ledger book (refused ones are not taken)."""
        if self._book is not None:
            reports = self._privacy.reports()
            self._book.record({s: r for s, r in reports.items() if r.status is not PrivacyStatus.REFUSED})

    def _form_groups(self, genesis: str) -> None:
        """Group sites by the aggregates they apply (their views)."""
        self._groups, self._group_of = {}, {}
        for name, members in residency_groups(list(self._nodes.values())).items():
            applied = {m.site_id: m.applied_round for m in members}
            self._groups[name] = Group(dict(members[0].view), [m.site_id for m in members], genesis, applied=applied)
            self._group_of.update({m.site_id: name for m in members})
        if len(self._groups) > 1:
            log.info(
                "residency groups: %s",
                "; ".join(f"{n}: {', '.join(g.sites)}" for n, g in sorted(self._groups.items())),
            )

    def _recover_groups(self, genesis: str) -> None:
        """Check the sites' models against the run (fresh: genesis; resumed: the logged chain)
        and, when resuming, give every group its chain up to the last closed round."""
        recovery = self.recovery
        if recovery is not None:
            self._adopt_recorded_names(recovery.group_names)
        check_standing(list(self._nodes.values()), self._group_of, genesis, recovery)
        if recovery is None:
            return
        for name, group in self._groups.items():
            group.rounds = recovery.chain(name)
            group.version = recovery.versions(name)[recovery.last_round]

    def _adopt_recorded_names(self, recorded: set[str]) -> None:
        """Give each group the name the run recorded for it (:func:`~fedshard.coordinator._groups.recorded_names`)."""
        for old, new in recorded_names(list(self._groups), recorded).items():
            self._groups[new] = self._groups.pop(old)
            self._group_of = {site: new if g == old else g for site, g in self._group_of.items()}

    def _group(self, node: str) -> Group:
        return self._groups[self._group_of[self._nodes[node].site_id]]

    # rounds ------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Discover the sites, run every configured round, return the result.

        A round that cannot proceed (too few sites, version disagreement) stops the
        federation: the result then holds the rounds completed and ``stopped_reason``.
        """
        result = self.discover()
        total, recovery = self.config.federation.rounds, self.recovery
        if self.journal is not None:
            self.journal.on_start(
                result.sites,
                total,
                result.genesis_version,
                resumed=recovery.last_round if recovery else 0,
                fixed=fixed_digests(self.config),
            )
        self._journal_refusals(recovery.next_round if recovery else 1)
        if self.observer is not None:
            self.observer.on_start(result.sites, total, result.genesis_version)
        first = 1
        if recovery is not None:
            first = recovery.next_round
            result.aborted = list(recovery.aborted)
            for done in recovery.results():
                self._finished(result, done, log_it=False)
            pending = recovery.unfinished
            if pending is not None:  # closed, not evaluated: the sites apply it now
                try:
                    accuracy, loss, not_taken = self._evaluate(pending.round)
                    self._finished(result, evaluated(pending, accuracy, loss, excluded=not_taken))
                except RoundError as exc:
                    result.stopped_reason = str(exc)
                    return result
            in_flight = recovery.in_flight
            if in_flight is not None:  # the zones hold it open (or lost, after a restart): discard it there first
                abort_everywhere(self.zones, in_flight)
            if in_flight is not None and self.config.privacy.enabled:
                self._aborted(result, in_flight, in_flight_reason(in_flight))
                first = in_flight + 1
            log.info("resuming after round %d: rounds %d to %d", recovery.last_round, first, total)
        in_a_row, rnd = 0, first - 1
        while (rnd := rnd + 1) <= self._take_changes(rnd, result):
            try:
                self._next_round(result, rnd)
                in_a_row = 0
            except RoundAbortedError as exc:
                in_a_row += 1
                self._aborted(result, rnd, str(exc))
                if in_a_row >= MAX_ABORTED_IN_A_ROW:
                    result.stopped_reason = f"{in_a_row} rounds in a row were aborted; the last: {exc}"
                    break
            except RoundError as exc:
                log.info("federation stopped: %s", exc)
                result.stopped_reason = str(exc)
                break
            finally:  # what the round's sites and sums freed (the in-process sites train in this process)
                release_free_memory()
        self._evaluate_carried(result)
        return result

    # membership ------------------------------------------------------------------------------
    def _take_changes(self, rnd: int, result: RunResult) -> int:
        """Take the change the runtime has pending before round ``rnd`` (see
        :mod:`fedshard.coordinator.membership`); the number of rounds the run now has."""
        if self.membership is None:
            return self.config.federation.rounds
        change, joined = self.membership.before_round(rnd), []
        if change is not None:
            self.config = change.config
            self.zones, self.endpoints = dict(change.zones), dict(change.endpoints)
            self._apply_rule = apply_rule(change.config)
            # replies are held to the new config's zones and classes (a new zone's pushes count)
            self._bounds = ReplyBounds.of(change.config, ShardPlan.from_json(self._plan_json))
        if change is not None or len(self._nodes) < len(self.config.sites):
            joined = self._join()  # also sites of the config that connected since an earlier change
            result.refused_nodes += [r.as_event() for r in self._refused_nodes]
            self._journal_refusals(rnd)
        if change is not None or joined:
            if change is not None:
                line = change.description + (f"; {len(joined)} site(s) admitted" if joined else "")
            else:
                line = f"{len(joined)} site(s) admitted: {', '.join(s.site_id for s in joined)}"
            result.sites = sorted(self._nodes.values(), key=lambda s: s.site_id)
            result.groups = {name: list(g.sites) for name, g in sorted(self._groups.items())}
            log.info("before round %d: %s", rnd, line)
            if self.journal is not None:
                self.journal.on_reconfigured(rnd, line, joined, result.groups)
        return self.config.federation.rounds

    def _join(self) -> list[SiteInfo]:
        """Ask the sites that connected since the last change who they are; admit those that may
        join (:func:`~fedshard.coordinator.membership.admit`). Theirs, by site id."""
        fresh = self._joining.to_ask(self.sites.nodes(), self._nodes)
        if not fresh:
            return []
        taken = {info.site_id: node for node, info in self._nodes.items()}
        binding = self._ask(fresh, self._query(skip=set(taken)), taken)
        self._refused_nodes += binding.refused
        infos = binding.infos
        known = {s.id for s in self.config.sites}
        admitted = admit(infos, known, self._plan_digest, self._genesis, self._groups)
        answered = {**infos, **{r.node: r for r in binding.refused}}  # a refused node is not asked again
        self._joining.asked(fresh, answered=answered, admitted=admitted)
        for node, name in admitted.items():
            info = self._checked_ledger(infos[node])
            self._nodes[node] = info
            self._group_of[info.site_id] = name
            self._groups[name].add(info.site_id, info.applied_round)
            if info.privacy is not None:
                self._privacy.record(info.site_id, info.privacy)
        return sorted((infos[n] for n in admitted), key=lambda s: s.site_id)

    def _aborted(self, result: RunResult, rnd: int, reason: str) -> None:
        log.warning("round %d aborted: %s", rnd, reason)
        result.aborted.append({"round": rnd, "reason": reason})
        if self.journal is not None:
            self.journal.on_aborted(rnd, reason)

    def _finished(self, result: RunResult, round_result: RoundResult, *, log_it: bool = True) -> None:
        """Add a finished round to ``result``; log it and show it (recovered rounds: show only)."""
        result.version = round_result.version
        result.rounds.append(round_result)
        if log_it and self.journal is not None:
            self.journal.on_round(round_result)
            faults.point("coordinator.round.done")
        if self.observer is not None:
            self.observer.on_round(round_result)

    def _privacy_plan(self, site_id: str) -> PrivacyPlan | None:
        return privacy_plan(self.config, site_id)  # (tests build a site's instruction with it)

    def run_round(self, rnd: int, version: str) -> RoundResult:
        """Run round ``rnd`` and have every site evaluate it (in a message of its own); ``version``
        is the federation's version before it."""
        selected = select_sites(self.config, self._nodes, self._privacy, rnd)
        return self._evaluated(self._train_round(rnd, version, selected))

    def _next_round(self, result: RunResult, rnd: int) -> None:
        """Round ``rnd`` of :meth:`run`, trained and closed; the round before it is evaluated by
        this one's train messages when every site trains in it, else alone first. The closed
        round waits in ``_carried`` for the next round (or :meth:`_evaluate_carried`)."""
        selected = select_sites(self.config, self._nodes, self._privacy, rnd)
        carried = self._carried
        if carried is not None and set(selected) != set(self._nodes):  # a site that does not train evaluates
            self._finish_carried(result, self._evaluated(carried))
            carried = None
        version = result.version if carried is None else carried.result.version
        finish = functools.partial(self._finish_carried, result)
        self._carried = self._train_round(
            rnd, version, selected, None if carried is None else _Carried(carried, finish)
        )

    def _finish_carried(self, result: RunResult, done: RoundResult) -> None:
        """The carried round, evaluated: add it to ``result`` (logged, shown)."""
        self._carried = None
        self._finished(result, done)

    def _evaluate_carried(self, result: RunResult) -> None:
        """Evaluate the last closed round alone if its evaluation still waits for a train message
        (the run's last round, or one the run stopped after)."""
        if self._carried is None:
            return
        try:
            self._finish_carried(result, self._evaluated(self._carried))
        except RoundError as exc:
            log.info("round %d was not evaluated: %s", self._carried.result.round, exc)
            result.stopped_reason = result.stopped_reason or str(exc)

    def _evaluated(self, closed: _Closed) -> RoundResult:
        """``closed`` evaluated by every site, in evaluate messages."""
        with closed.clock.waiting(Phase.EVALUATE):
            figures = self._evaluate(closed.result.round, closed.clock)
        return closed.evaluated(figures)

    def _train_round(
        self,
        rnd: int,
        version: str,
        selected: list[str],
        carried: _Carried | None = None,
    ) -> _Closed:
        """Run round ``rnd`` over the ``selected`` nodes up to its close (logged). ``carried``: the
        round before, closed, which every node evaluates with this round's train message; its
        result goes to ``carried.finish`` once the replies are in, before this round may abort."""
        clock = RoundClock()
        token = secrets.token_hex(16)
        weights = fixed_weights(self.config, self._nodes)
        with clock.waiting(Phase.OPEN):
            self._open(rnd, token, version, selected, weights)
        if carried is not None:
            carried.closed.clock.stop()  # its time ends here: the evaluation is this round's train time
        with clock.waiting(Phase.TRAIN):
            reports, refused, excluded = self._train(rnd, token, selected, weights, clock, carried)
        codes = {s: r.code for s, r in refused.items() if isinstance(r, TrainReport) and r.code is not None}
        reasons = {s: one_line(r.reason) for s, r in refused.items()}
        min_sites = self.config.federation.min_sites
        pushed = len(reports) + sum(1 for s in excluded if s not in refused)  # the zones will say which counted
        if pushed < min_sites:
            abort_everywhere(self.zones, rnd)
            details = "; ".join(f"{s}: {refusal_line(r, codes.get(s))}" for s, r in sorted(reasons.items()))
            message = (
                f"round {rnd}: only {pushed} of {len(selected)} sites pushed an update "
                f"(federation.min_sites is {min_sites}). {details}"
            )
            if _ZONE_FAILED & set(codes.values()):  # a zone lost the round, or failed the pushes
                raise RoundAbortedError(message)
            raise RoundError(message)
        with clock.waiting(Phase.CLOSE):
            published = close_everywhere(self.zones, rnd, self.config.reducing_zone, self.endpoints, clock)
        counted = {s for summary in published.values() for s in summary.sites}
        if not counted:
            raise RoundError(f"round {rnd}: the zones counted no update")
        announced = [PublishedAggregate.of(s) for s in published.values()]  # the zones' signatures relayed
        roots = {name: group.extend(rnd, published, announced) for name, group in sorted(self._groups.items())}
        ok = {site: r for site, r in reports.items() if site in counted}
        site_weights = {self._nodes[n].site_id: w for n, w in weights.items()}
        group_versions = {name: g.version for name, g in sorted(self._groups.items())}
        excluded_lines, excluded_codes = left_out({}, {}, excluded)  # the train replies left out
        closed = RoundResult(
            round=rnd,
            version=combine_versions(group_versions),
            merkle_root=merkle_root({str(key): s.merkle_root for key, s in published.items()}),
            sites=tuple(sorted(counted)),
            refused=reasons,
            refusal_codes=codes,
            train_loss=weighted_mean({site: r.loss for site, r in ok.items()}, site_weights),
            accuracy=float("nan"),
            loss=float("nan"),
            bytes_up=sum(r.bytes_up for r in ok.values()),
            privacy=self._privacy.as_json(),
            versions=group_versions,
            roots=roots,
            aggregates=aggregate_entries(published.values()),
            timings=clock.timings(),
            traffic=clock.traffic(),
            excluded=excluded_lines,
            excluded_codes=excluded_codes,
        )
        if self.journal is not None:  # logged before any site learns of the round: resumable
            self.journal.on_closed(closed)
        faults.point("coordinator.round.closed")
        return _Closed(closed, clock)

    def _open(self, rnd: int, token: str, version: str, selected: list[str], weights: Mapping[str, float]) -> None:
        """Open the round at every zone (all or none), with each selected site's fixed weight."""
        site_ids = tuple(self._nodes[n].site_id for n in selected)
        versions = {self._nodes[n].site_id: self._group(n).version for n in selected}
        fixed = tuple(sorted((self._nodes[n].site_id, weights[n]) for n in selected))
        spec = RoundSpec(rnd, token, self._plan_json, version, site_ids, tuple(sorted(versions.items())), fixed)
        open_everywhere(self.zones, spec)
        if self.journal is not None:  # before any site reserves budget for it
            self.journal.on_opened(rnd)
        faults.point("coordinator.round.opened")

    def _train(
        self,
        rnd: int,
        token: str,
        selected: list[str],
        weights: Mapping[str, float],
        clock: RoundClock,
        carried: _Carried | None = None,
    ) -> tuple[dict[str, TrainReport], dict[str, TrainReport | SiteFailure], dict[str, Excluded]]:
        """Send the train messages; by site id: the reports of sites that pushed, the refusals or
        failures of the others, and the replies left out of the round's metrics (checked by
        :func:`~fedshard.coordinator._replies.check_train`; a site whose reply is left out but
        says it pushed is in neither of the first two: the zones say whether it counted).
        ``carried``: the round before, evaluated with these messages, its result given to its ``finish``."""
        weight_scale = max(weights.values())  # encrypted shards carry weight / scale ≤ 1
        evaluate = None if carried is None else carried.closed.result.round
        instructions = {
            node: self._instruction(node, rnd, token, weights[node], weight_scale, evaluate) for node in selected
        }
        replies = self.sites.send(MessageKind.TRAIN, instructions, self._timeout)
        if carried is not None:
            evaluations = {node: _carried_evaluation(reply) for node, reply in replies.items()}
            closed = carried.closed
            carried.finish(closed.evaluated(self._take_evaluations(closed.result.round, evaluations, closed.clock)))
        assert self._bounds is not None  # set at discovery
        reports: dict[str, TrainReport] = {}
        refused: dict[str, TrainReport | SiteFailure] = {}
        excluded: dict[str, Excluded] = {}
        for node, reply in replies.items():
            site_id = self._nodes[node].site_id
            if isinstance(reply, TrainReport):
                why = check_train(reply, site_id, rnd, self._bounds)
                if why is not None:
                    excluded[site_id] = why
                    log.warning("round %d: site %s's train reply is left out: %s", rnd, site_id, why.line())
                    if not reply.ok:
                        refused[site_id] = SiteFailure(reason=f"its reply is left out: {why.line()}")
                    continue
                clock.trained(site_id, reply, self._nodes[node].jurisdiction)
                self._group(node).record(site_id, reply.applied_round)
                if reply.privacy is not None:
                    self._privacy.record(site_id, clean_privacy(reply.privacy))
            if isinstance(reply, TrainReport) and reply.ok:
                reports[site_id] = reply
            else:
                refused[site_id] = (
                    reply
                    if isinstance(reply, TrainReport | SiteFailure)
                    else SiteFailure(reason=f"answered a train message with a {type(reply).__name__}")
                )
                log.info("round %d: site %s did not contribute: %s", rnd, site_id, one_line(refused[site_id].reason))
        self._remember_ledgers()
        return reports, refused, excluded

    def _instruction(
        self, node: str, rnd: int, token: str, weight: float, weight_scale: float, evaluate: int | None = None
    ) -> TrainInstruction:
        """What one site needs for round ``rnd``: its group's head and the rounds it has not applied
        (``evaluate``: the round it evaluates first, see :meth:`_train`)."""
        site_id = self._nodes[node].site_id
        group = self._group(node)
        t = self.config.training
        return TrainInstruction(
            round=rnd,
            token=token,
            base_version=group.version,
            missed=group.missed(site_id),
            zones=self.endpoints,
            epochs=t.local_epochs,
            batch_size=t.sent_batch_size,
            learning_rate=t.learning_rate,
            seed=derive_seed(self.config.federation.seed, rnd, site_id),
            privacy=self._privacy_plan(site_id),
            apply=self._apply_rule,
            weight_scale=weight_scale,
            ledger_head=self._privacy.ledger_head(site_id),
            projection_hint=self._privacy.projection_hint(site_id),
            weight=weight,
            deadline_s=min(self._timeout, 86400.0),
            evaluate=evaluate,
        )

    def _evaluate(self, rnd: int, clock: RoundClock | None = None) -> tuple[float, float, dict[str, Excluded]]:
        """Every site applies its aggregates and evaluates; accuracy and loss weighted by the
        coordinator's fixed weights over the replies it takes, and those it leaves out
        (:func:`~fedshard.coordinator._replies.check_evaluate`: another model version than the
        one the coordinator computed for the site's group, figures out of bounds), by site id."""
        messages = {
            node: EvaluateInstruction(
                round=rnd,
                version=self._group(node).version,
                missed=self._group(node).missed(self._nodes[node].site_id),
                zones=self.endpoints,
                apply=self._apply_rule,
            )
            for node in self._nodes
        }
        replies = self.sites.send(MessageKind.EVALUATE, messages, self._timeout)
        return self._take_evaluations(rnd, replies, clock)

    def _take_evaluations(
        self, rnd: int, replies: Mapping[str, BaseModel | SiteFailure], clock: RoundClock | None
    ) -> tuple[float, float, dict[str, Excluded]]:
        """Round ``rnd``'s evaluations by node (evaluate replies, or carried by train replies):
        checked, then weighted as :meth:`_evaluate` says."""
        taken: dict[str, EvaluateReport] = {}
        excluded: dict[str, Excluded] = {}
        for node, reply in replies.items():
            site_id = self._nodes[node].site_id
            if isinstance(reply, SiteFailure):
                log.warning("round %d: site %s did not evaluate: %s", rnd, site_id, one_line(reply.reason))
                continue
            why = check_evaluate(reply, site_id, rnd, self._group(node).version)
            if why is not None:
                excluded[site_id] = why
                log.warning("round %d: site %s's evaluation is left out: %s", rnd, site_id, why.line())
                continue
            assert isinstance(reply, EvaluateReport)  # check_evaluate said so
            if clock is not None:
                clock.evaluated(site_id, reply)
            self._group(node).record(site_id, reply.applied_round)
            taken[site_id] = reply
        weights = {self._nodes[n].site_id: w for n, w in fixed_weights(self.config, self._nodes).items()}
        accuracy = weighted_mean({s: r.accuracy for s, r in taken.items()}, weights)
        loss = weighted_mean({s: r.loss for s, r in taken.items()}, weights)
        return accuracy, loss, excluded


def _carried_evaluation(reply: BaseModel | SiteFailure) -> BaseModel | SiteFailure:
    """The evaluation a train reply carries (:attr:`TrainReport.evaluation`), or why there is none."""
    if not isinstance(reply, TrainReport):
        return reply  # a failure, or a reply of another kind: the evaluation check leaves it out
    if reply.evaluation is None:
        why = f": {one_line(reply.reason)}" if reply.reason else ""
        return SiteFailure(reason=f"its train reply carries no evaluation{why}")
    return reply.evaluation
