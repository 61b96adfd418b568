"""Resuming a federation after its coordinator died, and going on after a zone failed a round (issue 16).

Real processes: ``fedshard simulate`` SIGKILLed at named points of a round, then
``fedshard simulate --resume``, ends with the model-version chain of an uninterrupted
run of the same seed; a deployment (``aggregator up``, two ``site up``) whose aggregator
host dies after round 1 finishes under ``aggregator up --resume``. A fresh run on sites
whose stores hold a later model is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import yaml
from pydantic import BaseModel

from fedshard.assembly import SIGNING_KEY_FILE, grpc_connector, make_site, make_zone, running_zones, streaming_parties
from fedshard.assembly.routing import FederationRouting
from fedshard.config import FederationConfig, load_federation
from fedshard.coordinator.coordinator import MAX_ABORTED_IN_A_ROW, Coordinator
from fedshard.coordinator.events import EventLog, replay
from fedshard.coordinator.recovery import RESUME_HINT, recover
from fedshard.coordinator.results import RoundResult
from fedshard.crypto.signing import generate_signing_key
from fedshard.deploy.keys import provision
from fedshard.deploy.loopback import write_loopback_layout
from fedshard.errors import RoundError
from fedshard.integrity import next_version
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.messages import MessageKind, QueryRequest, SiteFailure
from fedshard.protocol.rounds import RoundSpec
from fedshard.run_folder.resume import with_rounds
from fedshard.transports.inprocess import InProcessSiteGateway
from fedshard.zone.rpc.service import serve
from tests.deploy_helpers import events, fedshard, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]
FEDSHARD = [sys.executable, "-m", "fedshard.cli.main"]
SITES = ["charite-berlin", "mayo-rochester"]


def _fedshard(*args: str, faults: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", COLUMNS="200")
    env.pop("FEDSHARD_FAULTS", None)
    if faults:
        env["FEDSHARD_FAULTS"] = faults
    return subprocess.run([*FEDSHARD, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def _chain(run: Path) -> list[tuple[int, str, dict[str, str]]]:
    summary = json.loads((run / "summary.json").read_text())
    return [(h["round"], h["model_version"], h["group_versions"]) for h in summary["history"]]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sites in two jurisdictions (an EU-regional group and the global one), two zones."""
    path = tmp_path_factory.mktemp("resume") / "fed.yaml"
    cfg = {
        "federation": {"name": "resume", "seed": 11, "rounds": 3, "min_sites": 2},
        "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
        "zones": [
            {"name": "eu-1", "region": "EU", "endpoint": "127.0.0.1:0"},
            {"name": "us-1", "region": "US", "endpoint": "127.0.0.1:0"},
        ],
        "reducing_zone": "eu-1",
        "sites": [
            {"id": "eu-a", "jurisdiction": "EU"},
            {"id": "eu-b", "jurisdiction": "EU"},
            {"id": "us-a", "jurisdiction": "US"},
        ],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def uninterrupted(federation: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, str, dict[str, str]]]:
    """The version chain of the federation run without interruption: (round, version, group versions)."""
    run = tmp_path_factory.mktemp("plain") / "run"
    plain = _fedshard("simulate", "--config", str(federation), "--out", str(run))
    assert plain.returncode == 0, plain.stderr
    chain = _chain(run)
    assert len(chain) == 3 and len({v for _, v, _ in chain}) == 3
    assert len(chain[0][2]) == 2, "the federation should have two residency groups"
    return chain


