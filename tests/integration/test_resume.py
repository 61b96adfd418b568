"""Resuming a federation after its coordinator died (issue 16).

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
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedshard.assembly import make_site
from fedshard.config import FederationConfig, load_federation
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.recovery import recover
from fedshard.errors import RoundError
from fedshard.routing import FederationRouting
from fedshard.transports.inprocess import InProcessSiteGateway

ROOT = Path(__file__).resolve().parents[2]
FEDSHARD = [sys.executable, "-m", "fedshard.cli.main"]


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


@pytest.mark.slow
def test_simulate_killed_mid_round_resumes_to_the_uninterrupted_chain(federation: Path, tmp_path: Path) -> None:
    plain = _fedshard("simulate", "--config", str(federation), "--out", str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr
    expected = _chain(tmp_path / "plain")
    assert len(expected) == 3 and len({v for _, v, _ in expected}) == 3
    assert len(expected[0][2]) == 2, "the federation should have two residency groups"

    # Killed after round 2 closed at the zones, before the sites applied it; then while round 2 was open.
    for point, logged in (("coordinator.round.closed@2:kill", "closed"), ("coordinator.round.opened@2:kill", "round")):
        run = tmp_path / point.split("@")[0]
        killed = _fedshard("simulate", "--config", str(federation), "--out", str(run), faults=point)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert _events(run)[-1]["event"] == logged and not (run / "summary.json").exists()
        # a fresh run in that folder is refused, in one line, pointing at --resume
        again = _fedshard("simulate", "--config", str(federation), "--out", str(run))
        assert again.returncode == 2 and again.stderr.count("error:") == 1 and "--resume" in again.stderr

        resumed = _fedshard("simulate", "--resume", str(run))
        assert resumed.returncode == 0, resumed.stderr
        assert _chain(run) == expected, point
        starts = [e for e in _events(run) if e["event"] == "start"]
        assert [s["resumed"] for s in starts] == [0, 2 if logged == "closed" else 1]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["rounds"] == 3 and not summary["stopped_reason"] and not summary["aborted_rounds"]
        # every site's store holds the model the summary says it should
        held = _site_versions(run)
        assert held == {s["id"]: (3, s["model_version"]) for s in summary["sites"]}


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


def test_a_fresh_run_on_sites_ahead_of_genesis_is_refused_in_one_line(federation: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    killed = _fedshard(
        "simulate", "--config", str(federation), "--out", str(run), faults="coordinator.round.opened@2:kill"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
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
        # resuming it is accepted: every site stands where the log says
        resumed = Coordinator(config, gateway, {}, _endpoints(config), recovery=recover(run / "events.jsonl"))
        infos = resumed.discover().sites
        assert {i.applied_round for i in infos} == {1}
    finally:
        gateway.close()
    bad = _fedshard("simulate", "--resume", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1 and "no run to resume" in bad.stderr
