"""Recovering a run from its event log: version chains, the round in flight, the next round;
and the one-line refusals of sites the run does not lead to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedshard.coordinator.events import EventLog
from fedshard.coordinator.recovery import check_standing, recover
from fedshard.coordinator.results import RoundResult
from fedshard.errors import RoundError
from fedshard.integrity import next_version
from fedshard.protocol.messages import SiteInfo

GENESIS = "0" * 64


def _site(site_id: str, applied: int, version: str) -> SiteInfo:
    return SiteInfo(
        site_id=site_id,
        jurisdiction="EU",
        num_examples=10,
        plan_digest="p",
        plan_json="{}",
        genesis_version=GENESIS,
        version=version,
        applied_round=applied,
    )


def _closed(rnd: int, root: str) -> RoundResult:
    aggregate = {"zone": "eu-1", "group": "global", "merkle_root": root, "shards": 1, "sites": ["a"]}
    return RoundResult(
        round=rnd,
        version="",
        merkle_root=root,
        sites=("a",),
        refused={},
        train_loss=0.0,
        accuracy=math.nan,
        loss=math.nan,
        bytes_up=0,
        roots={"EU": root},
        aggregates=[aggregate],
    )


def test_a_log_gives_the_chain_the_round_to_finish_and_the_next_round(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.on_start([_site("a", 0, GENESIS)], 6, GENESIS)
    for rnd in (1, 2):
        log.on_opened(rnd)
        log.on_closed(_closed(rnd, f"{rnd}" * 64))
    log.on_round(_closed(1, "1" * 64))  # round 2 closed, never evaluated
    log.on_opened(3)
    log.on_aborted(3, "round 3: zone eu-1 could not close the round")
    log.on_opened(4)  # open when the coordinator died
    recovery = recover(log.path)
    assert recovery.last_round == 2 and recovery.next_round == 4 and recovery.in_flight == 4
    assert recovery.unfinished is not None and recovery.unfinished.round == 2
    assert [r.round for r in recovery.results()] == [1]
    chain = recovery.chain("EU")
    assert [(a.round, a.merkle_root) for a in chain] == [(1, "1" * 64), (2, "2" * 64)]
    assert chain[1].aggregates[0].zone == "eu-1" and chain[1].aggregates[0].merkle_root == "2" * 64
    v1 = next_version(GENESIS, "1" * 64)
    assert recovery.versions("EU") == {0: GENESIS, 1: v1, 2: next_version(v1, "2" * 64)}
    with pytest.raises(RoundError, match="no residency group 'US'"):
        recovery.chain("US")

    # a resumed segment that finished round 2 and ran round 4: nothing in flight any more
    log.on_start([_site("a", 2, "")], 6, GENESIS, resumed=2)
    log.on_round(_closed(2, "2" * 64))
    log.on_opened(4)
    log.on_closed(_closed(4, "4" * 64))
    again = recover(log.path)
    assert again.last_round == 4 and again.next_round == 5 and again.in_flight is None and again.unfinished is not None


def test_sites_the_run_does_not_lead_to_are_refused_in_one_line(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.on_start([_site("a", 0, GENESIS)], 3, GENESIS)
    log.on_closed(_closed(1, "1" * 64))
    recovery = recover(log.path)
    v1 = recovery.versions("EU")[1]
    group_of = {"a": "EU", "b": "EU"}

    check_standing([_site("a", 1, v1), _site("b", 0, GENESIS)], group_of, GENESIS, recovery)  # behind is fine
    with pytest.raises(RoundError) as fresh:
        check_standing([_site("a", 1, v1), _site("b", 0, GENESIS)], group_of, GENESIS, None)
    assert "\n" not in str(fresh.value) and "a holds round 1" in str(fresh.value) and "--resume" in str(fresh.value)
    with pytest.raises(RoundError, match="b holds round 2, after the last round logged"):
        check_standing([_site("a", 1, v1), _site("b", 2, "e" * 64)], group_of, GENESIS, recovery)
    with pytest.raises(RoundError, match="model of round 1 is not the run's"):
        check_standing([_site("a", 1, "e" * 64)], group_of, GENESIS, recovery)
    with pytest.raises(RoundError, match="another model or seed"):
        check_standing([_site("a", 0, "f" * 64)], group_of, "f" * 64, recovery)


def test_a_folder_without_a_run_cannot_be_resumed(tmp_path: Path) -> None:
    with pytest.raises(RoundError, match="no run to resume"):
        recover(tmp_path / "events.jsonl")
    EventLog(tmp_path / "events.jsonl").on_stop("refused")
    with pytest.raises(RoundError, match="never assembled its sites"):
        recover(tmp_path / "events.jsonl")


def test_a_replayed_log_counts_the_sites_that_joined_mid_run(tmp_path: Path) -> None:
    from fedshard.coordinator.events import replay

    log = EventLog(tmp_path / "events.jsonl")
    log.on_start([_site("a", 0, GENESIS)], 3, GENESIS)
    log.on_round(_closed(1, "1" * 64))
    log.on_reconfigured(2, "zone uk added; site(s) b joined", [_site("b", 0, GENESIS)], {"global": ["a", "b"]})
    log.on_reconfigured(2, "refused: zone uk is missing")  # a refused change changes nothing
    result = replay(log.path)
    assert [s.site_id for s in result.sites] == ["a", "b"]
    assert result.groups == {"global": ["a", "b"]}
    (joined, refused) = [e for e in log.read()[0] if e["event"] == "reconfigured"]
    assert joined["joined"] == ["b"] and refused["joined"] == [] and "groups" not in refused


def _two_rounds(path: Path) -> EventLog:
    log = EventLog(path)
    log.on_start([_site("a", 0, GENESIS)], 6, GENESIS)
    for rnd in (1, 2):
        log.on_opened(rnd)
        log.on_closed(_closed(rnd, f"{rnd}" * 64))
        log.on_round(_closed(rnd, f"{rnd}" * 64))
    return log


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"garbage {\n", "line 8: not JSON"),
        (b"[1, 2]\n", "line 8: not an event"),
        (b'{"event": "closed", "round": 3, "sites": 7}\n', "'closed' event does not hold what fedshard writes"),
        (b'{"event": "round", "round": "x"}\n', "'round' event does not hold what fedshard writes"),
        (b'{"event": "opened", "round": [3]}\n', "'opened' event does not hold what fedshard writes"),
    ],
)
def test_a_log_holding_a_line_fedshard_never_writes_is_refused_in_one_line(
    tmp_path: Path, line: bytes, says: str
) -> None:
    log = _two_rounds(tmp_path / "events.jsonl")
    with log.path.open("ab") as fh:
        fh.write(line)
    before = log.path.read_bytes()
    with pytest.raises(RoundError) as info:
        recover(log.path)
    message = str(info.value)
    assert says in message and "\n" not in message and "nothing was changed" in message
    assert log.path.read_bytes() == before


def test_a_torn_last_line_is_ignored_and_cut_before_the_next_event(tmp_path: Path) -> None:
    log = _two_rounds(tmp_path / "events.jsonl")
    with log.path.open("ab") as fh:
        fh.write(b'{"event": "opened", "rou')  # what a crash in the middle of a write leaves
    recovery = recover(log.path)
    assert recovery.last_round == 2 and recovery.in_flight is None
    resumed = EventLog(log.path)  # the resumed coordinator's log
    resumed.on_start([_site("a", 2, "")], 6, GENESIS, resumed=2)
    events = [json.loads(line) for line in log.path.read_bytes().splitlines()]  # every line whole
    assert [e["event"] for e in events[-2:]] == ["round", "start"] and len(events) == 8
    assert recover(log.path).last_round == 2  # and the log resumes again


def test_aggregator_up_resume_refuses_a_log_it_cannot_resume_before_starting_anything(tmp_path: Path) -> None:
    from fedshard.deploy.preflight import LATEST_RUN, run_to_resume
    from fedshard.errors import ConfigError

    run = tmp_path / "run-1"
    log = _two_rounds(run / "events.jsonl")
    assert run_to_resume(tmp_path, LATEST_RUN) == run.resolve()
    with log.path.open("a") as fh:
        fh.write("garbage {\n")
    with pytest.raises(ConfigError, match="line 8: not JSON") as info:
        run_to_resume(tmp_path, run)
    assert "\n" not in str(info.value)
