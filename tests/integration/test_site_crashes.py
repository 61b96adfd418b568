"""A site SIGKILLed at any of more than a hundred points of a message keeps its privacy
budget and its store, and rejoins.

A DP federation (the breast-cancer demo task, record-level DP) runs one round with two
sites; the victim misses that round's evaluate, so its next message catches up (fetch,
verify, apply, save) before it trains (ledger, DP-SGD, seal, push, commit). Its state
is then copied once per crash point; each copy gets a train message for its own round at
the zone, in a child forked by a warm parent (:mod:`tests.site_forker`), SIGKILLed at one
``(point, occurrence)`` of the message (``FEDSHARD_FAULTS``). A fresh child then retries
the same round and, if the ledger refuses it, takes the next one. After that:

* the ledger's ε spent is within the budget (small: two more rounds fit, a third not),
  counts every reservation whether committed or not, and holds a reservation for every
  round the zone counted a push of the site in;
* the store opens, every shard verifies, the catalog's Merkle root and model version
  agree, the version is one the federation published, the ledger holds the head the
  store anchors;
* the site rejoined: it caught up to the federation's version and its push of the
  retried or next round was counted;
* the zone never counted two pushes of the site in one round.

A second, smaller set kills a fresh site's first message (a query: genesis model saved,
ledger created) and checks the same after it queries again and trains.

The suite kills every point once, at an occurrence drawn with a fixed seed (about half the
pairs, every point); the full sweep (100 train and 16 query pairs, every point at its first,
last and middle occurrences) runs with ``FEDSHARD_CRASH_SWEEP=full``::

    FEDSHARD_CRASH_SWEEP=full .venv/bin/python -m pytest tests/integration/test_site_crashes.py
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest

from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.protocol.messages import (
    LedgerHeadReport,
    MessageKind,
    PrivacyStatus,
    QueryRequest,
    SiteInfo,
    TrainInstruction,
    TrainReport,
)
from fedshard.site.ledger_anchor import CatalogAnchor
from fedshard.site.model_store import site_kek
from fedshard.site.privacy import LEDGER_FILE, ledger_key
from fedshard.store.sealed_store import SealedShardStore
from fedshard.store.verify import check_store
from tests.crash_helpers import (
    VICTIM,
    Forker,
    Job,
    base_run,
    counted_pushes,
    crash_config,
    open_round,
    phases,
    pick_points,
    read_points,
    sample_points,
    scenario_instruction,
    snapshot_site,
    zones_up,
)

pytestmark = pytest.mark.slow

FULL_SWEEP = os.environ.get("FEDSHARD_CRASH_SWEEP") == "full"
TRAIN_POINTS = 100  # (point, occurrence) pairs killed in a train message (full sweep)
QUERY_POINTS = 16  # ... in a fresh site's first message
SAMPLE_SEED = 33  # the suite's draw of one occurrence per point


def test_a_site_killed_at_any_point_keeps_its_budget_and_store_and_rejoins(tmp_path: Path) -> None:
    config = crash_config(rounds=1)
    t0 = time.monotonic()
    with (
        Forker(config, stderr=tmp_path / "forker.log") as forker,
        zones_up(config, tmp_path / "zones") as (zones, endpoints),
    ):
        result, gateway = base_run(config, tmp_path / "base", endpoints)
        assert [r.sites for r in result.rounds] == [("s0", VICTIM)], result.stopped_reason
        published = {result.genesis_version, result.version}
        zone = zones["eu-central"]
        query = gateway.sent[("query", 0, VICTIM)]
        info = gateway.replies[("query", 0, VICTIM)]
        first = gateway.sent[("train", 1, VICTIM)]
        assert isinstance(query, QueryRequest) and isinstance(info, SiteInfo)
        assert isinstance(first, TrainInstruction)
        state_root = tmp_path / "base" / "sites"

        # The budget: the round of the base run and two more fit, a third more does not.
        kek = site_kek(state_root.parent / "store-keys" / f"{VICTIM}.kek", create=False)
        with PrivacyLedger(state_root / VICTIM / LEDGER_FILE, None, key=ledger_key(kek)) as ledger:
            (entry,) = ledger.entries()
        event, delta = entry.event, entry.delta
        costs = [_epsilon(event, k, delta) for k in range(1, 7)]
        budget = (costs[2] + costs[3]) / 2
        forker.prime([(event.noise_multiplier, event.sample_rate, event.steps * k) for k in range(1, 7)], delta, "prv")

        rounds = iter(range(1000, 100000))
        used: dict[Path, set[int]] = collections.defaultdict(set)  # scenario rounds by state root

        def train_job(name: str, root: Path, faults: str = "", head: LedgerHeadReport | None = None) -> Job:
            rnd = next(rounds)
            used[root].add(rnd)
            token = open_round(zone, rnd, info.plan_json, result.version, first.weight)
            message = scenario_instruction(gateway, rnd, token, budget)
            if head is not None:  # a fresh site: the head its query reported, not the base run's site's
                message = message.model_copy(update={"ledger_head": head})
            return Job(name, root, MessageKind.TRAIN, message, faults)

        def query_job(name: str, root: Path, faults: str = "", log: Path | None = None) -> Job:
            return Job(name, root, MessageKind.QUERY, query, faults, log)

        # One clean run of each kind of message lists the points it passes.
        clean_train = train_job("clean-train", snapshot_site(state_root, VICTIM, tmp_path / "clean-train"))
        clean_train.log = tmp_path / "clean-train.points"
        clean_query = query_job("clean-query", _fresh(tmp_path / "clean-query"), log=tmp_path / "clean-query.points")
        for job in (clean_train, clean_query):
            job.modules = tmp_path / f"{job.id}.modules"
        forker.run([clean_train, clean_query])
        forker.preload([clean_train, clean_query])
        assert clean_train.status == "ok" and isinstance(clean_train.reply, TrainReport), clean_train.error
        assert clean_train.reply.ok, clean_train.reply.reason
        assert clean_query.status == "ok" and isinstance(clean_query.reply, SiteInfo), clean_query.error
        passed = {kind: read_points(tmp_path / f"clean-{kind}.points") for kind in ("train", "query")}
        if FULL_SWEEP:
            train_points = pick_points(passed["train"], TRAIN_POINTS)
            query_points = pick_points(passed["query"], QUERY_POINTS)
        else:
            train_points, query_points = (sample_points(passed[kind], SAMPLE_SEED) for kind in ("train", "query"))
        t_setup = time.monotonic() - t0

        # Kill a copy of the site at each point.
        crashes: list[Job] = []
        for point, n in train_points:
            root = snapshot_site(state_root, VICTIM, tmp_path / f"t-{point}-{n}")
            crashes.append(train_job(f"t-{point}-{n}", root, f"{point}@{n}:kill"))
        for point, n in query_points:
            crashes.append(query_job(f"q-{point}-{n}", _fresh(tmp_path / f"q-{point}-{n}"), f"{point}@{n}:kill"))
        forker.run(crashes)
        unkilled = [(j.id, j.status, j.error[-300:]) for j in crashes if j.status != "killed"]
        assert not unkilled, unkilled
        for job in crashes:  # as the kill left it: the model it had or the next, whole; the budget kept
            _check_killed(job.state_root, budget, published)

        # A fresh process for each: the same round again (train) or the query again ...
        again = [Job(j.id + "-again", j.state_root, j.kind, j.message) for j in crashes]
        forker.run(again)
        _assert_answers(again)
        # ... then, where the ledger refused the retried round (it was reserved before the
        # kill) or after the query, the next round.
        nexts = []
        for retry in again:
            reply = retry.reply
            if isinstance(reply, TrainReport) and reply.ok:
                continue
            head = None
            if isinstance(reply, TrainReport):
                assert "already has a reservation" in reply.reason, (retry.id, reply.reason)
            else:
                assert isinstance(reply, SiteInfo) and reply.privacy is not None, retry.id
                head = reply.privacy.ledger_head
            nexts.append(train_job(retry.id.removesuffix("-again") + "-next", retry.state_root, head=head))
        forker.run(nexts)
        _assert_answers(nexts)
        last = {j.state_root: j for j in [*again, *nexts]}

        # A site whose kill cost it a round has spent its budget after the next: it refuses more.
        spent = [j for j in last.values() if isinstance(j.reply, TrainReport) and j.reply.privacy is not None]
        exhausted = [j for j in spent if j.reply.privacy.status is PrivacyStatus.EXHAUSTED]
        assert exhausted and all(not j.reply.privacy.can_afford_next for j in exhausted)
        refused = train_job("exhausted", exhausted[0].state_root)
        forker.run([refused])
        _assert_answers([refused])
        assert isinstance(refused.reply, TrainReport) and not refused.reply.ok
        assert "over the budget" in refused.reply.reason, refused.reply.reason
        t_crashes = time.monotonic() - t0 - t_setup

    counts = counted_pushes(tmp_path / "zones" / "eu-central")
    assert max(counts.values()) == 1, "a zone counted two pushes of one site in one round"
    assert not counts.get((VICTIM, refused.message.round))  # type: ignore[attr-defined]
    for root, job in last.items():
        reply = job.reply
        assert isinstance(reply, TrainReport) and reply.ok, (job.id, reply)
        assert reply.applied_round == 1, (job.id, reply.applied_round)
        assert counts.get((VICTIM, job.message.round)) == 1  # type: ignore[attr-defined]
        pushed = {r for r in used[root] if counts.get((VICTIM, r))}
        _check_site(root, budget, event, delta, pushed, result.version)
    where = {
        **phases(read_points(tmp_path / "clean-query.points")),
        **phases(read_points(tmp_path / "clean-train.points")),
    }
    by_phase = collections.Counter(where[pair] for pair in train_points + query_points)
    print(
        f"\n{len(crashes)} crash points ({len(train_points)} train, {len(query_points)} query) over phases "
        f"{dict(sorted(by_phase.items()))}; setup {t_setup:.1f}s, crashes and recovery {t_crashes:.1f}s"
    )
    # every point a message passes was killed (the full sweep: at 100 + 16 of their occurrences)
    assert {p for p, _ in train_points + query_points} == {p for kind in passed.values() for p, _ in kind}
    assert len(crashes) >= (100 if FULL_SWEEP else 30), len(crashes)


def _epsilon(event: DPEvent, rounds: int, delta: float) -> float:
    return epsilon(
        [DPEvent(Guarantee.RECORD, event.noise_multiplier, event.sample_rate, event.steps * rounds)],
        delta,
        AccountantKind.PRV,
    )


def _fresh(folder: Path) -> Path:
    """A state root for a site that has never run (its store key is made on first use)."""
    (folder / "sites").mkdir(parents=True)
    return folder / "sites"


def _assert_answers(jobs: list[Job]) -> None:
    """Every fresh process answered: no exception, a reason of one line where it refused."""
    failed = [(j.id, j.status, j.error[-400:]) for j in jobs if j.status != "ok"]
    assert not failed, failed
    for job in jobs:
        reason = getattr(job.reply, "reason", "")
        assert "\n" not in reason, (job.id, reason)


def _check_killed(root: Path, budget: float, published: set[str]) -> None:
    """What a kill leaves: a store that verifies and holds a published version (or, killed
    before its first model commit, none), a ledger within its budget."""
    key_file = root.parent / "store-keys" / f"{VICTIM}.kek"
    if not (root / VICTIM / "shards" / "catalog").exists():
        return  # killed before the store's first commit: nothing stored yet
    kek = site_kek(key_file, create=False)
    with SealedShardStore.open(root / VICTIM / "shards", kek) as store:
        report = check_store(store)
    assert report.ok, (root, report.problems)
    assert report.model_version is None or report.model_version in published, root
    if (root / VICTIM / LEDGER_FILE).exists():
        with PrivacyLedger(root / VICTIM / LEDGER_FILE, None, key=ledger_key(kek)) as ledger:
            assert ledger.spent(Guarantee.RECORD) <= min(budget, ledger.budget.epsilon), root


def _check_site(
    root: Path,
    budget: float,
    event: DPEvent,
    delta: float,
    pushed: set[int],
    head: str,
) -> None:
    """The invariants of one site's state after its crash and recovery."""
    kek = site_kek(root.parent / "store-keys" / f"{VICTIM}.kek", create=False)
    with PrivacyLedger(root / VICTIM / LEDGER_FILE, None, key=ledger_key(kek)) as ledger:
        entries = ledger.entries()
        spent = ledger.spent(Guarantee.RECORD)
        anchor = CatalogAnchor(root / VICTIM / "shards", kek).read()
        assert anchor is not None and ledger.contains(anchor.head), root
        assert ledger.budget.epsilon <= budget
    assert spent <= budget, (root, spent, budget)
    reserved = {e.round for e in entries}
    assert len(reserved) == len(entries)
    # every reservation counts, committed or not
    assert spent == pytest.approx(_epsilon(event, len(entries), delta), rel=1e-9), root
    # every push the zone counted was reserved first; nothing is committed that was not counted
    assert pushed <= reserved, (root, pushed, reserved)
    assert {e.round for e in entries if e.committed and e.round >= 1000} <= pushed, root
    with SealedShardStore.open(root / VICTIM / "shards", kek) as store:
        report = check_store(store)
    assert report.ok, (root, report.problems)
    assert report.model_version == head, root  # the federation's version: it caught up
