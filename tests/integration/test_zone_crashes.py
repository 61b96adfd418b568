"""A zone killed or paused mid-round, as a real process: ``fedshard zone up --insecure`` on a
fixed loopback port, SIGKILLed at a fault point (``FEDSHARD_FAULTS``) and started again on
the same folder by the test; the coordinator and three DP sites run in this process.

Whatever the point, the interrupted round is aborted (nothing of it published) or
completes, the next round publishes, no site is counted twice, and every site's ledger
stays within its budget with the reservation of the lost round counted as spent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedshard.assembly import STORE_KEYS_DIR, make_site
from fedshard.audit import verify_audit_log
from fedshard.config import FederationConfig, load_federation
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.results import RoundResult
from fedshard.errors import RoundError
from fedshard.privacy.ledger import PrivacyLedger
from fedshard.protocol.channels import ZoneClient
from fedshard.site.model_store import site_kek
from fedshard.site.privacy import LEDGER_FILE, ledger_key
from fedshard.transports.inprocess import InProcessSiteGateway
from fedshard.zone.rpc.client import GrpcZoneClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SITES = ("s0", "s1", "s2")
EPSILON = 8.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(tmp: Path, port: int) -> Path:
    data = {
        "federation": {"name": "crash", "seed": 3, "rounds": 2, "min_sites": 2, "round_timeout_s": 90},
        "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
        "training": {"local_epochs": 1, "batch_size": 8, "learning_rate": 0.05},
        "sharding": {"tile": [4, 4]},
        "privacy": {
            "record_level": {"enabled": True, "noise_multiplier": 1.5, "max_grad_norm": 1.0, "accountant": "rdp"},
            "budget": {"epsilon": EPSILON, "delta": 1e-3},
        },
        "zones": [{"name": "z1", "region": "EU", "endpoint": f"127.0.0.1:{port}", "store": str(tmp / "zone")}],
        "sites": [{"id": s, "jurisdiction": "EU"} for s in SITES],
    }
    path = tmp / "federation.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class ZoneProcess:
    """``fedshard zone up`` on the config's zone; restarted (without faults) once it dies."""

    def __init__(self, config: Path, endpoint: str, faults: str, log_dir: Path) -> None:
        self.config, self.endpoint, self.log_dir = config, endpoint, log_dir
        self.starts = 0
        self.proc = self._start(faults)
        self.restarted = threading.Event()
        self.failure: BaseException | None = None
        self._stop = False
        self._watch = threading.Thread(target=self._restart_when_dead, daemon=True)
        self._watch.start()

    def _start(self, faults: str) -> subprocess.Popen[bytes]:
        self.starts += 1
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDSHARD_FAULTS": faults}
        env.pop("FEDSHARD_FAULTS_LOG", None)
        out = open(self.log_dir / f"zone-{self.starts}.log", "wb")  # noqa: SIM115 (the process holds it)
        cmd = [sys.executable, "-m", "fedshard.cli.main", "zone", "up", "-c", str(self.config), "--zone", "z1"]
        proc = subprocess.Popen([*cmd, "--insecure"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        with GrpcZoneClient(self.endpoint) as client:
            client.wait_ready(120)
        return proc

    def _restart_when_dead(self) -> None:
        code = self.proc.wait()
        if self._stop:
            return
        try:
            if code != -9:
                raise AssertionError(f"the zone exited with {code}, not killed at its fault point")
            self.proc = self._start("")
        except BaseException as exc:
            self.failure = exc
        finally:
            self.restarted.set()

    def wait_restarted(self) -> None:
        """Wait until the zone was killed and is serving again (raises what went wrong)."""
        assert self.restarted.wait(timeout=180), "the zone was not killed at its fault point"
        if self.failure is not None:
            raise self.failure

    def log(self, n: int) -> str:
        return (self.log_dir / f"zone-{n}.log").read_text()

    def stop(self) -> None:
        self._stop = True
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


Federation = tuple[Path, FederationConfig, str]
"""The config file, the config, the zone's endpoint."""


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Federation]:
    port = _free_port()
    path = _write_config(tmp_path, port)
    yield path, load_federation(path), f"127.0.0.1:{port}"


def _coordinator(config: FederationConfig, endpoint: str, tmp: Path, timeout: float = 30.0) -> tuple[Coordinator, str]:
    """The coordinator, having discovered the sites (one at a time: building their models
    seeds torch globally; it then sends them messages at once, so that their pushes
    overlap), and the genesis version."""

    def connect(name: str, at: str) -> ZoneClient:
        return GrpcZoneClient(at, timeout=timeout)

    sites = {s: make_site(config, s, tmp / "sites", connect=connect) for s in SITES}
    coordinator = Coordinator(config, InProcessSiteGateway(sites), {"z1": GrpcZoneClient(endpoint)}, {"z1": endpoint})
    genesis = coordinator.discover().version
    coordinator.sites = InProcessSiteGateway(sites, max_workers=len(SITES))
    return coordinator, genesis


def _ledger(tmp: Path, site: str) -> PrivacyLedger:
    key = ledger_key(site_kek(tmp / STORE_KEYS_DIR / f"{site}.kek", create=False))
    return PrivacyLedger(tmp / "sites" / site / LEDGER_FILE, None, key=key)


def _audit(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "zone" / "audit.jsonl"
    assert verify_audit_log(path, allow_adopted=True).ok
    return [json.loads(line) for line in path.read_text().splitlines()]


def _counted_once(records: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    accepted = Counter(
        (r["site"], r["round"]) for r in records if r["decision"] == "accepted" and r.get("call") == "push"
    )
    assert all(n == 1 for n in accepted.values()), accepted
    return accepted


def _check_ledgers(tmp: Path, landed: set[str]) -> set[str]:
    """Rounds 1 and 2 both in every ledger (round 1 spent, committed or not), within budget;
    round 1 committed only by sites whose push ``landed``. Returns those that committed it."""
    committed = set()
    for site in SITES:
        with _ledger(tmp, site) as ledger:
            entries = {e.round: e for e in ledger.entries()}
        assert set(entries) == {1, 2}, (site, entries)
        if entries[1].committed:
            committed.add(site)
        assert entries[2].committed
        assert 0 < entries[1].epsilon_after < entries[2].epsilon_after <= EPSILON  # round 1 counted as spent
    assert committed <= landed
    return committed


def _killed_in_round_1_then_round_2(
    federation: Federation, tmp_path: Path, point: str, refusal: str
) -> tuple[ZoneProcess, RoundResult]:
    """Round 1 with the zone process killed at ``point`` (the round fails with ``refusal``), the
    zone restarted on its folder, then round 2: the zone process and round 2's result."""
    path, config, endpoint = federation
    zone = ZoneProcess(path, endpoint, point, tmp_path)
    try:
        coordinator, genesis = _coordinator(config, endpoint, tmp_path)
        with pytest.raises(RoundError, match=refusal):
            coordinator.run_round(1, genesis)
        zone.wait_restarted()
        second = coordinator.run_round(2, genesis)
    finally:
        zone.stop()
    return zone, second


@pytest.mark.parametrize(("point", "answered"), [("zone.push.frame@3:kill", 0), ("zone.push.commit@2:kill", 1)])
def test_zone_killed_during_pushes_comes_back_and_the_round_is_aborted(
    federation: Federation, tmp_path: Path, point: str, answered: int
) -> None:
    zone, second = _killed_in_round_1_then_round_2(federation, tmp_path, point, "round 1")
    assert second.sites == SITES
    # the restarted zone said, in one line, that round 1 was lost, and refused it
    assert "round 1 was open when the zone stopped" in zone.log(2)
    assert "rounds lost (refused, to be aborted): 1" in zone.log(2) and "Traceback" not in zone.log(2)
    records = _audit(tmp_path)
    counted = _counted_once(records)
    assert {s for s, r in counted if r == 2} == set(SITES)
    assert any(r.get("code") == "round" and r.get("round") == 1 for r in records if r["decision"] == "refused")
    stored = sorted(p.name for p in (tmp_path / "zone").glob("aggregate-*.npz"))
    assert stored and all(name.startswith("aggregate-000002-") for name in stored)
    # a site commits round 1 only if the zone answered its push before dying (it counted,
    # then lost, that push: at most the one answered before the kill at the second
    # commit); the others' reservations stay spent, uncommitted
    landed = {s for s, r in counted if r == 1}
    assert len(_check_ledgers(tmp_path, landed)) <= answered


def test_zone_killed_while_publishing_discards_the_partial_round(federation: Federation, tmp_path: Path) -> None:
    zone, second = _killed_in_round_1_then_round_2(
        federation, tmp_path, "zone.publish.written@1:kill", "could not close"
    )
    assert second.sites == SITES
    # the one aggregate of round 1 written before the kill was moved aside, never served
    zone_dir = tmp_path / "zone"
    assert [p.name[:17] for p in (zone_dir / "discarded").iterdir()] == ["aggregate-000001-"]
    assert all(p.name.startswith("aggregate-000002-") for p in zone_dir.glob("aggregate-*.npz"))
    assert "moved aggregate-000001-" in zone.log(2)
    records = _audit(tmp_path)
    counted = _counted_once(records)
    assert set(counted) == {(s, r) for s in SITES for r in (1, 2)}
    # the sites' round-1 pushes landed (committed), though the round was then lost: spent, within budget
    assert _check_ledgers(tmp_path, set(SITES)) == set(SITES)


def test_a_push_retried_after_its_answer_was_lost_counts_once(federation: Federation, tmp_path: Path) -> None:
    """The zone pauses after counting the first push, and on receiving the second push's
    manifest; their sites give up waiting (2 s) and push again. The zone refuses the first
    retry as a duplicate of the counted manifest (the site takes that as success) and the
    second as one of a manifest still arriving (the site waits, then pushes it afresh once
    the broken stream is gone)."""
    path, config, endpoint = federation
    zone = ZoneProcess(path, endpoint, "zone.push.commit@1:pause=4,zone.push.header@2:pause=4", tmp_path)
    try:
        coordinator, genesis = _coordinator(config, endpoint, tmp_path, timeout=2.0)
        first = coordinator.run_round(1, genesis)
        second = coordinator.run_round(2, first.version)
    finally:
        zone.stop()
    assert zone.starts == 1
    assert first.sites == second.sites == SITES
    records = _audit(tmp_path)
    assert set(_counted_once(records)) == {(s, r) for s in SITES for r in (1, 2)}
    duplicates = [r for r in records if r["decision"] == "refused" and r.get("code") == "duplicate"]
    assert all(r["round"] == 1 for r in duplicates)
    # one retry found its manifest counted, one found it still arriving (then pushed it afresh)
    reasons = " ".join(r["reason"] for r in duplicates)
    assert "(this very manifest: counted)" in reasons and "(this very manifest: pending)" in reasons
    assert _check_ledgers(tmp_path, set(SITES)) == set(SITES)
