"""A zone's refusal reaches the user typed: its code plus the zone's one line, from the
zone (real gRPC on loopback) through the site's TrainReport to the round result, the
event log, summary.json and the progress display."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel
from rich.console import Console

from fedshard.assembly import grpc_connector, make_site, running_zones
from fedshard.cli._progress import RoundProgress
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.events import EventKind, EventLog, replay
from fedshard.coordinator.results import RoundObserver, RoundResult
from fedshard.errors import RefusalCode
from fedshard.integrity import Manifest
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.messages import MessageKind, SiteFailure, SiteInfo, TrainReport, decode, encode
from fedshard.protocol.rounds import PushReceipt, ShardPayload
from fedshard.run_folder.summary import build_summary
from fedshard.transports.inprocess import InProcessSiteGateway


def _config() -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "toy", "seed": 3, "rounds": 1, "min_sites": 2, "round_timeout_s": 60},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 1, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "zones": [{"name": "z1", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(3)],
        }
    )


class _Corrupting:
    """A zone client whose pushes lose a bit on the way: one shard's values change
    after the site built its manifest (a faulty link, not the site's doing)."""

    def __init__(self, inner: ZoneClient, corrupted: list[str]) -> None:
        self._inner = inner
        self._corrupted = corrupted

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        sid = next(e.shard_id for e in manifest.shards if not e.encrypted)
        self._corrupted.append(sid)
        values = shards[sid]
        assert isinstance(values, np.ndarray)
        return self._inner.push(manifest, token, {**shards, sid: values + np.float32(1.0)})

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class _Recording:
    """Gateway wrapper: keeps every train reply as the coordinator received it."""

    def __init__(self, inner: InProcessSiteGateway) -> None:
        self.inner = inner
        self.train: dict[str, BaseModel | SiteFailure] = {}

    def nodes(self) -> list[str]:
        return self.inner.nodes()

    def send(
        self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float
    ) -> dict[str, BaseModel | SiteFailure]:
        out = self.inner.send(kind, messages, timeout)
        if kind is MessageKind.TRAIN:
            self.train.update(out)
        return out


class _Fanout:
    """Observer that passes every event on to each of ``observers``."""

    def __init__(self, *observers: RoundObserver) -> None:
        self._observers = observers

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        for o in self._observers:
            o.on_start(sites, rounds, genesis_version)

    def on_round(self, result: RoundResult) -> None:
        for o in self._observers:
            o.on_round(result)


def test_a_refused_push_reaches_the_round_result_with_its_code_and_the_zones_line(tmp_path: Path) -> None:
    config = _config()
    corrupted: list[str] = []

    def faulty(name: str, endpoint: str) -> ZoneClient:
        return _Corrupting(grpc_connector(name, endpoint), corrupted)  # type: ignore[return-value]

    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites if s.id != "s2"}
        sites["s2"] = make_site(config, "s2", tmp_path / "sites", connect=faulty)
        gateway = _Recording(InProcessSiteGateway(sites))
        zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
        events = EventLog(tmp_path / "events.jsonl")
        console = Console(record=True, width=400)
        try:
            with RoundProgress(console) as progress:
                result = Coordinator(config, gateway, zones, endpoints, _Fanout(events, progress)).run()
        finally:
            gateway.inner.close()
            for z in zones.values():
                z.close()

    (sid,) = corrupted
    line = f"zone z1 refused s2's push for round 1: shard {sid}: digest does not match the manifest"
    # the site's report
    report = gateway.train["s2"]
    assert isinstance(report, TrainReport) and not report.ok and report.pushes == []
    assert (report.code, report.reason) == (RefusalCode.DIGEST, line)
    ok = gateway.train["s0"]
    assert isinstance(ok, TrainReport) and ok.ok and ok.code is None
    assert [p.zone for p in ok.pushes] == ["z1"] and ok.bytes_up == ok.pushes[0].nbytes > 0
    # the round went on without it, and keeps the code beside the line
    assert result.stopped_reason == ""
    (round1,) = result.rounds
    assert round1.sites == ("s0", "s1")
    assert round1.refused == {"s2": line}
    assert round1.refusal_codes == {"s2": RefusalCode.DIGEST}
    assert round1.refusal("s2") == f"digest: {line}"
    # the event log keeps it typed
    (replayed,) = replay(tmp_path / "events.jsonl").rounds
    assert replayed.refusal_codes == {"s2": RefusalCode.DIGEST} and replayed.refused == round1.refused
    # summary.json and the progress display show the code and the line
    history = build_summary(config, result, "inprocess", [], None, 0.0)["history"][0]
    assert history["refused"] == {"s2": f"digest: {line}"}
    assert history["refusal_codes"] == {"s2": "digest"}
    shown = console.export_text()
    assert f"s2 digest: {line}" in shown and "1 refused" in shown


def test_too_few_sites_stops_the_run_with_each_refusals_code(tmp_path: Path) -> None:
    config = _config()
    corrupted: list[str] = []

    def faulty(name: str, endpoint: str) -> ZoneClient:
        return _Corrupting(grpc_connector(name, endpoint), corrupted)  # type: ignore[return-value]

    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites", connect=faulty) for s in config.sites}
        gateway = InProcessSiteGateway(sites)
        zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
        try:
            result = Coordinator(config, gateway, zones, endpoints).run()
        finally:
            gateway.close()

    assert result.rounds == [] and len(corrupted) == 3
    assert "round 1: only 0 of 3 sites pushed an update" in result.stopped_reason
    for site in ("s0", "s1", "s2"):
        assert f"{site}: digest: zone z1 refused {site}'s push for round 1: shard " in result.stopped_reason


@pytest.mark.parametrize("code", [None, RefusalCode.DIGEST])
def test_a_train_report_carries_its_code_on_the_wire(code: RefusalCode | None) -> None:
    report = TrainReport(site_id="s", round=3, ok=False, reason="one line", code=code)
    back = decode(TrainReport, encode(report))
    assert back.code is code and back.reason == "one line"


def test_the_event_log_writes_its_kinds_as_their_values(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.on_stop("")
    (event,), _ = log.read()
    assert event["event"] == "stop" and type(event["event"]) is str  # readers of events.jsonl see plain values
    kinds = ["start", "opened", "closed", "round", "aborted", "reconfigured", "stop", "node-refused"]
    assert [k.value for k in EventKind] == kinds
