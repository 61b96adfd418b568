"""A zone started again on the store of one that stopped (:mod:`fedshard.zone.recovery`,
:mod:`fedshard.zone._journal`): published rounds kept, open rounds lost and refused, torn
and half-written files cut off without touching the rest; and a retried push that the
zone holds (:class:`~fedshard.errors.HeldPush`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedshard.audit import AuditLog, verify_audit_log
from fedshard.errors import HeldPush, PushRejectedError, RefusalCode, StoreError, ZoneError
from fedshard.protocol.rounds import RoundSpec
from fedshard.zone._journal import RoundJournal, RoundState
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.recovery import DISCARDED_DIR, repair_audit_tail
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve
from tests.zone_helpers import BASE, TOKEN, random_update
from tests.zone_helpers import ONE_ZONE as ZONE
from tests.zone_helpers import ONE_ZONE_SITES as SITES
from tests.zone_helpers import ONE_ZONE_WEIGHTS as WEIGHTS
from tests.zone_helpers import SMALL_PLAN as PLAN
from tests.zone_helpers import one_zone_manifest as manifest_for


def make_update(seed: int) -> dict[str, np.ndarray]:
    return random_update(seed, PLAN)


def _open(zone: ZoneAggregator, rnd: int) -> None:
    zone.open_round(RoundSpec(rnd, TOKEN, PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))


def _pushed(zone: ZoneAggregator, rnd: int, site: str = "site-a", seed: int = 1) -> None:
    update = make_update(seed)
    zone.push(manifest_for(site, update, round=rnd), TOKEN, update)


def _published(store: Path, rnd: int) -> list[Path]:
    return sorted(store.glob(f"aggregate-{rnd:06d}-*.npz"))


def test_a_round_open_when_the_zone_stopped_is_lost_and_refused_with_code_round(tmp_path: Path) -> None:
    before = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    _open(before, 1)
    _pushed(before, 1)
    del before  # killed: its sums were in memory

    zone = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    assert zone.recovery.lost == {1}
    assert any("round 1 was open when the zone stopped" in n for n in zone.recovery.notes)
    update = make_update(2)
    with pytest.raises(PushRejectedError, match="round 1 was lost") as push:
        zone.push(manifest_for("site-b", update), TOKEN, update)
    with pytest.raises(ZoneError, match="round 1 was lost") as close:
        zone.close_round(1)
    assert push.value.code is close.value.code is RefusalCode.ROUND
    with pytest.raises(ZoneError, match="already opened"):
        _open(zone, 1)
    assert ZoneAggregator(ZONE, "EU", store_dir=tmp_path).recovery.lost == {1}  # until aborted
    zone.abort_round(1)  # what the coordinator does next
    assert ZoneAggregator(ZONE, "EU", store_dir=tmp_path).recovery.lost == set()
    _open(zone, 2)  # the next round runs
    _pushed(zone, 2)
    assert zone.close_round(2)[0].sites == ("site-a",)
    with pytest.raises(ZoneError, match="round 2 was already published here"):
        _open(zone, 2)
    _open(zone, 1)  # an aborted round may be opened again, afresh (a coordinator resuming it)
    with pytest.raises(PushRejectedError, match="round token"):
        zone.push(manifest_for("site-b", update), "the token of the lost round", update)


def test_published_rounds_survive_and_closing_one_again_answers_its_summaries(tmp_path: Path) -> None:
    before = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    _open(before, 1)
    _pushed(before, 1)
    summaries = before.close_round(1)
    _open(before, 2)  # and stopped while round 2 was open

    zone = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    assert zone.recovery.lost == {2} and zone.recovery.closed == {1}
    assert zone.close_round(1) == summaries  # a coordinator that lost the first answer asks again
    assert zone.fetch(1).summary == summaries[0]
    assert json.loads(RoundJournal(tmp_path / "rounds").path(1).read_text())["state"] == "published"


def test_a_publish_cut_short_is_discarded_and_never_served(tmp_path: Path) -> None:
    before = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    _open(before, 1)
    _pushed(before, 1)
    before.close_round(1)
    _open(before, 2)
    _pushed(before, 2)
    # killed after writing one aggregate of round 2 (as zone.publish.written@1:kill does)
    written = tmp_path / _published(tmp_path, 1)[0].name.replace("000001", "000002")
    written.write_bytes(_published(tmp_path, 1)[0].read_bytes())
    (tmp_path / ".aggregate-000002-regional-any.x1.tmp").write_bytes(b"half")

    zone = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    assert _published(tmp_path, 2) == [] and not list(tmp_path.glob(".aggregate-*"))
    assert (tmp_path / DISCARDED_DIR / written.name).exists()
    assert len(_published(tmp_path, 1)) == 1  # the rest untouched
    assert all("\n" not in n for n in zone.recovery.notes) and len(zone.recovery.notes) == 3
    with pytest.raises(ZoneError, match="round 2 was lost"):
        zone.close_round(2)


def test_a_half_written_aggregate_is_moved_aside_the_others_kept(tmp_path: Path) -> None:
    before = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    for rnd in (1, 2):
        _open(before, rnd)
        _pushed(before, rnd, seed=rnd)
        before.close_round(rnd)
    torn = _published(tmp_path, 2)[0]
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])

    zone = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    assert [n for n in zone.recovery.notes if "does not read back" in n]
    assert (tmp_path / DISCARDED_DIR / torn.name).exists() and not torn.exists()
    assert zone.fetch(1).summary.round == 1


def test_journal_keeps_the_last_state_and_reports_strange_files(tmp_path: Path) -> None:
    journal = RoundJournal(tmp_path)
    journal.write(3, RoundState.OPEN)
    journal.write(3, RoundState.PUBLISHED, ("regional/any",))
    (tmp_path / "000004.json").write_text("{not json")
    (tmp_path / ".000005.abc.tmp").write_text("cut")
    records, notes = journal.load()
    assert records[3].state is RoundState.PUBLISHED and records[3].groups == ("regional/any",)
    assert set(records) == {3} and len(notes) == 1 and "000004.json" in notes[0]
    assert not (tmp_path / ".000005.abc.tmp").exists()


def test_a_torn_last_audit_line_is_cut_off_and_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        for n in range(3):
            log.append("accepted", n=n)
    assert repair_audit_tail(path) is None  # a clean end: nothing to do
    whole = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"seq":4,"time":1.0,"decis')  # the crash cut this append short

    note = repair_audit_tail(path)
    assert note is not None and "torn" in note and "\n" not in note
    assert path.read_bytes() == whole
    assert (tmp_path / "audit.jsonl.torn").read_bytes() == b'{"seq":4,"time":1.0,"decis\n'
    with AuditLog(path) as log:
        assert log.lines == 3
    assert verify_audit_log(path).ok


def test_a_log_broken_before_its_last_line_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        for n in range(3):
            log.append("accepted", n=n)
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"n":1', b'"n":7')
    path.write_bytes(b"\n".join(lines) + b"{torn")
    assert repair_audit_tail(path) is not None  # only the torn tail goes
    with pytest.raises(StoreError, match="broken"):
        AuditLog(path)


def test_a_retried_push_learns_whether_the_zone_holds_this_very_manifest(tmp_path: Path) -> None:
    zone = ZoneAggregator(ZONE, "EU")
    _open(zone, 1)
    a = make_update(1)
    manifest = manifest_for("site-a", a)
    # the first attempt is still arriving
    with zone.begin_push(manifest, TOKEN), pytest.raises(PushRejectedError) as pending:
        zone.push(manifest, TOKEN, a)
    assert pending.value.code is RefusalCode.DUPLICATE and pending.value.held is HeldPush.PENDING
    zone.push(manifest, TOKEN, a)  # that attempt broke off: nothing of it counted, pushed afresh
    with pytest.raises(PushRejectedError) as counted:
        zone.push(manifest, TOKEN, a)
    assert counted.value.held is HeldPush.COUNTED and "this very manifest: counted" in str(counted.value)
    other = make_update(2)
    with pytest.raises(PushRejectedError) as different:
        zone.push(manifest_for("site-a", other), TOKEN, other)
    assert different.value.code is RefusalCode.DUPLICATE and different.value.held is None
    assert zone.close_round(1)[0].sites == ("site-a",)


def test_what_the_zone_holds_travels_over_grpc() -> None:
    zone = ZoneAggregator(ZONE, "EU")
    _open(zone, 1)
    server, port = serve(zone, "127.0.0.1:0", max_workers=2)
    a = make_update(1)
    try:
        with GrpcZoneClient(f"127.0.0.1:{port}", timeout=20) as client:
            manifest = manifest_for("site-a", a)
            client.push(manifest, TOKEN, a)
            with pytest.raises(PushRejectedError) as again:
                client.push(manifest, TOKEN, a)
            b = make_update(2)
            with pytest.raises(PushRejectedError) as other:
                client.push(manifest_for("site-a", b), TOKEN, {k: np.asarray(v) for k, v in b.items()})
    finally:
        server.stop(grace=None).wait(timeout=10)
    assert again.value.code is RefusalCode.DUPLICATE and again.value.held is HeldPush.COUNTED
    assert other.value.code is RefusalCode.DUPLICATE and other.value.held is None


def test_a_reducing_zone_that_restarts_has_lost_the_forwarded_sums_and_refuses_the_round(tmp_path: Path) -> None:
    from dataclasses import replace

    from fedshard.integrity import build_manifest
    from tests.zone_helpers import FORWARD_WEIGHTS, random_update, reducing_policy
    from tests.zone_helpers import SMALL_PLAN as FPLAN

    fsites = ("site-a", "site-b")  # the forwarding tests' two sites

    spec = RoundSpec(1, TOKEN, FPLAN.to_json(), BASE, fsites, weights=FORWARD_WEIGHTS)
    policy = reducing_policy(FPLAN, fsites)
    reducer = {"eu-1": ZoneAggregator("eu-1", "EU", store_dir=tmp_path, residency=policy)}

    class Link:  # us-1's client of whichever eu-1 process is running
        def forward(self, partial: object, values: object) -> int:
            return reducer["eu-1"].receive_partial(partial, values, certified="us-1")  # type: ignore[arg-type]

        def close(self) -> None:
            pass

    us = ZoneAggregator(
        "us-1",
        "US",
        residency=replace(policy, zone="us-1", region="US"),
        connect=lambda n, e: Link(),  # type: ignore[arg-type,return-value]
        peers={"eu-1": "live"},
    )
    for zone in (reducer["eu-1"], us):
        zone.open_round(spec)
    update = random_update(3, FPLAN)
    manifest = build_manifest(
        site_id="site-a",
        round=1,
        plan_digest=FPLAN.digest,
        base_version=BASE,
        zone="us-1",
        weight=4.0,
        shards=update,
        classes=dict.fromkeys(update, "public"),
        policy_digest=policy.policy.digest,
    )
    us.push(manifest, TOKEN, update)
    us.close_round(1, forward_to=("eu-1", "live"))  # forwarded (zone.forward.sent / .received) ...
    reducer["eu-1"] = ZoneAggregator("eu-1", "EU", store_dir=tmp_path, residency=policy)  # ... then eu-1 killed
    with pytest.raises(ZoneError, match="round 1 was lost") as info:
        reducer["eu-1"].close_round(1)
    assert info.value.code is RefusalCode.ROUND  # the coordinator aborts the round: nothing published

    us.open_round(replace(spec, round=2))  # a forward that reaches the restarted zone is refused too
    reducer["eu-1"].open_round(replace(spec, round=2))
    reducer["eu-1"] = ZoneAggregator("eu-1", "EU", store_dir=tmp_path, residency=policy)
    us.push(replace(manifest, round=2), TOKEN, update)
    with pytest.raises(PushRejectedError, match="round 2 is not open") as forward:
        us.close_round(2, forward_to=("eu-1", "live"))
    assert forward.value.code is RefusalCode.ROUND
