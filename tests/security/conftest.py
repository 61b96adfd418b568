"""A live federation for attack tests: real ``fedshard zone up`` processes with mutual TLS.

``fedshard keys init`` provisions the example deployment (``configs/aggregator.yaml``:
zones ``eu-central`` (EU, reducing), ``us-east`` (US) and ``sg-central`` (SG); sites
``charite-berlin`` and ``ap-hp-paris`` (EU), ``mayo-rochester`` (US) and
``sgh-singapore`` (SG)), on free loopback ports, without CKKS (so the tests can read
what they pushed). Each zone runs as its own process, exactly as ``aggregator up``
starts it: ``--cert/--key/--ca`` and ``--site-keys`` (unsigned manifests are refused).

Beside the members, the federation CA also signed certificates for an **outsider**
(a site ``mallory`` the federation config does not list) — a leaked or mistakenly
issued certificate.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedshard.assembly.routing import FederationRouting
from fedshard.config import FederationConfig, load_federation
from fedshard.config.layout import KeysLayout
from fedshard.crypto.pki import issue_site
from fedshard.crypto.signing import load_signing_key
from fedshard.crypto.tls import TlsFiles
from fedshard.deploy.keys import provision
from fedshard.deploy.loopback import write_loopback_layout
from fedshard.integrity import Manifest, build_manifest
from fedshard.protocol.rounds import RoundSpec
from fedshard.zone.rpc.client import GrpcZoneClient

ROOT = Path(__file__).resolve().parents[2]
FEDSHARD = [sys.executable, "-m", "fedshard.cli.main"]
BASE = "v0"
OUTSIDER = "mallory"

Shards = dict[str, np.ndarray]


def _env() -> dict[str, str]:
    return {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "COLUMNS": "200"}


@dataclass
class LiveFederation:
    """The zones of a federation, running; certificates of every party; builders of valid pushes."""

    root: Path
    config: FederationConfig
    config_path: Path
    keys: KeysLayout
    routing: FederationRouting
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stores: dict[str, Path] = field(default_factory=dict)
    edit: Callable[[dict[str, Any]], None] | None = None
    zone_args: list[str] = field(default_factory=list)  # more options for every ``zone up``

    # -- who is who ------------------------------------------------------------------------------
    @property
    def endpoints(self) -> dict[str, str]:
        """Zone name → host:port."""
        return {z.name: z.endpoint for z in self.config.zones}

    @property
    def sites(self) -> list[str]:
        """The member sites' ids."""
        return [s.id for s in self.config.sites]

    def tls(self, who: str) -> TlsFiles:
        """Certificate of ``who``: ``"coordinator"``, ``"superlink"``, a zone name, a site id or :data:`OUTSIDER`."""
        agg = self.keys.aggregator
        if who == "coordinator":
            return agg.coordinator
        if who == "superlink":
            return agg.superlink
        if who in self.endpoints:
            return agg.zone(who)
        if who == OUTSIDER:
            return TlsFiles(
                self.root / "outsider" / f"{OUTSIDER}.pem", self.root / "outsider" / f"{OUTSIDER}.key", agg.ca
            )
        return self.keys.site(who).tls

    def client(self, zone: str, who: str, timeout: float = 30) -> GrpcZoneClient:
        """A gRPC client of ``zone`` presenting ``who``'s certificate."""
        return GrpcZoneClient(self.endpoints[zone], timeout=timeout, tls=self.tls(who))

    # -- rounds ----------------------------------------------------------------------------------
    def spec(self, rnd: int, sites: list[str] | None = None, **extra: Any) -> RoundSpec:
        """A round of ``sites`` (default: every member) with a fresh token."""
        chosen = tuple(sites if sites is not None else self.sites)
        return RoundSpec(rnd, secrets.token_hex(16), self.routing.plan.to_json(), BASE, chosen, **extra)

    def open_round(self, spec: RoundSpec) -> None:
        """Open ``spec`` at every zone, as the coordinator."""
        for zone in self.endpoints:
            with self.client(zone, "coordinator") as c:
                c.open_round(spec)

    def close_round(self, rnd: int) -> dict[str, Any]:
        """Close ``rnd`` as the coordinator: other zones first (forwarding), the reducing zone last;
        group → summary."""
        reducing = self.config.reducing_zone
        out: dict[str, Any] = {}
        for zone in [z for z in self.endpoints if z != reducing] + [reducing]:
            forward = (reducing, self.endpoints[reducing]) if zone != reducing else None
            with self.client(zone, "coordinator") as c:
                out.update({s.group: s for s in c.close_round(rnd, forward_to=forward)})
        return out

    # -- pushes ----------------------------------------------------------------------------------
    def routes(self, site: str) -> dict[str, list[str]]:
        """Zone → the shard ids ``site`` pushes there."""
        out: dict[str, list[str]] = {}
        for sid, decision in self.routing.site(site).routes.items():
            out.setdefault(decision.zone, []).append(sid)
        return out

    def update(self, site: str, zone: str, seed: int = 0, scale: float = 1.0) -> Shards:
        """Random values for the shards ``site`` pushes to ``zone``."""
        rng = np.random.default_rng(seed)
        plan = self.routing.plan
        return {
            sid: (scale * rng.standard_normal(plan.shard(sid).shape)).astype(plan.shard(sid).dtype)
            for sid in self.routes(site)[zone]
        }

    def manifest(self, site: str, zone: str, spec: RoundSpec, shards: Shards, *, weight: float = 1.0) -> Manifest:
        """The manifest ``site`` would push, signed with its key (as the zones require)."""
        classes = {sid: self.routing.classes[sid].shard_class for sid in shards}
        manifest = build_manifest(
            site_id=site,
            round=spec.round,
            plan_digest=self.routing.plan.digest,
            base_version=BASE,
            zone=zone,
            weight=weight,
            shards=shards,
            classes=classes,
            policy_digest=self.routing.router.policy.digest,
        )
        return manifest.signed(load_signing_key(self.keys.site(site).signing_key))

    def push(
        self, site: str, zone: str, spec: RoundSpec, *, seed: int = 0, weight: float | None = None, scale: float = 1.0
    ) -> Shards:
        """Push a valid, signed update of ``site`` to ``zone`` as ``site``; the values pushed.

        ``weight``: the manifest's (default: what ``spec`` fixed for the site); ``scale``
        multiplies the random values."""
        shards = self.update(site, zone, seed, scale)
        weight = spec.weight_for(site) if weight is None else weight
        with self.client(zone, site) as c:
            c.push(self.manifest(site, zone, spec, shards, weight=weight), spec.token, shards)
        return shards

    # -- evidence --------------------------------------------------------------------------------
    def audit(self, zone: str) -> list[dict[str, Any]]:
        """The records of ``zone``'s audit log so far."""
        path = self.stores[zone] / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def info(self, zone: str) -> dict[str, Any]:
        """``zone``'s Info (counters, audit head), asked as the coordinator."""
        with self.client(zone, "coordinator") as c:
            return c.details()

    # -- processes -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every zone (``fedshard zone up``) and wait until each listens."""
        agg = self.keys.aggregator
        for zone in self.config.zones:
            store = self.root / "zones" / zone.name
            self.stores[zone.name] = store
            tls = agg.zone(zone.name)
            cmd = [*FEDSHARD, "zone", "up", "--config", str(self.config_path), "--zone", zone.name]
            cmd += ["--cert", str(tls.cert), "--key", str(tls.key), "--ca", str(tls.ca)]
            cmd += ["--site-keys", str(agg.site_keys), "--store", str(store), *self.zone_args]
            log = self.root / f"zone-{zone.name}.log"
            with log.open("ab") as out:
                self.procs[zone.name] = subprocess.Popen(
                    cmd, cwd=self.root, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
        for zone in self.config.zones:
            self._wait_listening(zone.name)

    def _wait_listening(self, zone: str) -> None:
        log = self.root / f"zone-{zone}.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if "listening on" in log.read_text(errors="replace"):
                return
            if self.procs[zone].poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"zone {zone} did not start: {log.read_text(errors='replace')[-2000:]}")

    def log(self, zone: str) -> str:
        """What ``zone``'s process printed so far."""
        return (self.root / f"zone-{zone}.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop every zone (SIGTERM, then SIGKILL)."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


def live_federation(root: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> LiveFederation:
    """Provision (keys, outsider certificate) the example deployment under ``root``; not started.

    ``edit`` may change the federation config (plain data) before it is written.
    """

    def change(data: dict[str, Any]) -> None:
        data["residency"].pop("encrypt", None)  # plaintext: the tests read what they pushed
        if edit is not None:
            edit(data)

    paths = write_loopback_layout(ROOT / "configs", root, edit=change)
    config = load_federation(paths["aggregator"])
    assert config.deployment is not None
    provision(config, config.deployment.keys)
    keys = KeysLayout(config.deployment.keys)
    issue_site(keys.ca_dir, OUTSIDER, "EU", root / "outsider")
    return LiveFederation(root, config, paths["aggregator"], keys, FederationRouting(config))


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LiveFederation]:
    """The example federation's zones, running with mutual TLS (see the module docstring)."""
    fed = live_federation(tmp_path)
    fed.start()
    try:
        yield fed
    finally:
        fed.stop()