def _resume_and_check(run: Path, expected: list[tuple[int, str, dict[str, str]]], resumed_after: int) -> None:
    """Resume the run in ``run``; it ends with ``expected``, every site holding the last version."""
    resumed = _fedshard("simulate", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr
    assert _chain(run) == expected
    starts = [e for e in _events(run) if e["event"] == "start"]
    assert [s["resumed"] for s in starts] == [0, resumed_after]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 3 and not summary["stopped_reason"] and not summary["aborted_rounds"]
    assert _site_versions(run) == {s["id"]: (3, s["model_version"]) for s in summary["sites"]}


@pytest.mark.slow
def test_simulate_killed_after_a_round_closed_resumes_to_the_uninterrupted_chain(
    federation: Path, uninterrupted: list[tuple[int, str, dict[str, str]]], tmp_path: Path
) -> None:
    # Killed after round 2 closed at the zones (logged), before any site applied it.
    run = tmp_path / "run"
    killed = _fedshard(
        "simulate", "--config", str(federation), "--out", str(run), faults="coordinator.round.closed@2:kill"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _events(run)[-1]["event"] == "closed" and not (run / "summary.json").exists()
    # a fresh run in that folder is refused, in one line, pointing at --resume
    again = _fedshard("simulate", "--config", str(federation), "--out", str(run))
    assert again.returncode == 2 and again.stderr.count("error:") == 1 and "--resume" in again.stderr
    _resume_and_check(run, uninterrupted, resumed_after=2)  # the sites apply round 2, then round 3 runs


def _site_versions(run: Path) -> dict[str, tuple[int, str]]:
    """What each site of the run in ``run`` reports holding (applied round, version), in-process."""
    config = load_federation(run / "federation.yaml")
    routing = FederationRouting(config)
    sites = {s.id: make_site(config, s.id, run / "sites", routing) for s in config.sites}
    gateway = InProcessSiteGateway(sites)
    try:
        infos = Coordinator(config, gateway, {}, _endpoints(config), recovery=recover(run / "events.jsonl"))
        return {i.site_id: (i.applied_round, i.version) for i in infos.discover().sites}
    finally:
        gateway.close()


def _endpoints(config: FederationConfig) -> dict[str, str]:
    """Zone endpoints for a discovery only (sites derive their residency groups from the zones' names)."""
    return {z.name: "127.0.0.1:1" for z in config.zones}


@pytest.mark.slow
def test_simulate_killed_in_an_open_round_is_refused_fresh_and_redoes_the_round_on_resume(
    federation: Path, uninterrupted: list[tuple[int, str, dict[str, str]]], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    killed = _fedshard(
        "simulate", "--config", str(federation), "--out", str(run), faults="coordinator.round.opened@3:kill"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # round 2's train messages carried round 1's evaluation (the sites applied round 1); round 2 closed
    assert [e["event"] for e in _events(run)][-3:] == ["round", "closed", "opened"]
    config = load_federation(run / "federation.yaml")
    routing = FederationRouting(config)
    sites = {s.id: make_site(config, s.id, run / "sites", routing) for s in config.sites}
    gateway = InProcessSiteGateway(sites)
    try:
        with pytest.raises(RoundError) as refused:
            Coordinator(config, gateway, {}, _endpoints(config)).discover()  # no recovery: a fresh run
        line = str(refused.value)
        assert "\n" not in line and "later model than this run's genesis" in line
        assert all(f"{s} holds round 1" in line for s in sites) and "aggregator up --resume" in line
    finally:
        gateway.close()
    # round 2 is evaluated alone (the sites apply it), then round 3, open when it died, is run again
    _resume_and_check(run, uninterrupted, resumed_after=2)
    bad = _fedshard("simulate", "--resume", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "no run to resume" in bad.stderr


@pytest.mark.slow
def test_deployment_whose_aggregator_host_died_finishes_under_resume(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["federation"].update(rounds=2, min_sites=2, round_timeout_s=90)
        data.pop("privacy", None)
        data.pop("residency", None)
        data["sites"] = [s for s in data["sites"] if s["id"] in SITES]
        data["zones"] = [z for z in data["zones"] if z["name"] in ("eu-central", "us-east")]
        data["deployment"].update(wait_s=240)

    layout = write_loopback_layout(ROOT / "configs", tmp_path, edit=edit, tls=False)
    provision(load_federation(layout["aggregator"]), tmp_path / "keys")
    logs = tmp_path / "logs"
    logs.mkdir()
    up = ["aggregator", "up", "--insecure", "--config", str(layout["aggregator"])]
    config = ["--config", str(layout["aggregator"])]
    state_dir = tmp_path / "runs" / "aggregator"
    # The coordinator stalls once round 1 is logged; then the aggregator process alone is killed
    # (SIGKILL): its zones, SuperLink, SuperExec and the stalled ServerApp must stop with it.
    aggregator = _start(up, tmp_path, logs / "agg.log", faults="coordinator.round.done@1:pause=600")
    sites = [
        _start(["site", "up", "--insecure", "--config", str(layout[s])], tmp_path, logs / f"{s}.log") for s in SITES
    ]
    procs = [aggregator, *sites]
    try:
        wait_for(lambda: any(e["event"] == "round" for e in events(tmp_path)), 400, "round 1", procs)
        # a second aggregator on the same state folder is refused in one line and writes nothing
        second = fedshard(*up, cwd=tmp_path)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stdout + second.stderr
        assert f"another aggregator (pid {aggregator.pid}) runs with state folder" in second.stderr
        status = json.loads((state_dir / "status.json").read_text())  # still the first one's (it updates it)
        assert status["pid"] == aggregator.pid and status["phase"] == "running"
        assert sorted(state_dir.glob("run-*")) == [Path(status["run_dir"])]  # no run folder of its own

        started = psutil.Process(aggregator.pid).children(recursive=True)
        assert len(started) >= 5  # two zones, the SuperLink, its SuperExec and the ServerApp
        os.kill(aggregator.pid, signal.SIGKILL)
        aggregator.wait(10)
        _, alive = psutil.wait_procs(started, timeout=60)
        assert not alive, [p.cmdline()[:3] for p in alive]
        said = fedshard("aggregator", "status", *config, cwd=tmp_path)
        assert said.returncode == 0 and "died while running" in said.stdout and "--resume` goes on" in said.stdout
        as_json = json.loads(fedshard("aggregator", "status", *config, "--json", cwd=tmp_path).stdout)
        assert as_json["died"] is True and as_json["running"] is False and as_json["pid"] == aggregator.pid
        before = [e for e in events(tmp_path) if e["event"] == "round"]
        assert [e["round"] for e in before] == [1]

        resumed = _start([*up, "--resume"], tmp_path, logs / "agg-resumed.log")
        procs.append(resumed)
        resumed.wait(600)
        out = (logs / "agg-resumed.log").read_text()
        assert resumed.returncode == 0, out[-3000:]
        nothing = fedshard("aggregator", "stop", *config, cwd=tmp_path)
        assert nothing.returncode == 0 and "nothing to stop" in nothing.stdout
    finally:
        stop(procs)
    (run_dir,) = (tmp_path / "runs" / "aggregator").glob("run-*")  # resumed in the same folder
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2 and not summary["stopped_reason"], summary["stopped_reason"]
    first, second = summary["history"]
    assert first["group_versions"] == before[0]["versions"]  # round 1 as logged before the crash
    for group, version in second["group_versions"].items():  # round 2 extends it
        assert version == next_version(first["group_versions"][group], second["group_roots"][group])
    group_of = {site: group for group, members in summary["residency_groups"].items() for site in members}
    assert {s["id"]: s["model_version"] for s in summary["sites"]} == {
        site: second["group_versions"][group_of[site]] for site in SITES
    }


def _start(args: list[str], cwd: Path, log: Path, faults: str = "") -> subprocess.Popen[bytes]:
    """``fedshard ARGS`` in its own session (as :func:`tests.deploy_helpers.start`), with ``faults``."""
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", COLUMNS="200")
    env.pop("FEDSHARD_FAULTS", None)
    if faults:
        env["FEDSHARD_FAULTS"] = faults
    with log.open("ab") as out:
        return subprocess.Popen(
            [*FEDSHARD, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


class _StaleOpener(EventLog):
    """The run's event log, which once round ``after`` closes (is logged closed) opens ``rounds`` at
    one zone first, as a stale coordinator would: the zone then refuses the coordinator's own
    opening of them (a real refusal, over gRPC)."""

    def __init__(self, path: Path, zone: ZoneClient, plan_json: str, after: dict[int, list[int]]) -> None:
        super().__init__(path)
        self.zone, self.plan_json, self.after = zone, plan_json, after

    def on_closed(self, result: RoundResult) -> None:
        """Log the round closed, then open the rounds planned after it at the zone."""
        super().on_closed(result)
        for rnd in self.after.get(result.round, []):
            self.zone.open_round(RoundSpec(rnd, "stale", self.plan_json, result.version, ("eu-a",)))


def test_rounds_a_zone_fails_are_aborted_logged_and_the_federation_goes_on(federation: Path, tmp_path: Path) -> None:
    config = with_rounds(load_federation(federation), 6)
    keys = {}
    for s in config.sites:
        (tmp_path / "sites" / s.id).mkdir(parents=True)
        keys[s.id] = generate_signing_key(tmp_path / "sites" / s.id / SIGNING_KEY_FILE)
    routing = FederationRouting(config)
    sites = {s.id: make_site(config, s.id, tmp_path / "sites", routing) for s in config.sites}
    gateway = InProcessSiteGateway(sites)
    with running_zones(config, tmp_path / "zones", keys) as endpoints:
        zones = {name: grpc_connector(name, ep) for name, ep in endpoints.items()}
        plan_json = sites["eu-a"].query(QueryRequest()).plan_json
        # round 2 fails at us-1, round 3 runs; then rounds 4, 5 and 6 fail one after the other
        stale = journal = _StaleOpener(
            tmp_path / "events.jsonl", grpc_connector("us-1", endpoints["us-1"]), plan_json, {1: [2], 3: [4, 5, 6]}
        )
        try:
            result = Coordinator(config, gateway, zones, endpoints, journal=journal).run()
        finally:
            gateway.close()
            for zone in [*zones.values(), stale.zone]:
                zone.close()
    assert [r.round for r in result.rounds] == [1, 3]
    assert [a["round"] for a in result.aborted] == [2, 4, 5, 6]
    assert all("zone us-1 could not open the round" in str(a["reason"]) for a in result.aborted)
    assert result.stopped_reason.startswith(f"{MAX_ABORTED_IN_A_ROW} rounds in a row were aborted")
    assert "\n" not in result.stopped_reason and "round 6: zone us-1" in result.stopped_reason
    # round 3 went on from round 1's model: the chain skips the aborted round
    assert result.rounds[1].versions != result.rounds[0].versions
    replayed = replay(journal.path)  # the log shows it all (summary.json's aborted_rounds)
    assert [a["round"] for a in replayed.aborted] == [2, 4, 5, 6] and [r.round for r in replayed.rounds] == [1, 3]


class _ZoneDiesBeforeTraining:
    """The in-process gateway, except that zone us-1's server stops just before round 2's train
    messages go out: the zone dies with the round open, and the US site's push cannot land."""

    def __init__(self, inner: InProcessSiteGateway, server: grpc.Server) -> None:
        self.inner, self.server = inner, server

    def nodes(self) -> list[str]:
        """The in-process sites."""
        return self.inner.nodes()

    def send(
        self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float
    ) -> dict[str, BaseModel | SiteFailure]:
        """Send as the in-process gateway does, stopping the zone first at round 2's train."""
        if kind is MessageKind.TRAIN and any(getattr(m, "round", 0) == 2 for m in messages.values()):
            self.server.stop(grace=None).wait()
        return self.inner.send(kind, messages, timeout)


def test_a_zone_dead_during_pushes_aborts_the_round_not_the_federation(federation: Path, tmp_path: Path) -> None:
    data = load_federation(federation).model_dump(mode="json")
    # the US site's push is needed; its retries of the dead zone end with the round (8 s, not the default 5 min)
    data["federation"].update(rounds=4, min_sites=3, round_timeout_s=8)
    config = FederationConfig.model_validate(data)
    keys = {}
    for s in config.sites:
        (tmp_path / "sites" / s.id).mkdir(parents=True)
        keys[s.id] = generate_signing_key(tmp_path / "sites" / s.id / SIGNING_KEY_FILE)
    routing = FederationRouting(config)
    servers, endpoints = {}, {}
    for zc in config.zones:
        zone = make_zone(zc, tmp_path / "zones", routing=routing, site_keys=keys, peers=endpoints)
        servers[zc.name], port = serve(zone, "127.0.0.1:0", parties=streaming_parties(config))
        endpoints[zc.name] = f"127.0.0.1:{port}"
    sites = {s.id: make_site(config, s.id, tmp_path / "sites", routing) for s in config.sites}
    inner = InProcessSiteGateway(sites)
    zones = {name: grpc_connector(name, ep) for name, ep in endpoints.items()}
    try:
        gateway = _ZoneDiesBeforeTraining(inner, servers["us-1"])
        result = Coordinator(config, gateway, zones, endpoints).run()
    finally:
        inner.close()
        for client in zones.values():
            client.close()
        for server in servers.values():
            server.stop(grace=None).wait()
    assert [r.round for r in result.rounds] == [1]
    # round 2: the US site could not push (the zone is gone); rounds 3 and 4: the zone cannot open them
    assert [a["round"] for a in result.aborted] == [2, 3, 4]
    assert "only 2 of 3 sites pushed an update" in str(result.aborted[0]["reason"])
    assert "us-a: failed:" in str(result.aborted[0]["reason"]) and "unreachable" in str(result.aborted[0]["reason"])
    assert "zone us-1 could not open the round" in str(result.aborted[1]["reason"])
    assert result.stopped_reason.startswith("3 rounds in a row were aborted")


def test_a_resume_with_a_config_reconfigure_would_refuse_is_refused_in_one_line(
    federation: Path, tmp_path: Path
) -> None:
    """Issue 32, item 6: the run records digests of its fixed config parts; the sites of a
    resumed simulation take their terms from the run folder's federation.yaml, so an edit
    there that `reconfigure` would refuse (privacy, residency, a zone's region) is refused."""
    from fedshard.config.changes import fixed_digests
    from fedshard.errors import ConfigError
    from fedshard.simulate.run import simulate

    run = tmp_path / "run"
    simulate(with_rounds(load_federation(federation), 1), run)
    start = next(e for e in _events(run) if e["event"] == "start")
    assert start["fixed"] == fixed_digests(load_federation(run / "federation.yaml"))
    data = yaml.safe_load((run / "federation.yaml").read_text())
    data["zones"][1]["region"] = "EU"  # us-1 would now hold EU shards
    (run / "federation.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as refused:
        simulate(load_federation(run / "federation.yaml"), run, resume=True)
    line = str(refused.value)
    assert "zone us-1 differs from what the run started with" in line and "\n" not in line
    data["zones"][1]["region"] = "US"
    data["federation"]["rounds"] = 2  # what reconfigure takes is taken
    (run / "federation.yaml").write_text(yaml.safe_dump(data))
    assert simulate(load_federation(run / "federation.yaml"), run, resume=True)["rounds"] == 2


def test_a_finished_run_is_not_resumed_again_and_trains_on_with_more_rounds_counting_the_whole_run(
    tmp_path: Path,
) -> None:
    """Resuming a finished run changes nothing and says how to train on; training on keeps one record:
    the zones' counters cover every round, not only those after the resume; no hint says to delete a ledger."""
    run = tmp_path / "run"
    demo = str(ROOT / "configs" / "demo.yaml")
    first = fedshard("simulate", "--config", demo, "--rounds", "2", "--out", str(run), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    again = fedshard("simulate", "--resume", str(run), cwd=tmp_path)
    assert again.returncode == 2 and again.stdout == "" and again.stderr.count("\n") == 1, again.stdout + again.stderr
    assert "finished its 2 rounds: nothing to resume, nothing was changed" in again.stderr
    assert f"`fedshard simulate --resume {run} --rounds 4`" in again.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    two = json.loads((run / "summary.json").read_text())

    more = fedshard("simulate", "--resume", str(run), "--rounds", "4", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    four = json.loads((run / "summary.json").read_text())
    assert four["rounds"] == len(four["history"]) == 4 and four["history"][:2] == two["history"]
    for z2, z4 in zip(two["zones"], four["zones"], strict=True):
        assert (z4["pushes"], z4["rounds_closed"], z4["bytes_received"]) == (
            2 * z2["pushes"],
            4,
            2 * z2["bytes_received"],
        )
        assert z4["shards_by_class"] == {k: 2 * v for k, v in z2["shards_by_class"].items()}
    # the hint for sites that hold a later model: go on with their run, never delete their state (the ledger)
    assert "--rounds N" in RESUME_HINT and "delete the" not in RESUME_HINT and "never delete" in RESUME_HINT


def test_an_encrypted_run_resumes_from_its_own_config_on_the_contexts_it_made(federation: Path, tmp_path: Path) -> None:
    """A config without ``he.keys`` makes its run's HE contexts under ``<out>/keys``; resuming with
    that same config (as a driver that adds rounds one at a time does) uses those contexts, not
    none: the zones' sums stay decryptable by the same sites."""
    from fedshard.simulate.run import simulate

    config = load_federation(federation)
    config = config.model_copy(update={"residency": config.residency.model_copy(update={"encrypt": "all"})})
    assert config.he.keys is None
    run = tmp_path / "run"
    simulate(with_rounds(config, 1), run)
    keys = (run / "keys").resolve()
    assert load_federation(run / "federation.yaml").he.keys == keys
    resumed = simulate(with_rounds(config, 2), run, resume=True)
    assert resumed["rounds"] == 2 and not resumed["stopped_reason"] and not resumed["aborted_rounds"]
    second = resumed["history"][1]
    assert sorted(second["sites"]) == ["eu-a", "eu-b", "us-a"] and not second["refused"]
