"""Sites keep their model in the encrypted on-prem shard store: nothing readable on disk,
every read verified, a tampered shard stops only that site, plaintext snapshots on request."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from fedshard.assembly import grpc_connector, make_site, running_zones
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.coordinator.results import RunResult
from fedshard.site.site import Site
from fedshard.store.verify import check_store
from fedshard.transports.inprocess import InProcessSiteGateway
from tests.zone_helpers import site_model


def _config(rounds: int = 2, encrypt: bool = True) -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "toy", "seed": 3, "rounds": rounds, "min_sites": 2, "round_timeout_s": 60},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 3, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "store": {"encrypt": encrypt, "lookahead": 1},
            "zones": [{"name": "z1", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(3)],
        }
    )


def _run(config: FederationConfig, endpoints: Mapping[str, str], sites: Mapping[str, Site]) -> RunResult:
    gateway = InProcessSiteGateway(dict(sites))
    zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
    try:
        return Coordinator(config, gateway, zones, dict(endpoints)).run()
    finally:
        gateway.close()


def test_site_model_is_sealed_at_rest_and_verifiable(tmp_path: Path) -> None:
    config = _config()
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        result = _run(config, endpoints, sites)
    assert len(result.rounds) == 2
    meta, shards = site_model(tmp_path / "sites", "s0")
    assert meta["version"] == result.rounds[-1].versions[next(iter(result.rounds[-1].versions))]
    # no shard's bytes appear anywhere in the site's folder; the key is not in it either
    files = [p for p in (tmp_path / "sites" / "s0").rglob("*") if p.is_file()]
    disk = b"".join(p.read_bytes() for p in files)
    assert shards and not any(a.tobytes() in disk for a in shards.values() if a.nbytes >= 32)
    assert not any(p.suffix == ".kek" for p in files)
    assert (tmp_path / "store-keys" / "s0.kek").stat().st_mode & 0o777 == 0o600
    # the store's own check agrees with the model version the site recorded
    from fedshard.site.model_store import site_kek
    from fedshard.store.sealed_store import SealedShardStore

    store = SealedShardStore.open(
        tmp_path / "sites" / "s0" / "shards", site_kek(tmp_path / "store-keys" / "s0.kek", create=False)
    )
    report = check_store(store)
    assert report.ok, report.problems
    assert report.model_version == meta["version"]


class _TamperAfterRound1:
    """A RoundObserver that flips one bit of one of s1's stored shards once round 1 is finished
    (the sites applied it with round 2's train message, which has then pushed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.victim: Path | None = None
        self.others: dict[str, dict[str, object]] = {}

    def on_start(self, *args: object) -> None:
        pass

    def on_round(self, result: object) -> None:
        if self.victim is not None:
            return
        self.victim = sorted((self.folder / "s1" / "shards" / "blobs").rglob("*.v*"))[0]
        data = bytearray(self.victim.read_bytes())
        data[-5] ^= 0x01  # one bit, inside the ciphertext
        self.victim.write_bytes(bytes(data))
        self.others = {s: site_model(self.folder, s)[0] for s in ("s0", "s2")}


def test_a_tampered_shard_stops_that_site_only(tmp_path: Path) -> None:
    config = _config(rounds=3)
    tamper = _TamperAfterRound1(tmp_path / "sites")
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        gateway = InProcessSiteGateway(sites)
        zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
        try:
            result = Coordinator(config, gateway, zones, dict(endpoints), tamper).run()
        finally:
            gateway.close()
    # round 3 went on without s1, whose store refused the altered shard with a clear reason
    assert [r.sites for r in result.rounds] == [("s0", "s1", "s2")] * 2 + [("s0", "s2")]
    assert "failed authentication: its contents were altered" in result.rounds[2].refused["s1"]
    for site, meta in tamper.others.items():  # the others moved on; nothing of theirs was touched
        assert site_model(tmp_path / "sites", site)[0]["applied_round"] == 3 != meta["applied_round"]


def test_plaintext_snapshots_when_encryption_is_off(tmp_path: Path) -> None:
    config = _config(rounds=1, encrypt=False)
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        result = _run(config, endpoints, sites)
    assert len(result.rounds) == 1
    assert (tmp_path / "sites" / "s0" / "current.npz").exists()
    assert not (tmp_path / "sites" / "s0" / "shards").exists() and not (tmp_path / "store-keys").exists()
    with pytest.raises(Exception):  # noqa: B017 - no encrypted store to open
        site_model(tmp_path / "sites", "s0")
    assert np.isfinite(result.rounds[-1].loss)


class _CountingStore:
    """A site's model store that counts full reads (every other call goes through)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.reads = 0

    def load_into(self, *args: object) -> object:
        self.reads += 1
        return self._inner.load_into(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.mark.parametrize("encrypt", [True, False])
def test_a_long_lived_site_reads_its_store_only_when_it_changed(tmp_path: Path, encrypt: bool) -> None:
    """While its store is as it last wrote it, a site keeps the model it holds (no refill);
    a store changed behind its back is read, and checked, again."""
    config = _config(rounds=3, encrypt=encrypt)
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        counted = {sid: _CountingStore(site.store) for sid, site in sites.items()}
        for sid, site in sites.items():
            site.store = counted[sid]  # type: ignore[assignment]
        result = _run(config, endpoints, sites)
        assert [len(r.sites) for r in result.rounds] == [3, 3, 3]
        assert all(c.reads == 0 for c in counted.values())  # 3 rounds × 2 messages, not one refill
        # what they hold is what they stored: a fresh site reading the store holds the same model
        fresh = make_site(config, "s0", tmp_path / "sites")
        held = sites["s0"].model.split()
        fresh._open()
        assert all(np.array_equal(held[sid], a) for sid, a in fresh.model.split().items())
        # a store changed behind the site's back (here: rewritten by another process) is read again
        store_file = next(
            p for p in sorted((tmp_path / "sites" / "s0").rglob("*")) if p.is_file() and p.suffix in (".npz", ".v4")
        )
        store_file.write_bytes(store_file.read_bytes())
        sites["s0"]._open()
        assert counted["s0"].reads == 1
